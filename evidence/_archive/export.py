"""Canonical exports: one consistent snapshot of a store, written as bytes that depend only
on its logical content (docs/archives.md has the format rules and the manifest fields).

    snapshot   SQLite's online backup API copies the store's pages inside one read
               transaction into a private file; the writer is never blocked, and the WAL
               can only grow for as long as the page copy runs (disk speed).
    dump       every section is formatted from that private copy: schema first, then every
               table in a fixed order, rows ordered by primary key, one literal per type.
    export     an archive directory: the dump, the artifacts its rows reference, and a
               manifest with counts, a BLAKE3 hash per section, the log head and the gaps.

Invariants: nothing in a dump or a manifest depends on when, where or by whom it was
written (no dates, hosts or paths), so a store, its backup, its ``VACUUM INTO`` copy and its
restore all export to the same bytes. An archive appears under its name only when complete
(``snapshot.building``). This module owns the bytes: the literals, the table and schema
order, the dump, what ``--run`` includes and the manifest; the source, the build directory
and the artifact copy are ``_archive/snapshot.py``'s, shared with backup and restore.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import apsw
import blake3
import msgspec

from .._errors import CorruptStoreError, ProofError, StoreError
from .._store.db import ARTIFACTS_DIR
from .._store.fsync import fsync_dir
from .._store.log import LogCheck, LogFinding, check_log, load_head
from .._store.sqlite import map_sqlite_errors
from .carried import Carried, reach
from .segments import write_payloads
from .snapshot import (
    MANIFEST,
    Gap,
    Progress,
    Source,
    artifact_refs,
    building,
    open_source,
)

__all__ = ["DUMP_FORMAT", "FORMAT_VERSION", "READS_FORMATS", "TABLE_ORDER", "FileEntry",
           "Manifest", "Output", "Section", "describe_log", "dump", "export", "ident",
           "read_manifest", "schema_sql", "sql_literal", "tables"]

FORMAT_VERSION = 2  # the archive's: 2 keeps payloads in segments (_archive/segments.py)
READS_FORMATS = (1, 2)  # 1: one file per payload, still restored and compared
DUMP_FORMAT = 1  # the dump's own, in its first line (docs/archives.md, "The dump format")
SNAPSHOT = ".snapshot.db"
Format = Literal["sql", "jsonl", "csv"]

# The fixed table order; tables a later migration adds follow, sorted by name.
TABLE_ORDER = ("schema_migration", "store_meta", "crawl_session", "crawl_run", "url_identity",
               "artifact", "commit_log", "ingest_ledger", "fetch_attempt", "discovery_edge",
               "rule_evaluation", "url_current", "quarantine")
_ROWS_PER_CHUNK = 4096
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_LINE_BREAKS = re.compile("[\x85\u2028\u2029]")


# --- literals: one fixed spelling per type --------------------------------------------

def _sql_text(value: str) -> str:
    """'...' with '' doubled; control characters as char(n, ...) so a row stays one line."""
    if "'" in value:
        value = value.replace("'", "''")
    # isprintable() is False for every control character and runs in C: the common case
    # never reaches the regex (1.6x faster dumps).
    if value.isprintable() or not _CONTROL.search(value):
        return f"'{value}'"
    parts, pos = [], 0
    for run in _CONTROL.finditer(value):
        if run.start() > pos:
            parts.append(f"'{value[pos:run.start()]}'")
        parts.append("char(" + ",".join(str(ord(c)) for c in run.group()) + ")")
        pos = run.end()
    if pos < len(value):
        parts.append(f"'{value[pos:]}'")
    return "||".join(parts)


def _real(value: float, infinities: tuple[str, str]) -> str:
    """Python's shortest round-trip repr; -0.0 keeps its sign. SQLite turns NaN into NULL."""
    if math.isfinite(value):
        return repr(value)
    if math.isnan(value):
        raise CorruptStoreError("a REAL value is NaN, which SQLite cannot store")
    return infinities[value < 0]


def _json_text(value: str) -> str:
    """JSON string; also escapes the three line breaks JSON allows raw, so one row stays one
    line for every line splitter (Python's ``splitlines`` breaks at U+0085, U+2028, U+2029)."""
    text = msgspec.json.encode(value).decode()
    if _LINE_BREAKS.search(text):
        text = _LINE_BREAKS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text


_Spell = dict[type, Callable[[Any], str]]
_SQL: _Spell = {int: int.__repr__, float: lambda v: _real(v, ("1e999", "-1e999")),
                str: _sql_text, bytes: lambda v: f"X'{v.hex()}'", type(None): lambda v: "NULL"}
_JSON: _Spell = {int: int.__repr__, float: lambda v: _real(v, ('"Infinity"', '"-Infinity"')),
                 str: _json_text,
                 bytes: lambda v: f'"{v.hex()}"', type(None): lambda v: "null"}
_CSV: _Spell = {int: int.__repr__, float: lambda v: _real(v, ("Infinity", "-Infinity")),
                str: lambda v: '"' + v.replace('"', '""') + '"', bytes: lambda v: v.hex(),
                type(None): lambda v: ""}


def sql_literal(value: object) -> str:
    """The dump's literal for one SQLite value (int, float, str, bytes or None)."""
    return _SQL[type(value)](value)


def ident(name: str) -> str:
    """An identifier, double-quoted only when it must be."""
    if _NAME.fullmatch(name) and name.upper() not in apsw.keywords:
        return name
    return '"' + name.replace('"', '""') + '"'


# --- the schema, in a fixed order --------------------------------------------------------

@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[str, ...]  # dumped columns: generated (hidden) columns are left out
    order: tuple[str, ...]  # primary key columns (all columns for a table without one)
    generated: bool  # a generated column exists, so INSERTs name their columns
    kinds: tuple[str, ...] = ()  # each dumped column's likely type, as _kind names it


def tables(conn: apsw.Connection) -> list[Table]:
    names = [n for (n,) in conn.execute(
        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' "
        "ESCAPE '\\'")]
    for name in names:
        if _CONTROL.search(name):
            raise StoreError(f"table name {name!r} holds control characters; cannot dump it")
    known = [n for n in TABLE_ORDER if n in names]
    result = []
    for name in known + sorted(set(names) - set(known)):
        info = conn.execute("SELECT name, pk, hidden, type, \"notnull\" FROM "
                            "pragma_table_xinfo(?) ORDER BY cid", (name,)).fetchall()
        columns = tuple(c for c, _pk, hidden, _t, _n in info if hidden == 0)
        pk = tuple(c for c, n, *_ in sorted((r for r in info if r[1]), key=lambda r: r[1]))
        kinds = tuple(_kind(t, bool(notnull)) for _c, _pk, hidden, t, notnull in info
                      if hidden == 0)
        result.append(Table(name, columns, pk or columns, len(columns) < len(info), kinds))
    return result


def schema_sql(conn: apsw.Connection, order: list[Table]) -> list[str]:
    """Each table's CREATE, then its indexes and triggers by name; then views and theirs."""
    objects = conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_schema WHERE sql IS NOT NULL "
        "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name").fetchall()
    by_table: dict[str, list[str]] = {}
    for kind, _name, table, sql in objects:
        if kind in ("index", "trigger"):
            by_table.setdefault(table, []).append(sql)
    head = {name: sql for kind, name, _t, sql in objects if kind in ("table", "view")}
    views = sorted(n for kind, n, _t, _s in objects if kind == "view")
    result = []
    for name in [t.name for t in order] + views:
        result += [head[name], *by_table.get(name, [])]
    return result


# --- the dump ------------------------------------------------------------------------------

RowsTo = Callable[[tuple[str, ...], list[tuple]], None]  # (the columns, a chunk of rows)


class Section(msgspec.Struct, frozen=True, kw_only=True):
    """A contiguous byte range of one file: the schema, or one table's rows."""

    file: str
    offset: int
    bytes: int
    rows: int
    blake3: str


class FileEntry(msgspec.Struct, frozen=True, kw_only=True):
    bytes: int
    blake3: str


class Output:
    """Where dump bytes go: files under ``directory``, or nowhere (hashes only)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self._files: dict[str, tuple[BinaryIO | None, blake3.blake3, list[int]]] = {}

    def write(self, name: str, data: bytes) -> None:
        if name not in self._files:
            handle: BinaryIO | None = None
            if self.directory is not None:
                (self.directory / name).parent.mkdir(parents=True, exist_ok=True)
                handle = open(self.directory / name, "xb")  # noqa: SIM115 - closed in finish
            self._files[name] = (handle, blake3.blake3(max_threads=1), [0])
        handle, hasher, size = self._files[name]
        if handle is not None:
            handle.write(data)
        hasher.update(data)
        size[0] += len(data)

    def offset(self, name: str) -> int:
        return self._files[name][2][0] if name in self._files else 0

    def finish(self) -> dict[str, FileEntry]:
        """Flush, fsync and close every file (and its subdirectory); sizes and hashes."""
        entries, subdirs = {}, set()
        for name in sorted(self._files):
            handle, hasher, size = self._files[name]
            if handle is not None:
                handle.flush()
                os.fsync(handle.fileno())
                handle.close()
                subdirs.add(Path(handle.name).parent)
            entries[name] = FileEntry(bytes=size[0], blake3=hasher.hexdigest())
        for subdir in subdirs - {self.directory}:  # the directory itself: its owner's job
            fsync_dir(subdir)
        return entries


def dump(conn: apsw.Connection, out: Output, *, fmt: Format = "sql",
         where: dict[str, str] | None = None, params: dict[str, object] | None = None,
         header: str = "", per_run: dict[tuple[str, str], list] | None = None,
         progress: Progress | None = None, rows_to: dict[str, RowsTo] | None = None
         ) -> tuple[Section, dict[str, Section]]:
    """Write the canonical dump of ``conn``; return the schema section and one per table.

    ``where`` maps a table to the condition its rows must meet (a table mapped to ``"0"``
    is empty); ``per_run`` collects [rows, hasher] per (run_id, table) for tables with a
    ``run_id`` column, from the same SQL lines (``compare`` uses it); ``rows_to`` hands a
    table's rows, chunk by chunk and in key order, to whoever else reads them (``export``:
    the log check, from the ledger's rows).
    """
    rows_to = rows_to or {}
    where, params = where or {}, params or {}
    order = tables(conn)
    main = "dump.sql" if fmt == "sql" else "schema.sql"
    version = conn.execute("PRAGMA user_version").fetchall()[0][0]
    statements = [f"PRAGMA user_version={version};", *(s + ";" for s in schema_sql(conn, order))]
    if fmt == "sql":
        out.write(main, (f"-- evidence canonical dump, format {DUMP_FORMAT}\n{header}"
                         "PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\n").encode())
    schema = _section(out, main, "-- @section schema\n", statements, len(statements) - 1)
    counts = {t.name: conn.execute(f"SELECT count(*) FROM {ident(t.name)} WHERE "
                                   f"{where.get(t.name, '1')}", params).fetchall()[0][0]
              for t in order}
    total, done, sections = sum(counts.values()), 0, {}
    for table in order:
        name = f"tables/{table.name}.{fmt}" if fmt != "sql" else main
        if fmt != "sql" and not _NAME.fullmatch(table.name):
            raise StoreError(f"table {table.name!r} cannot be a file name; export as sql")
        start, hasher, rows = out.offset(name), blake3.blake3(max_threads=1), 0
        first = {"sql": f"-- @section table {ident(table.name)}\n",
                 "csv": ",".join(_CSV[str](c) for c in table.columns) + "\r\n", "jsonl": ""}
        head = first[fmt].encode()
        out.write(name, head)
        hasher.update(head)
        lines_of = _lines_format(table, fmt)
        also = rows_to.get(table.name)
        run_at = table.columns.index("run_id") if "run_id" in table.columns else None
        cols = ", ".join(ident(c) for c in table.columns)
        cursor = conn.execute(
            f"SELECT {cols} FROM {ident(table.name)} WHERE {where.get(table.name, '1')} "
            f"ORDER BY {', '.join(ident(c) for c in table.order)}", params)
        try:
            while chunk := list(itertools.islice(cursor, _ROWS_PER_CHUNK)):
                lines = lines_of(chunk)
                if also is not None:
                    also(table.columns, chunk)
                data = "".join(lines).encode()
                out.write(name, data)
                hasher.update(data)
                rows += len(lines)
                if per_run is not None and run_at is not None:
                    for row, text in zip(chunk, lines, strict=True):
                        entry = per_run.setdefault((row[run_at], table.name),
                                                   [0, blake3.blake3(max_threads=1)])
                        entry[0] += 1
                        entry[1].update(text.encode())
                done += len(chunk)
                if progress:
                    progress("dump", done, total)
        except UnicodeDecodeError as exc:
            raise CorruptStoreError(f"table {table.name} holds TEXT that is not UTF-8 ({exc})",
                                    hint="run 'evidence verify' on the store") from exc
        sections[table.name] = Section(file=name, offset=start, bytes=out.offset(name) - start,
                                       rows=rows, blake3=hasher.hexdigest())
    if fmt == "sql":
        out.write(main, b"-- @end\nCOMMIT;\n")
    return schema, sections


def _section(out: Output, name: str, marker: str, lines: list[str], rows: int) -> Section:
    data = (marker + "".join(s + "\n" for s in lines)).encode()
    start = out.offset(name)
    out.write(name, data)
    return Section(file=name, offset=start, bytes=len(data), rows=rows,
                   blake3=blake3.blake3(data).hexdigest())


def _lines_format(table: Table, fmt: Format) -> Callable[[list[tuple]], list[str]]:
    """The lines of a chunk of rows, one per row."""
    if fmt == "sql":
        names = f"({', '.join(ident(c) for c in table.columns)})" if table.generated else ""
        return _sql_lines(f"INSERT INTO {ident(table.name)}{names} VALUES(",
                          table.kinds or ("",) * len(table.columns))
    line = _line_format(table, fmt)
    return lambda chunk: [line(row) for row in chunk]


# --- the INSERT lines, from a function made for each table ------------------------------
#
# Spelling a value through ``_SQL[type(v)](v)`` is a dict lookup and a call per value: with
# 554,109 values on a 5,000-page crawl's store, most of the dump's time. The function made
# for a table tests a whole row first: when every value has its column's declared type and
# needs no escaping (a TEXT printable and without a quote, a REAL finite), the row is one
# f-string with each value spelled in place, the quotes of a TEXT and the ``X'...'`` of a
# BLOB being part of the f-string rather than strings built around each value. Any other
# row (a NULL in a NOT NULL column, a TEXT that needs quoting or ``char()``, a value of
# another type: SQLite's columns hold any type) is spelled value by value through
# ``sql_literal``: the same bytes, value for value (tests/test_archive.py checks any values
# in any declared column). Only positional names (c0, c1, ...) and the names below reach
# the generated code, never a table's or a column's name: the INSERT's prefix is a value.

_TEST = {  # @: the column's value; is it spelled in place?
    "int": "@.__class__ is int",
    "real": "@.__class__ is float and @ - @ == 0.0",  # finite: inf - inf and NaN are NaN
    "text": "@.__class__ is str and @.isprintable() and Q not in @",
    "blob": "@.__class__ is bytes",
}
_IN_PLACE = {"int": "{@}", "real": "{@!r}", "text": "'{@}'", "blob": "X'{@.hex()}'",
             "": "{L(@)}"}  # format(int) is int.__repr__; a REAL's spelling is its repr
_OR_NULL = {"int": "{N if @ is None else @}", "real": "{N if @ is None else R(@)}",
            "text": "{N if @ is None else Q + @ + Q}",
            "blob": "{N if @ is None else X + @.hex() + Q}", "": "{L(@)}"}


def _kind(declared: str, not_null: bool) -> str:
    """The type a column's values most likely have, by SQLite's affinity rules on its
    declared type (the order of the checks is theirs), with "?" when the column may hold
    NULL; "" for NUMERIC and for no declared type (its values are whatever was stored)."""
    declared = declared.upper()
    if not declared:
        return ""
    if "INT" in declared:
        kind = "int"
    elif any(word in declared for word in ("CHAR", "CLOB", "TEXT")):
        kind = "text"
    elif "BLOB" in declared:
        kind = "blob"
    elif any(word in declared for word in ("REAL", "FLOA", "DOUB")):
        kind = "real"
    else:
        kind = ""
    return kind if not_null or not kind else kind + "?"


def _sql_lines(prefix: str, kinds: tuple[str, ...]) -> Callable[[list[tuple]], list[str]]:
    names = [f"c{i}" for i in range(len(kinds))]
    tests, spelled = [], []
    for kind, name in zip(kinds, names, strict=True):
        base = kind.rstrip("?")
        test = _TEST.get(base)
        if kind.endswith("?"):
            test = f"({name} is None or {test})" if test else None
            spelled.append(_OR_NULL[base].replace("@", name))
        else:
            spelled.append(_IN_PLACE[base].replace("@", name))
        if test:
            tests.append(test.replace("@", name))
    line = "{P}" + ",".join(spelled) + ");\n"
    source = (f"def lines(chunk):\n    return [f{line.__repr__()} if "
              f"{' and '.join(tests) or 'True'} else S(row)\n"
              f"            for row in chunk for ({', '.join(names)},) in (row,)]\n")
    scope: dict[str, Any] = {"L": sql_literal, "P": prefix, "Q": "'", "X": "X'", "N": "NULL",
                             "R": float.__repr__, "S": lambda row: _sql_row(prefix, row)}
    exec(compile(source, f"<dump lines of {len(kinds)} columns>", "exec"), scope)
    return scope["lines"]


def _sql_row(prefix: str, row: tuple) -> str:
    """One row's line, spelled value by value: what the function made for a table does
    for a row it cannot spell in place."""
    return prefix + ",".join([sql_literal(v) for v in row]) + ");\n"


def _line_format(table: Table, fmt: Format) -> Callable[[tuple], str]:
    if fmt == "jsonl":
        keys, js = [msgspec.json.encode(c).decode() + ":" for c in table.columns], _JSON
        return lambda row: "{" + ",".join([k + js[type(v)](v) for k, v in zip(
            keys, row, strict=True)]) + "}\n"
    csv = _CSV
    return lambda row: ",".join([csv[type(v)](v) for v in row]) + "\r\n"


# --- what --run includes -----------------------------------------------------------------

_OF_RUN = "run_id = :run"
_RUN_SCOPE = {
    "crawl_session": "session_id IN (SELECT session_id FROM temp.keep_session)",
    "url_identity": "url_id IN (SELECT url_id FROM fetch_attempt WHERE run_id = :run UNION "
                    "SELECT target_url_id FROM discovery_edge WHERE run_id = :run UNION "
                    "SELECT url_id FROM rule_evaluation WHERE run_id = :run UNION "
                    "SELECT url_id FROM url_current WHERE run_id = :run)",
    "artifact": "artifact_id IN (SELECT request_headers_id FROM fetch_attempt WHERE "
                "run_id = :run UNION SELECT response_headers_id FROM fetch_attempt WHERE "
                "run_id = :run UNION SELECT body_id FROM fetch_attempt WHERE run_id = :run "
                "UNION SELECT content_id FROM fetch_attempt WHERE run_id = :run "
                "UNION SELECT surplus_id FROM fetch_attempt WHERE run_id = :run "
                "UNION SELECT tls_chain_id FROM fetch_attempt WHERE run_id = :run "
                "UNION SELECT frames_id FROM fetch_attempt WHERE run_id = :run "
                "UNION SELECT request_secrets_id FROM fetch_attempt WHERE run_id = :run "
                "UNION SELECT source_artifact_id FROM discovery_edge WHERE run_id = :run "
                "UNION SELECT dom_id FROM render WHERE run_id = :run "
                "UNION SELECT screenshot_id FROM render WHERE run_id = :run "
                "UNION SELECT mhtml_id FROM render WHERE run_id = :run "
                "UNION SELECT behaviors_id FROM render WHERE run_id = :run)",
    "dns_resolution": "resolution_seq IN (SELECT resolution_seq FROM fetch_attempt WHERE "
                      "run_id = :run)",
    "commit_log": "batch_seq IN (SELECT batch_seq FROM ingest_ledger WHERE log_index IN "
                  "(SELECT log_index FROM temp.keep_ledger))",
    "ingest_ledger": "log_index IN (SELECT log_index FROM temp.keep_ledger)",
    "quarantine": "quarantine_id IN (SELECT quarantine_id FROM temp.keep_quarantine)",
}
_ROW_KINDS = ("fetch_attempt", "discovery", "rule_evaluated", "render")  # through their rows


def run_scope(conn: apsw.Connection, run_id: str) -> tuple[dict[str, str], list[str]]:
    """The row conditions of ``--run`` (docs/archives.md lists them) and excluded tables."""
    if not conn.execute("SELECT 1 FROM crawl_run WHERE run_id = ?", (run_id,)).fetchall():
        raise StoreError(f"run {run_id!r} is not in the store",
                         hint="'evidence status STORE' lists the runs")
    conn.execute(
        "CREATE TEMP TABLE keep_session (session_id TEXT PRIMARY KEY);"
        "CREATE TEMP TABLE keep_ledger (log_index INTEGER PRIMARY KEY);"
        "CREATE TEMP TABLE keep_quarantine (quarantine_id INTEGER PRIMARY KEY);"
        "WITH RECURSIVE s(id) AS (SELECT session_id FROM crawl_run WHERE run_id = :run "
        "UNION SELECT c.baseline_session_id FROM crawl_session c JOIN s ON c.session_id = s.id "
        "WHERE c.baseline_session_id IS NOT NULL) INSERT INTO keep_session SELECT id FROM s;"
        "INSERT INTO keep_ledger SELECT log_index FROM fetch_attempt WHERE run_id = :run UNION "
        "SELECT log_index FROM discovery_edge WHERE run_id = :run UNION "
        "SELECT log_index FROM rule_evaluation WHERE run_id = :run UNION "
        "SELECT log_index FROM render WHERE run_id = :run;", {"run": run_id})
    sessions = {s for (s,) in conn.execute("SELECT session_id FROM temp.keep_session")}
    kinds = ", ".join(_sql_text(k) for k in _ROW_KINDS)
    for keep, key, sql in (
            ("keep_ledger", "log_index", f"FROM ingest_ledger WHERE kind NOT IN ({kinds})"),
            ("keep_quarantine", "quarantine_id", "FROM quarantine")):
        for rowid, payload in conn.execute(f"SELECT {key}, payload {sql}").fetchall():
            if _names(payload, run_id, sessions):
                conn.execute(f"INSERT INTO temp.{keep} VALUES (?)", (rowid,))
    where, excluded = dict.fromkeys(("crawl_run", "fetch_attempt", "discovery_edge",
                                     "rule_evaluation", "url_current"), _OF_RUN), []
    where.update(_RUN_SCOPE)
    for table in tables(conn):
        if table.name in where or table.name in ("schema_migration", "store_meta"):
            continue
        if "run_id" in table.columns:
            where[table.name] = _OF_RUN
        else:  # session working state (frontier, host_state): the ledger has its history
            where[table.name] = "0"
            excluded.append(table.name)
    return where, excluded


def _names(payload: bytes, run_id: str, sessions: set[str]) -> bool:
    """Does this message (decoded generically: any kind, any version) concern the run?"""
    try:
        message = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError:
        return False
    if not isinstance(message, dict):
        return False
    if "run_id" in message:
        return message["run_id"] == run_id
    return message.get("session_id") in sessions


# --- the manifest ---------------------------------------------------------------------------

class SessionEntry(msgspec.Struct, frozen=True, kw_only=True):
    session_id: str
    mode: str
    started_at: str
    ended_at: str | None
    outcome: str | None


class RunEntry(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    session_id: str
    started_at: str
    ended_at: str | None
    outcome: str | None
    reason: str | None


class LogHeadEntry(msgspec.Struct, frozen=True, kw_only=True):
    """The commit-log head of the store at the snapshot, and whether check_log agrees."""

    tree_size: int
    root: str
    batch_seq: int
    entry_hash: str
    verified: bool
    findings: list[str]


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    format_version: int
    format: str
    run_id: str | None  # None: the whole store; else what --run includes
    excluded_tables: list[str]
    store_id: str
    schema_version: int
    normalizer_versions: list[int]
    sessions: list[SessionEntry]
    runs: list[RunEntry]
    log: LogHeadEntry
    schema: Section
    tables: dict[str, Section]
    files: dict[str, FileEntry]
    artifacts: int
    artifact_bytes: int
    quarantined: int
    gaps: list[Gap]


def encode_manifest(manifest: Manifest) -> bytes:
    return msgspec.json.format(msgspec.json.encode(manifest), indent=2) + b"\n"


def read_manifest(archive: os.PathLike[str] | str) -> Manifest:
    path = Path(archive) / MANIFEST
    try:
        manifest = msgspec.json.decode(path.read_bytes(), type=Manifest)
    except FileNotFoundError as exc:
        raise StoreError(f"{archive}: not an archive ({MANIFEST} not found)",
                         hint="pass the directory 'evidence export' wrote",
                         path=str(archive)) from exc
    except (OSError, msgspec.DecodeError) as exc:
        raise CorruptStoreError(f"{path}: unreadable manifest ({exc})", path=str(path)) from exc
    if manifest.format_version not in READS_FORMATS:
        raise StoreError(f"{archive}: archive format {manifest.format_version}, this program "
                         f"reads formats {', '.join(map(str, READS_FORMATS))}",
                         hint="use a matching evidence")
    return manifest


def describe(conn: apsw.Connection, where: dict[str, str], params: dict[str, object]) -> dict:
    """Identity, versions, sessions, runs and the gaps of runs and sessions (the log's
    head and gaps: ``describe_log``)."""
    def rows(table: str, cols: str) -> list[tuple]:
        return conn.execute(f"SELECT {cols} FROM {table} WHERE {where.get(table, '1')} "
                            f"ORDER BY 1", params).fetchall()
    meta = dict(conn.execute("SELECT key, value FROM store_meta"))
    sessions = [SessionEntry(session_id=r[0], mode=r[1], started_at=r[2], ended_at=r[3],
                             outcome=r[4]) for r in rows(
        "crawl_session", "session_id, mode, started_at, ended_at, outcome")]
    runs = [RunEntry(run_id=r[0], session_id=r[1], started_at=r[2], ended_at=r[3],
                     outcome=r[4], reason=r[5]) for r in rows(
        "crawl_run", "run_id, session_id, started_at, ended_at, outcome, reason")]
    gaps = [Gap(kind="session_open", subject=s.session_id, detail="the session has not ended")
            for s in sessions if s.outcome is None]
    gaps += [Gap(kind="run_not_completed", subject=r.run_id,
                 detail=f"the run ended {r.outcome!r}" + (f": {r.reason}" if r.reason else "")
                 if r.outcome else "the run has no recorded end (running or killed)")
             for r in runs if r.outcome != "completed"]
    return {
        "store_id": meta.get("store_id", ""),
        "schema_version": conn.execute("SELECT coalesce(max(version), 0) FROM "
                                       "schema_migration").fetchall()[0][0],
        "normalizer_versions": [v for (v,) in rows("url_identity", "DISTINCT normalizer_version")],
        "sessions": sessions, "runs": runs, "gaps": gaps,
        "quarantined": conn.execute(f"SELECT count(*) FROM quarantine WHERE "
                                    f"{where.get('quarantine', '1')}", params).fetchall()[0][0],
    }


def describe_log(conn: apsw.Connection, checked: tuple[int, bytes, list[LogFinding]]
                 ) -> tuple[LogHeadEntry, list[Gap]]:
    """The commit-log head at the snapshot, and a gap per finding of ``checked`` (what
    ``check_log`` answers) and for a head the recomputed tree does not match."""
    head = load_head(conn)
    size, root, findings = checked
    notes = [f.detail for f in findings]
    if (size, root) != (head.tree.size, head.tree.root()):
        notes.append(f"the commit-log head (size {head.tree.size}) differs from the tree "
                     f"recomputed from the ledger (size {size})")
    return (LogHeadEntry(tree_size=head.tree.size, root=head.tree.root().hex(),
                         batch_seq=head.batch_seq, entry_hash=head.entry_hash.hex(),
                         verified=not notes, findings=notes),
            [Gap(kind="log", subject="commit_log", detail=n) for n in notes])


_LEAF_COLUMNS = ("log_index", "payload", "leaf_hash", "batch_seq", "received_at")


class _LedgerCheck:
    """The log check fed the ledger's rows as the dump reads them (``LogCheck``): the
    ledger is read once, where a second pass of ``check_log`` cost a third of the check
    (0.045 of 0.145 s of CPU on a 5,000-page crawl's store). A ledger without the columns
    the check reads is left to ``check_log``, which says what is wrong with it."""

    def __init__(self, conn: apsw.Connection) -> None:
        self.check = LogCheck(conn)
        self.usable, self.more = True, True

    def __call__(self, columns: tuple[str, ...], chunk: list[tuple]) -> None:
        if not (self.usable and self.more):
            return
        if not set(_LEAF_COLUMNS) <= set(columns):
            self.usable = False
            return
        index, payload, leaf_hash, batch, received = (columns.index(c) for c in _LEAF_COLUMNS)
        by = columns.index("submitter") if "submitter" in columns else None
        leaf = self.check.leaf
        for row in chunk:
            if not leaf(row[index], row[payload], row[leaf_hash], row[batch], row[received],
                        None if by is None else row[by]):
                self.more = False
                return

    def result(self, conn: apsw.Connection, dumped: bool) -> tuple[int, bytes, list[LogFinding]]:
        """The check's answer; ``check_log``'s own when the ledger was not dumped whole."""
        return self.check.finish() if dumped and self.usable else check_log(conn)


# --- export ----------------------------------------------------------------------------------

SECRETS_NS = "secrets"  # the openings of sealed requests (evidence/_crawl/secrets.py)
WITHHELD = ("the opening of a sealed request (its secrets in clear), left out of the "
            "export: export --include-secrets keeps it")

def export(source: Source, out: os.PathLike[str] | str, *, run_id: str | None = None,
           format: Format = "sql", progress: Progress | None = None,
           checkpoint: Carried | None = None, include_secrets: bool = False) -> Manifest:
    """Write an archive of ``source`` (a Store or a store directory) to the new directory ``out``.

    The archive holds the canonical dump (``dump.sql``; or ``schema.sql`` and
    ``tables/*.jsonl|csv``), ``artifacts/`` with exactly the referenced payloads, and
    ``manifest.json``. ``run_id`` limits it to one run and what that run references.
    Missing or corrupt artifacts, runs not completed and log findings are recorded as
    gaps, not raised: an archive of a damaged store still says what it holds. A payload
    that cannot be read is no gap: ``ArtifactReadError``, and nothing is left at ``out``.
    ``checkpoint``: a signed checkpoint (and its timestamp) the archive carries, which the
    snapshot must reach (``_archive.carried``); ``ProofError`` if it does not.
    The openings of sealed requests (namespace ``secrets``, ``_crawl.secrets``) are left
    out unless ``include_secrets``: each is a gap that says so, so a restore knows it.
    """
    if format not in ("sql", "jsonl", "csv"):
        raise StoreError(f"format must be 'sql', 'jsonl' or 'csv', not {format!r}")
    if checkpoint is not None and run_id is not None:
        raise ProofError("an archive of one run cannot carry a checkpoint: its ledger is a "
                         "part of the log, not the tree the checkpoint signs",
                         hint="export the whole store with --checkpoint, or leave out one")
    with open_source(source) as (backend, artifacts), building(out, "exporting") as tmp:
        scratch = tmp / SNAPSHOT
        backend.copy_snapshot(scratch, progress=progress)
        with map_sqlite_errors(scratch):
            conn = apsw.Connection(str(scratch))
            try:
                where, excluded = run_scope(conn, run_id) if run_id else ({}, [])
                params: dict[str, object] = {"run": run_id}
                info = describe(conn, where, params)
                if checkpoint is not None:
                    reach(conn, checkpoint)
                output = Output(tmp)
                scope = f"run {_sql_text(run_id)}" if run_id else "store"
                # A run's archive dumps a part of the ledger: check_log reads it all.
                ledger = None if run_id else _LedgerCheck(conn)
                schema, sections = dump(conn, output, fmt=format, where=where, params=params,
                                        header=f"-- scope: {scope}\n", progress=progress,
                                        rows_to={"ingest_ledger": ledger} if ledger else None)
                log, log_gaps = describe_log(conn, ledger.result(
                    conn, "ingest_ledger" in sections) if ledger else check_log(conn))
                for name, data in (checkpoint.files() if checkpoint else {}).items():
                    output.write(name, data)
                files = output.finish()
                refs = artifact_refs(conn, where.get("artifact", "1"), params)
            finally:
                conn.close()
        for name in (SNAPSHOT, SNAPSHOT + "-wal", SNAPSHOT + "-shm"):
            (tmp / name).unlink(missing_ok=True)
        # An archive keeps its payloads in segments, whatever the store uses: its format
        # does not change with the store's (docs/archives.md). The openings of sealed
        # requests are left out unless asked: each a gap that says so.
        withheld = [] if include_secrets else [r for r in refs if r.namespace == SECRETS_NS]
        kept = [r for r in refs if r.namespace != SECRETS_NS] if withheld else refs
        written, gaps = write_payloads(kept, artifacts, tmp / ARTIFACTS_DIR, progress)
        gaps += [Gap(kind="artifact_missing", subject=f"{r.namespace}/{r.digest}",
                     detail=WITHHELD) for r in withheld]
        files = dict(sorted({**files, **{
            f"{ARTIFACTS_DIR}/{name}": FileEntry(bytes=size, blake3=digest)
            for name, (size, digest) in written.items()}}.items()))
        manifest = Manifest(
            format_version=FORMAT_VERSION, format=format, run_id=run_id,
            excluded_tables=excluded, schema=schema, tables=sections, files=files,
            artifacts=len(refs), artifact_bytes=sum(r.size for r in refs), log=log,
            **{**info, "gaps": sorted(info["gaps"] + log_gaps + gaps)})
        with open(tmp / MANIFEST, "xb") as handle:
            handle.write(encode_manifest(manifest))
            handle.flush()
            os.fsync(handle.fileno())
    return manifest

