"""Verify a store, and reclaim orphaned artifact files without racing the writer.

``verify(store)`` answers "is anything here not as the writer left it?" and says where.
In one read snapshot of the database it runs, in order:

  1. the schema against the migrations (a dropped append-only trigger is a finding);
  2. ``PRAGMA quick_check`` (``full=True``: ``integrity_check``) and ``foreign_key_check``;
  3. the log: every leaf, Merkle root and hash-chain link recomputed (``check_log``);
  4. every ledger entry decoded and checked against the rows it produced
     (``_check_rows``): a row edited or deleted with the triggers dropped is named here;
  5. ``url_current`` rebuilt from ``fetch_attempt`` (max sequence per run + URL);
  6. quarantined payloads against their hashes.

With ``full``, every attempt captured from the wire has its content derived again from its
stored head and body (``_model.http1.derive_content``) and compared with the content it records
(its ``content`` artifact, or its body), and the codings it says were removed.

Then, outside that snapshot (artifact rows are append-only, so paging them by id sees the
same rows), every referenced artifact is checked on disk (present with its size; ``full``:
re-hashed with BLAKE3), and files under ``artifacts/`` that nothing references are listed
as orphans. Orphans are *notices*: a crash between storing a payload and committing its
message leaves one, harmlessly (design rule 18). Everything else is an *error*.

``reclaim_orphans`` deletes orphans older than a grace period. Why it cannot race a commit:
a row references an artifact only in a writer transaction that first checked the file is on
disk (``artifact_id`` in ``_write.apply``, inside ``BEGIN IMMEDIATE``). Reclaim unlinks a
file only while it holds the write lock itself (its own ``BEGIN IMMEDIATE``), after
re-reading under that lock that no row references it. SQLite admits one write transaction
at a time, so either the writer's check-insert-commit came first (reclaim's re-check sees
the row and keeps the file), or the unlink did (the writer's check finds the file missing
and refuses the message whole, design rule 6). No committed row can ever name a deleted
file.

Packs are compacted under the same rule: the pack holding orphans is first rewritten
without them into a new sealed pack (outside the lock: copying takes time), and the old
pack is removed only under the write lock, after the same re-check of every orphan it held
(and of puts again by other processes, which append touch records); if any was referenced
or put again meanwhile, the new pack is deleted instead and nothing changes. The writer's
check of a new reference looks at the pack file itself, so after the swap it finds the
payload in the new pack, or (an orphan removed) nowhere.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import apsw
import msgspec

from .._errors import (
    ArtifactCorruptError,
    ArtifactError,
    ArtifactMissingError,
    MessageError,
    StoreError,
    URLError,
)
from .._model.http1 import derive_content
from .._model.merkle import EMPTY_ROOT
from .._model.messages import (
    Discovery,
    DocumentRecord,
    FetchAttempt,
    Message,
    ObservedRef,
    Render,
    RuleEvaluated,
    RunEnded,
    RunStarted,
    SessionDocuments,
    SessionEnded,
    SessionStarted,
    decode_message,
    format_time,
    now_text,
    payload_hash,
)
from .._model.refs import ArtifactRef
from .._model.urls import NORMALIZER_VERSION, normalize_url
from .._store import quarantine as _quarantine
from .._store.artifacts import Removal
from .._store.db import DB_NAME, Store
from .._store.log import Head, check_log, check_times, identity_bound
from .._store.resync import SYNC_MARKER, read_marker
from .._store.sqlite import apply_migrations, load_migrations
from .proofs import CheckpointMatch, SignedCheckpoint, match_checkpoint
from .verify_state import WorkingState

__all__ = [
    "NOTICE_KINDS",
    "TABLE_COVERAGE",
    "Finding",
    "Location",
    "ReclaimHooks",
    "ReclaimReport",
    "VerifyReport",
    "reclaim_orphans",
    "verify",
]

_PAGE = 1000

# Every table the migrations create, and how verify checks it (docs/verify.md has the
# same table with which edits each check finds). A table not listed here fails
# tests/test_verify_coverage.py: a new table is either checked or said not to be evidence.
TABLE_COVERAGE = {
    "schema_migration": "rows against the migrations: version, name, checksum",
    "store_meta": "store_id: the hash chain starts from it; legacy_quarantine: the "
                  "pre-006 quarantine rows counted against it; created_at, created_on: "
                  "informational, not evidence",
    "ingest_ledger": "Merkle leaves and roots recomputed; payload hash, id and kind decoded",
    "commit_log": "hash chain, roots and frontiers recomputed from the ledger",
    "crawl_session": "rebuilt from session_started and session_ended entries",
    "crawl_run": "rebuilt from run_started and run_ended entries",
    "fetch_attempt": "rebuilt from fetch_attempt entries, field by field",
    "discovery_edge": "rebuilt from discovery entries, field by field",
    "rule_evaluation": "rebuilt from rule_evaluated entries, field by field",
    "session_document": "rebuilt from session_documents entries, field by field",
    "render": "rebuilt from render entries, field by field; its request count against the "
              "attempts naming it",
    "url_current": "rebuilt from fetch_attempt rows (highest sequence)",
    "dns_resolution": "compared through every attempt that references one (each attempt's "
                      "entry carries the answer it used); unreferenced rows found",
    "url_identity": "keys compared through every row that references one; unreferenced "
                    "rows found",
    "artifact": "digests and sizes compared through every row that references one; "
                "unreferenced rows found; files present (--full: re-hashed)",
    "frontier": "rebuilt by replaying frontier entries",
    "host_state": "rebuilt by replaying host entries",
    "quarantine": "payload hash and columns; counted records against the commit log",
}
NOTICE_KINDS = frozenset({"orphan", "artifact_writable", "sync_failed",  # worth knowing
                          "identity_unbound", "checkpoint_unbound"})
LEGACY_CLOSED_AT = 10  # the migration that closed the pre-006 quarantine layout
_JSON = msgspec.json.Encoder(order="deterministic")  # as _apply stores config and details


class Location(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Where a finding is: any of table and row id, log index, batch, file path, digest."""

    table: str | None = None
    row_id: int | str | None = None
    log_index: int | None = None
    batch_seq: int | None = None
    path: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        parts = []
        if self.table is not None:
            parts.append(self.table + ("" if self.row_id is None else f" row {self.row_id}"))
        if self.log_index is not None:
            parts.append(f"log index {self.log_index}")
        if self.batch_seq is not None:
            parts.append(f"batch {self.batch_seq}")
        if self.path is not None:
            parts.append(self.path)
        elif self.digest is not None:
            parts.append(self.digest)
        return ", ".join(parts)


class Findings:
    """Collects findings, keeping at most ``limit`` per kind (and counting the rest)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: list[tuple[str, Literal["error", "notice"], Location, str]] = []
        self.counts = collections.Counter[str]()
        self.omitted = collections.Counter[str]()

    def add(self, kind: str, message: str, **where: Any) -> None:
        severity: Literal["error", "notice"] = "notice" if kind in NOTICE_KINDS else "error"
        self.counts[kind] += 1
        if self.counts[kind] > self.limit:
            self.omitted[kind] += 1
            return
        self.items.append((kind, severity, Location(**where), message))


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """One thing wrong (``error``) or worth knowing (``notice``), and where it is."""

    kind: str
    severity: Literal["error", "notice"]
    location: Location
    message: str


class VerifyReport(msgspec.Struct, kw_only=True):
    path: str
    store_id: str
    full: bool
    checked_at: str
    tree_size: int
    root: str  # hex, recomputed from the ledger
    checks: dict[str, int]  # what was checked: name -> how many items
    findings: list[Finding]
    omitted: dict[str, int]  # findings left out per kind, beyond max_findings_per_kind
    orphan_bytes: int = 0  # the payloads no row references, in all (checks["orphans"] of them)
    checkpoint: str | None = None  # with a checkpoint: what was compared with it

    @property
    def ok(self) -> bool:
        """No errors (notices such as orphans do not count)."""
        return not self.errors

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def notices(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "notice"]


def verify(store: Store, *, full: bool = False, max_findings_per_kind: int = 1000,
           checkpoint: SignedCheckpoint | None = None) -> VerifyReport:
    """Check the database, the log, the rows against the ledger, and the artifact files.

    ``checkpoint`` (one whose signature the caller checked, ``proofs.open_checkpoint``):
    also whether the store still holds what it signed (``proofs.match_checkpoint``)."""
    found = Findings(max_findings_per_kind)
    checks: dict[str, int] = {}
    step = _Steps(found, checks)
    marker = None if store.path is None else read_marker(store.path)
    if marker is not None:
        found.add("sync_failed", "an fsync of this store failed and it has not been resynced "
                  "since: what is read here may not all be on the disk (" +
                  "; ".join(marker.strip().splitlines()[1:]) + "); opening it for writing "
                  "resyncs it", path=str(store.path / SYNC_MARKER))
    with _snapshot(store) as (conn, server):
        store_id = step(None, _meta, conn, "store_id") or ""
        if server is None:
            step("schema_objects", _check_schema, conn, found, store.schema_version)
            step("sqlite_" + ("integrity_check" if full else "quick_check"), _check_sqlite,
                 conn, found, full)
        else:  # the server's own objects; the copy's schema is the migrations' by making
            step("schema_objects", server, found, store.schema_version)
        step("foreign_key_check", _check_foreign_keys, conn, found)
        step("migration_rows", _check_migrations, conn, found, store.schema_version)
        heads: dict[int, Head] = {}
        size, root = step("log_entries", _check_log, conn, found, heads) or (0, EMPTY_ROOT)
        step("commit_times", _check_times, conn, found)
        matched = None
        if checkpoint is not None:
            matched = step("checkpoint", _check_checkpoint, conn, found, checkpoint, heads)
        state = _working_state(conn, store.schema_version)
        step("ledger_entries", _check_rows, conn, found, state)
        if state is not None:
            step("working_state_rows", _compare_state, state, found)
        step("projection_rows", _check_projection, conn, found)
        step("interned_rows", _check_interned, conn, found)
        step("quarantined", _quarantine.check_records, conn, found.add)
        step("legacy_quarantine", _check_legacy_quarantine, conn, found,
             store.schema_version)
        max_artifact = step(None, _max_artifact_id, conn) or 0
        step("artifacts_rehashed" if full else "artifacts", _check_artifacts, store, conn,
             found, max_artifact, full)
        if full:
            step("contents_derived", _check_contents, store, conn, found)
        orphans = step(None, _orphan_files, store, conn) or []
    for ref, age in orphans:
        found.add("orphan", f"{ref.namespace}/{ref.digest} ({ref.size} bytes, "
                  f"{_age(age)} old) is referenced by no row",
                  path=store.artifacts.location(ref), digest=ref.digest)
    checks["orphans"] = len(orphans)
    return VerifyReport(
        path=store.location, store_id=store_id, full=full, checked_at=now_text(),
        tree_size=size, root=root.hex(), checks=checks,
        findings=[Finding(kind=k, severity=s, location=loc, message=m)
                  for k, s, loc, m in found.items],
        omitted=dict(found.omitted), orphan_bytes=sum(ref.size for ref, _ in orphans),
        checkpoint=None if matched is None else matched.statement)


@contextlib.contextmanager
def _snapshot(store: Store) -> Iterator[tuple[Any, Callable[..., int] | None]]:
    """The connection every check reads, and for a server database, its schema check.

    A SQLite store is read in one snapshot of its own file. A PostgreSQL store is read in
    a private SQLite copy of one REPEATABLE READ snapshot (``copy_snapshot``, what export
    reads): every row check, the log, the replayed state and the artifacts then run exactly
    as they do on SQLite, over exactly what the server held; the objects that only the
    server has (tables, triggers, functions: the append-only guards) are compared with
    what schema/postgresql creates (``postgresql.check_schema``)."""
    if store.path is not None:
        with store.snapshot() as conn:
            yield conn, None
        return
    from .._store.postgresql import check_schema

    with tempfile.TemporaryDirectory(prefix="evidence-verify-") as scratch:
        copy = Path(scratch) / DB_NAME
        with store.errors():
            store.backend.copy_snapshot(copy)
        conn = apsw.Connection(str(copy), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            conn.execute("BEGIN")
            yield conn, lambda found, version: check_schema(store.backend.conninfo,
                                                           found.add, version)
        finally:
            conn.close()


def unreadable(path: Path | str, error: BaseException, *, full: bool = False) -> VerifyReport:
    """The report on a database SQLite cannot even open for reading (its header or its
    schema page is damaged): one ``sqlite_integrity`` error saying so."""
    found = Findings(1)
    found.add("sqlite_integrity", f"the database cannot be read at all, so no other check "
              f"could run: {error}", path=str(Path(path) / DB_NAME), table="sqlite_schema")
    return VerifyReport(path=str(path), store_id="", full=full, checked_at=now_text(),
                        tree_size=0, root=EMPTY_ROOT.hex(), checks={},
                        findings=[Finding(kind=k, severity=s, location=loc, message=m)
                                  for k, s, loc, m in found.items], omitted={})


class _Steps:
    """Runs one check; an SQLite error (a damaged page, a dropped table) becomes a finding
    naming the check, and the other checks still run."""

    def __init__(self, found: Findings, checks: dict[str, int]) -> None:
        self.found = found
        self.checks = checks

    def __call__(self, name: str | None, fn: Callable[..., Any], *args: object) -> Any:
        try:
            result = fn(*args)
        # StoreError: an apsw error, translated; TypeError, ValueError: values of the wrong
        # type, which only a damaged page or a hand-edited row gives.
        except (apsw.Error, StoreError, TypeError, ValueError) as exc:
            label = (name or fn.__name__.strip("_")).replace("_", " ")
            label += "" if label.endswith("check") else " check"
            self.found.add("check_aborted", f"the {label} could not finish: "
                           f"{type(exc).__name__}: {exc}")
            return None
        if name is not None:
            self.checks[name] = result[0] if isinstance(result, tuple) else (
                1 if result is None else result)
        return result


def _check_log(conn: apsw.Connection, found: Findings,
               heads: dict[int, Head]) -> tuple[int, bytes]:
    size, root, log_findings = check_log(conn, heads)
    for lf in log_findings:
        found.add(f"log_{lf.what}", lf.detail, table="commit_log" if lf.log_index is None
                  else "ingest_ledger", log_index=lf.log_index, batch_seq=lf.batch_seq)
    if identity_bound(conn) is False:
        found.add("identity_unbound", "the hash chain starts from zeros, not from the store's "
                  "identity (the store's first batch predates issue 12): an edit of "
                  "store_meta's store_id would not show", table="store_meta",
                  row_id="store_id")
    return size, root


def _check_times(conn: apsw.Connection, found: Findings) -> int:
    """Commit times never go back beyond ``TIME_TOLERANCE`` (``log_time``)."""
    for lf in check_times(conn):
        found.add("log_time", lf.detail, table="commit_log", batch_seq=lf.batch_seq)
    return conn.execute("SELECT count(*) FROM commit_log").fetchall()[0][0]


def _check_checkpoint(conn: apsw.Connection, found: Findings, cp: SignedCheckpoint,
                      heads: dict[int, Head]) -> CheckpointMatch:
    """The store against a checkpoint signed earlier: ``checkpoint_mismatch`` for each
    difference; a checkpoint that binds the root only is said to (``checkpoint_unbound``)."""
    matched = match_checkpoint(conn, cp, heads)
    where = {"table": "commit_log", "batch_seq": cp.chain.number} if cp.chain else {
        "table": "ingest_ledger"}
    for problem in matched.problems:
        found.add("checkpoint_mismatch", problem, **where)
    if not matched.bound:
        found.add("checkpoint_unbound", f"the checkpoint (size {cp.tree_size}) was signed "
                  "before checkpoints bound the commit-log chain: it vouches for the accepted "
                  "messages only, not for commit times, quarantine records or the store's "
                  "identity", table="commit_log")
    return matched


def _check_legacy_quarantine(conn: apsw.Connection, found: Findings, version: int) -> int:
    """Quarantine rows in the pre-006 layout (``deliveries`` NULL) are a closed set from
    migration 010 on: as many as ``store_meta`` recorded then (0 for a store created at
    010 or later), and all older than every counted record."""
    if version < LEGACY_CLOSED_AT:
        return 0
    count, _ = _quarantine.legacy_rows(conn)
    recorded = _meta(conn, "legacy_quarantine")
    if not recorded.isdigit():
        found.add("quarantine_legacy", "store_meta has no count of the quarantine rows in the "
                  f"pre-006 layout (migration {LEGACY_CLOSED_AT:03d} records it): "
                  f"{count} such row(s) cannot be told from forged ones",
                  table="store_meta", row_id="legacy_quarantine")
    elif count != int(recorded):
        found.add("quarantine_legacy", f"{count} quarantine row(s) in the pre-006 layout "
                  f"(deliveries NULL), the store recorded {recorded} when that layout was "
                  "closed: no writer has written one since migration 006", table="quarantine")
    for (qid,) in conn.execute(
            "SELECT quarantine_id FROM quarantine WHERE deliveries IS NULL AND quarantine_id > "
            "(SELECT min(quarantine_id) FROM quarantine WHERE deliveries IS NOT NULL)"):
        found.add("quarantine_legacy", f"quarantine row {qid} is in the pre-006 layout but "
                  "newer than a counted record: it was written after migration 006, by hand",
                  table="quarantine", row_id=qid)
    return count


def _check_migrations(conn: apsw.Connection, found: Findings, version: int) -> int:
    """schema_migration rows: each applied migration with its name and checksum."""
    want = {v: (name, checksum) for v, name, checksum, _ in load_migrations()[:version]}
    have = {v: (name, checksum) for v, name, checksum in conn.execute(
        "SELECT version, name, checksum FROM schema_migration")}
    for v in sorted(want.keys() | have.keys()):
        if v not in have:
            found.add("schema", f"schema_migration has no row for migration {v:03d} "
                      f"({want[v][0]}), which the store's schema version includes",
                      table="schema_migration", row_id=v)
        elif v not in want:
            found.add("schema", f"schema_migration row {v} ({have[v][0]}) is no migration "
                      "of the store's schema version", table="schema_migration", row_id=v)
        elif have[v] != want[v]:
            found.add("schema", f"schema_migration row {v} says {have[v][0]} with checksum "
                      f"{have[v][1][:12]}; the migration is {want[v][0]}, {want[v][1][:12]}",
                      table="schema_migration", row_id=v)
    return len(have)


def _working_state(conn: apsw.Connection, version: int) -> WorkingState | None:
    if not conn.execute("SELECT 1 FROM sqlite_schema WHERE name = 'frontier'").fetchall():
        return None  # a store from before the frontier (schema 1)
    return WorkingState(conn, version)


def _compare_state(state: WorkingState, found: Findings) -> int:
    state.compare(found.add)
    return state.replayed


def _references(conn: apsw.Connection, parent: str) -> list[tuple[str, str]]:
    """(table, column) of every foreign key to ``parent``'s primary key, from the schema."""
    tables = [t for (t,) in conn.execute(
        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
    return [(table, column) for table in tables
            for _, _, target, column, *_ in conn.execute(
                "SELECT * FROM pragma_foreign_key_list(?)", (table,)) if target == parent]


def _check_interned(conn: apsw.Connection, found: Findings) -> int:
    """``url_identity`` and ``artifact`` rows exist only because some row references them
    (a message's URL, a payload): one no row references was added by hand."""
    n = 0
    for parent, key, label in (("url_identity", "url_id", "fetch_key"),
                               ("artifact", "artifact_id", "namespace || '/' || digest"),
                               ("dns_resolution", "resolution_seq", "resolution_id")):
        used = " UNION ".join(f"SELECT {column} FROM {table} WHERE {column} IS NOT NULL"
                              for table, column in _references(conn, parent))
        n += conn.execute(f"SELECT count(*) FROM {parent}").fetchall()[0][0]
        if not used:
            continue
        for row_id, name in conn.execute(
                f"SELECT {key}, {label} FROM {parent} WHERE {key} NOT IN ({used})"):
            found.add("row_unlogged", f"{parent} row {row_id} ({name}) is referenced by no "
                      "row: no accepted message made it", table=parent, row_id=row_id)
    return n


def _max_artifact_id(conn: apsw.Connection) -> int:
    return conn.execute("SELECT coalesce(max(artifact_id), 0) FROM artifact").fetchall()[0][0]


def _meta(conn: apsw.Connection, key: str) -> str:
    rows = conn.execute("SELECT value FROM store_meta WHERE key = ?", (key,)).fetchall()
    return rows[0][0] if rows else ""


def _check_schema(conn: apsw.Connection, found: Findings, version: int) -> int:
    """Every table, index and trigger exactly as the migrations up to the store's version
    create them, and no other."""
    fresh = apsw.Connection(":memory:")
    try:
        apply_migrations(fresh, load_migrations()[:version])
        want = _schema(fresh)
    finally:
        fresh.close()
    have = _schema(conn)
    for key in sorted(want.keys() | have.keys()):
        kind, name = key
        if key not in have:
            found.add("schema", f"{kind} {name} is missing (the migrations create it)",
                      table=want[key][0])
        elif key not in want:
            found.add("schema", f"{kind} {name} is not created by any migration",
                      table=have[key][0])
        elif want[key] != have[key]:
            found.add("schema", f"{kind} {name} differs from its migration", table=have[key][0])
    return len(have)


def _schema(conn: apsw.Connection) -> dict[tuple[str, str], tuple[str, str | None]]:
    return {(t, n): (tbl, sql) for t, n, tbl, sql in conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_schema WHERE name NOT LIKE 'sqlite_stat%'")}


def _check_sqlite(conn: apsw.Connection, found: Findings, full: bool) -> int:
    """SQLite's own check, its report grouped by what is damaged: each damaged table or
    index is one finding (how many problems, the first ones), located at its table."""
    pragma = "integrity_check" if full else "quick_check"
    try:
        lines = _report_lines(conn, f"PRAGMA {pragma}")
    except apsw.CorruptError:  # it stopped at a damaged page: table by table, then
        lines = []
        for (table,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table' "
                                     "ORDER BY name").fetchall():
            try:
                lines += [line for line in _report_lines(
                    conn, f"PRAGMA {pragma}({_quote(table)})") if line != "ok"]
            except apsw.Error as exc:
                unreadable = _unreadable_objects(conn, table) or [
                    f"table {table} (or one of its indexes)"]
                for name in unreadable:
                    found.add("sqlite_integrity", f"{pragma}: {name} is damaged: the check "
                              f"stops at it ({exc})", table=table)
        if not lines:
            return 1
    if lines == ["ok"]:
        return 1
    names = _objects_by_root_page(conn)
    damaged: dict[tuple[str, str, str], list[str]] = {}
    for line in lines:
        damaged.setdefault(_damaged_object(conn, names, line), []).append(line)
    for (kind, name, table), problems in damaged.items():
        example = "; ".join(problems[:3]) + ("; ..." if len(problems) > 3 else "")
        if not name:
            for problem in problems:
                found.add("sqlite_integrity", f"{pragma}: {problem}")
            continue
        what = f"{kind} {name}" + (f" (on {table})" if kind == "index" else "")
        found.add("sqlite_integrity", f"{pragma}: {what} is damaged: {len(problems)} "
                  f"problem(s) reported, e.g. {example}", table=table)
    return 1


def _unreadable_objects(conn: apsw.Connection, table: str) -> list[str]:
    """Which b-trees of a table a full scan cannot read: the table, and each index."""
    # Every cell is read (count(*) would only read each page's cell count).
    scans = [(f"table {table}", f"SELECT * FROM {_quote(table)} NOT INDEXED")]
    for (index,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'index' AND "
                                 "tbl_name = ? ORDER BY name", (table,)).fetchall():
        columns = [name for _, _, name in conn.execute(f"PRAGMA index_info({_quote(index)})")
                   if name is not None]
        scans.append((f"index {index} (on {table})",
                      f"SELECT {', '.join(map(_quote, columns)) or 1} FROM {_quote(table)} "
                      f"INDEXED BY {_quote(index)}"))
    damaged = []
    for what, sql in scans:
        try:
            for _ in conn.execute(sql):
                pass
        except apsw.CorruptError:
            damaged.append(what)
        except apsw.Error:  # a partial index the planner cannot scan whole: not known
            continue
    return damaged


def _report_lines(conn: apsw.Connection, sql: str) -> list[str]:
    return [line for (row,) in conn.execute(sql) for line in str(row).splitlines()
            if line and not line.startswith("*** in database")]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_TREE = re.compile(r"(?:Tree|On tree page|On page) (\d+)")
_INDEX = re.compile(r"(?:index|in) (\w+)")
_PAGE_NO = re.compile(r"[Pp]age (\d+)")


def _objects_by_root_page(conn: apsw.Connection) -> dict[int, tuple[str, str, str]]:
    """root page -> (kind, name, table) of every b-tree (sqlite_schema is page 1)."""
    names = {1: ("table", "sqlite_schema", "sqlite_schema")}
    with contextlib.suppress(apsw.Error):  # the schema itself may be what is damaged
        for kind, name, table, root in conn.execute(
                "SELECT type, name, tbl_name, rootpage FROM sqlite_schema WHERE rootpage > 0"):
            names[root] = (kind, name, table)
    return names


def _damaged_object(conn: apsw.Connection, names: dict[int, tuple[str, str, str]],
                    line: str) -> tuple[str, str, str]:
    """Which b-tree one line of an integrity report is about: ("", "", "") if none."""
    by_name = {name: (kind, name, table) for kind, name, table in names.values()}
    match = _TREE.search(line)
    if match and int(match[1]) in names:
        return names[int(match[1])]
    for word in _INDEX.findall(line):
        if word in by_name:
            return by_name[word]
    match = _PAGE_NO.search(line)
    if match:  # a page of some tree: dbstat (when compiled in) knows which
        with contextlib.suppress(apsw.Error):
            for (name,) in conn.execute("SELECT name FROM dbstat WHERE pageno = ?",
                                        (int(match[1]),)):
                if name in by_name:
                    return by_name[name]
    return ("", "", "")


def _check_foreign_keys(conn: apsw.Connection, found: Findings) -> None:
    for table, rowid, parent, _fkid in conn.execute("PRAGMA foreign_key_check"):
        found.add("foreign_key", f"{table} row {rowid} references a {parent} row that does "
                  "not exist", table=table, row_id=rowid)


_PROJECTION_SQL = """
WITH latest AS (
    SELECT run_id, url_id, max(sequence) AS sequence FROM fetch_attempt
    WHERE render_seq IS NULL GROUP BY run_id, url_id
), expected AS (
    SELECT l.run_id, l.url_id, l.sequence, f.attempt_seq FROM latest l JOIN fetch_attempt f
    ON f.run_id = l.run_id AND f.url_id = l.url_id AND f.sequence = l.sequence
)
SELECT e.run_id, e.url_id, e.sequence, e.attempt_seq, c.sequence, c.attempt_seq
FROM expected e LEFT JOIN url_current c ON c.run_id = e.run_id AND c.url_id = e.url_id
WHERE c.run_id IS NULL OR c.sequence IS NOT e.sequence OR c.attempt_seq IS NOT e.attempt_seq
UNION ALL
SELECT c.run_id, c.url_id, NULL, NULL, c.sequence, c.attempt_seq FROM url_current c
WHERE NOT EXISTS (SELECT 1 FROM fetch_attempt f WHERE f.run_id = c.run_id AND f.url_id = c.url_id
                  AND f.render_seq IS NULL)
"""


def _check_projection(conn: apsw.Connection, found: Findings) -> int:
    """``url_current`` rebuilt from the attempts: the highest sequence per (run, URL)."""
    for run_id, url_id, seq, attempt, have_seq, have_attempt in conn.execute(_PROJECTION_SQL):
        where = {"table": "url_current", "row_id": f"{run_id}/{url_id}"}
        if seq is None:
            found.add("projection_extra", f"url_current ({run_id}, url {url_id}) points at "
                      f"attempt row {have_attempt}, but the run has no attempt of that URL",
                      **where)
        elif have_seq is None:
            found.add("projection_missing", f"url_current ({run_id}, url {url_id}) is missing; "
                      f"the attempts say sequence {seq} (attempt row {attempt})", **where)
        else:
            found.add("projection_stale", f"url_current ({run_id}, url {url_id}) says sequence "
                      f"{have_seq} (attempt row {have_attempt}); the attempts say sequence "
                      f"{seq} (attempt row {attempt})", **where)
    return conn.execute("SELECT count(*) FROM url_current").fetchall()[0][0]


def _check_artifacts(store: Store, conn: apsw.Connection, found: Findings, max_id: int,
                     full: bool) -> int:
    """Each artifact row's file: present with its size (full: BLAKE3 re-hashed), read-only."""
    n, after = 0, 0
    while after < max_id:
        with store.errors():  # one short snapshot per page
            page = conn.execute(
                "SELECT artifact_id, namespace, digest, size FROM artifact "
                "WHERE artifact_id > ? AND artifact_id <= ? ORDER BY artifact_id LIMIT ?",
                (after, max_id, _PAGE)).fetchall()
        if not page:
            break
        for artifact_id, namespace, digest, size in page:
            n, after = n + 1, artifact_id
            where = {"table": "artifact", "row_id": artifact_id, "digest": digest}
            try:
                ref = ArtifactRef(namespace, digest, size)
                where["path"] = store.artifacts.location(ref)
                (store.artifacts.verify if full else store.artifacts.check)(ref)
            except ArtifactMissingError:
                found.add("artifact_missing", f"artifact {namespace}/{digest} ({size} bytes) "
                          "is referenced but not on disk", **where)
                continue
            except ArtifactCorruptError as exc:
                found.add("artifact_corrupt", str(exc), **where)
                continue
            except ArtifactError as exc:
                found.add("artifact_unreadable", str(exc), **where)
                continue
            if store.artifacts.is_writable(ref):
                found.add("artifact_writable", f"artifact {where['path']} is writable (the "
                          "store makes every payload read-only)", **where)
    return n


# --- rows against the ledger -----------------------------------------------------------
#
# Every evidence row was written by exactly one ledger entry, from its decoded message. So
# each row can be re-derived from the ledger and compared field by field: this locates a
# row edited or deleted with the append-only triggers dropped, which no hash would (rows
# are not hashed; only ledger payloads are). Tables with a log_index column are merged with
# the ledger in log order; sessions and runs are keyed by their ids.

_LEDGER_SQL = ("SELECT log_index, message_id, kind, payload_hash, payload FROM ingest_ledger "
               "ORDER BY log_index")
_ATTEMPT_SQL = """
SELECT f.log_index, f.attempt_seq, f.attempt_id, f.run_id, f.url, f.sequence, f.method,
       f.started_at, f.elapsed_ms, f.outcome, f.http_status,
       f.request_headers_id, q.namespace, q.digest, q.size,
       f.response_headers_id, h.namespace, h.digest, h.size,
       f.body_id, b.namespace, b.digest, b.size,
       f.body_truncated, f.content_type, f.error, u.normalizer_version, u.fetch_key,
       f.capture, f.content_id, c.namespace, c.digest, c.size, f.transfer_coding,
       f.content_coding, f.content_truncated, f.surplus_id, s.namespace, s.digest, s.size,
       f.text_encoding, f.text_encoding_source, rr.render_id,
       f.remote_address, f.remote_port, f.local_address, f.local_port, f.connection_reused,
       f.resolution_seq, d.resolution_id, d.host, d.port, d.resolved_at, d.source,
       d.addresses, d.ttl, f.tls_version, f.tls_cipher, f.tls_sni, f.tls_alpn,
       f.tls_chain_id, t.namespace, t.digest, t.size, f.tls_verified,
       f.request_secrets_id, o.namespace, o.digest, o.size
FROM fetch_attempt f
LEFT JOIN render rr ON rr.render_seq = f.render_seq
LEFT JOIN dns_resolution d ON d.resolution_seq = f.resolution_seq
LEFT JOIN artifact t ON t.artifact_id = f.tls_chain_id
LEFT JOIN artifact o ON o.artifact_id = f.request_secrets_id
LEFT JOIN artifact q ON q.artifact_id = f.request_headers_id
LEFT JOIN artifact h ON h.artifact_id = f.response_headers_id
LEFT JOIN artifact b ON b.artifact_id = f.body_id
LEFT JOIN artifact c ON c.artifact_id = f.content_id
LEFT JOIN artifact s ON s.artifact_id = f.surplus_id
LEFT JOIN url_identity u ON u.url_id = f.url_id
ORDER BY f.log_index, f.attempt_seq
"""
_EDGE_SQL = """
SELECT e.log_index, e.edge_id, e.run_id, a.attempt_id, e.source_attempt_seq,
       e.source_artifact_id, s.namespace, s.digest, s.size, e.position, e.observed_ref,
       u.normalizer_version, u.fetch_key, e.edge_kind, e.tag, e.attr, e.rel, rr.render_id
FROM discovery_edge e
LEFT JOIN render rr ON rr.render_seq = e.render_seq
LEFT JOIN fetch_attempt a ON a.attempt_seq = e.source_attempt_seq
LEFT JOIN artifact s ON s.artifact_id = e.source_artifact_id
LEFT JOIN url_identity u ON u.url_id = e.target_url_id
ORDER BY e.log_index, e.edge_id
"""
_RULE_SQL = """
SELECT r.log_index, r.evaluation_id, r.run_id, u.normalizer_version, u.fetch_key, r.rule_id,
       r.rule_version, r.input_hash, r.verdict, r.attempt_seq, a.attempt_id, r.evaluated_at,
       r.details
FROM rule_evaluation r
LEFT JOIN url_identity u ON u.url_id = r.url_id
LEFT JOIN fetch_attempt a ON a.attempt_seq = r.attempt_seq
ORDER BY r.log_index, r.evaluation_id
"""
_DOCUMENT_SQL = """
SELECT d.log_index, d.session_id || '/' || d.url_id, d.session_id, u.normalizer_version,
       u.fetch_key, d.url, d.change, d.http_status, d.body_digest, d.attempt_id, d.fetched_at
FROM session_document d
LEFT JOIN url_identity u ON u.url_id = d.url_id
ORDER BY d.log_index, d.session_id, d.url_id
"""
_RENDER_SQL = """
SELECT r.log_index, r.render_seq, r.render_id, r.run_id, f.attempt_id, r.url, r.started_at,
       r.elapsed_ms, r.outcome, r.error, r.browser, r.viewport_width, r.viewport_height,
       r.settle, r.final_url, r.title, r.dom_id, d.namespace, d.digest, d.size,
       r.screenshot_id, s.namespace, s.digest, s.size, r.screenshot_truncated,
       r.mhtml_id, h.namespace, h.digest, h.size, r.requests, r.not_recorded,
       (SELECT count(*) FROM fetch_attempt a WHERE a.render_seq = r.render_seq),
       r.behaviors_id, b.namespace, b.digest, b.size
FROM render r
LEFT JOIN fetch_attempt f ON f.attempt_seq = r.source_attempt_seq
LEFT JOIN artifact d ON d.artifact_id = r.dom_id
LEFT JOIN artifact s ON s.artifact_id = r.screenshot_id
LEFT JOIN artifact h ON h.artifact_id = r.mhtml_id
LEFT JOIN artifact b ON b.artifact_id = r.behaviors_id
ORDER BY r.log_index, r.render_seq
"""
# ledger kind -> the table whose rows carry its log_index
_LOGGED_TABLES = {"fetch_attempt": "fetch_attempt", "discovery": "discovery_edge",
                  "rule_evaluated": "rule_evaluation", "render": "render",
                  "session_documents": "session_document"}


class _Cursor:
    """Rows ordered by log_index, taken up to each ledger index in turn (a merge join)."""

    def __init__(self, rows: Iterator[tuple]) -> None:
        self._rows = rows
        self._next = next(rows, None)

    def take(self, index: int) -> tuple[list[tuple], list[tuple]]:
        """(rows with a smaller log_index, rows with exactly ``index``)."""
        before: list[tuple] = []
        at: list[tuple] = []
        while self._next is not None and self._next[0] <= index:
            (at if self._next[0] == index else before).append(self._next)
            self._next = next(self._rows, None)
        return before, at

    def rest(self) -> list[tuple]:
        rest = [] if self._next is None else [self._next, *self._rows]
        self._next = None
        return rest


def _check_rows(conn: apsw.Connection, found: Findings, state: WorkingState | None) -> int:
    cursors = {"fetch_attempt": _Cursor(conn.execute(_ATTEMPT_SQL)),
               "discovery": _Cursor(conn.execute(_EDGE_SQL)),
               "rule_evaluated": _Cursor(conn.execute(_RULE_SQL)),
               "render": _Cursor(conn.execute(_RENDER_SQL))}
    if conn.execute("SELECT 1 FROM sqlite_schema WHERE name = 'session_document'").fetchall():
        cursors["session_documents"] = _Cursor(conn.execute(_DOCUMENT_SQL))
    sessions: dict[str, dict[str, tuple[object, int]]] = {}
    runs: dict[str, dict[str, tuple[object, int]]] = {}
    n = 0
    for index, message_id, kind, stored_hash, payload in conn.execute(_LEDGER_SQL):
        n += 1
        message = _decode_entry(found, index, message_id, kind, stored_hash, payload)
        tag = None if message is None else type(message).__struct_config__.tag
        rows: list[tuple] = []
        for cursor_kind, cursor in cursors.items():
            before, at = cursor.take(index)
            for row in before:
                _unlogged(found, cursor_kind, row, "no ledger entry")
            if cursor_kind == tag:
                rows = at
            elif message is not None:
                for row in at:
                    _unlogged(found, cursor_kind, row, f"a {tag} entry")
        if isinstance(message, FetchAttempt):
            _check_attempt(found, message, index, rows)
        elif isinstance(message, Discovery):
            _check_discovery(found, conn, message, index, rows)
        elif isinstance(message, RuleEvaluated):
            _check_rule(found, message, index, rows)
        elif isinstance(message, SessionDocuments):
            _check_documents(found, conn, message, index, rows)
        elif isinstance(message, Render):
            _check_render(found, message, index, rows)
        elif message is not None:
            _expect_fact(sessions, runs, message, index)
        if state is not None and message is not None:
            refused = state.apply(message, index)
            if refused is not None:
                found.add("state_replay", f"ledger entry {index} ({tag}) cannot be applied "
                          f"again to the working state it was applied to: {refused}",
                          table="ingest_ledger", log_index=index)
    for cursor_kind, cursor in cursors.items():
        for row in cursor.rest():
            _unlogged(found, cursor_kind, row, "beyond the end of the ledger")
    _check_facts(found, conn, "crawl_session", "session_id", sessions, (
        "session_id", "started_at", "mode", "config", "baseline_session_id", "ended_at",
        "outcome"))
    _check_facts(found, conn, "crawl_run", "run_id", runs, (
        "run_id", "session_id", "started_at", "program", "host", "pid", "ended_at", "outcome",
        "reason"))
    return n


def _decode_entry(found: Findings, index: int, message_id: str, kind: str, stored_hash: str,
                  payload: bytes) -> Message | None:
    where = {"table": "ingest_ledger", "log_index": index}
    if payload_hash(payload) != stored_hash:
        found.add("ledger_entry", f"ledger entry {index}: payload does not hash to its "
                  "payload_hash", **where)
    try:
        message = decode_message(payload)
    except MessageError as exc:
        found.add("ledger_entry", f"ledger entry {index} does not decode: {exc}", **where)
        return None
    tag = type(message).__struct_config__.tag
    if message.message_id != message_id:
        found.add("ledger_entry", f"ledger entry {index}: message_id column is {message_id!r}, "
                  f"its payload says {message.message_id!r}", **where)
    if tag != kind:
        found.add("ledger_entry", f"ledger entry {index}: kind column is {kind!r}, its payload "
                  f"is a {tag}", **where)
    return message


def _unlogged(found: Findings, kind: str, row: tuple, what: str) -> None:
    table = _LOGGED_TABLES[kind]
    found.add("row_unlogged", f"{table} row {row[1]} claims log index {row[0]}, which is "
              f"{what}: no accepted message wrote this row", table=table, row_id=row[1],
              log_index=row[0])


def _compare(found: Findings, table: str, row_id: object, label: str,
             expected: Mapping[str, object], actual: Mapping[str, object],
             log_index: int | dict[str, int]) -> None:
    for field, want in expected.items():
        have = actual[field]
        if have != want:
            index = log_index if isinstance(log_index, int) else log_index[field]
            found.add("row_mismatch", f"{table} row {row_id} ({label}): {field} is {have!r}, "
                      f"its ledger entry (log index {index}) says {want!r}",
                      table=table, row_id=row_id, log_index=index)


def _ref_text(ref: ArtifactRef | None) -> str | None:
    return None if ref is None else f"{ref.namespace}/{ref.digest} ({ref.size} bytes)"


def _row_ref(artifact_id: int | None, namespace: str | None, digest: str | None,
             size: int | None) -> str | None:
    if artifact_id is None:
        return None
    if namespace is None:
        return f"artifact row {artifact_id} (missing)"
    return f"{namespace}/{digest} ({size} bytes)"


@functools.lru_cache(maxsize=65536)  # link targets repeat (navigation): most are hits
def _fetch_key(url: str) -> str:
    try:
        return normalize_url(url)
    except URLError:
        return "<not normalizable>"


def _row_key(url: str, version: int | None, key: str | None) -> str | None:
    """The row's fetch key, or the expected one if it was made by another normalizer version."""
    if version is not None and version != NORMALIZER_VERSION:
        return _fetch_key(url)  # cannot recompute an old version's key: nothing to compare
    return key


def _check_attempt(found: Findings, m: FetchAttempt, index: int, rows: list[tuple]) -> None:
    if not rows:
        found.add("row_missing", f"the fetch_attempt row of attempt {m.attempt_id} (log index "
                  f"{index}) is missing", table="fetch_attempt", log_index=index)
        return
    for extra in rows[1:]:
        _unlogged(found, "fetch_attempt", extra, "already the entry of another row")
    (_, seq, attempt_id, run_id, url, sequence, method, started_at, elapsed_ms, outcome, status,
     q_id, q_ns, q_digest, q_size, h_id, h_ns, h_digest, h_size, b_id, b_ns, b_digest, b_size,
     truncated, content_type, error, version, key, capture, c_id, c_ns, c_digest, c_size,
     transfer_coding, content_coding, content_truncated, s_id, s_ns, s_digest, s_size,
     text_encoding, text_source, render_id, *connection) = rows[0]
    *connection, o_id, o_ns, o_digest, o_size = connection
    expected = {
        "attempt_id": m.attempt_id, "run_id": m.run_id, "url": m.url, "sequence": m.sequence,
        "method": m.method, "started_at": format_time(m.started_at),
        "elapsed_ms": m.elapsed_ms, "outcome": m.outcome, "http_status": m.http_status,
        "request_headers": _ref_text(m.request_headers),
        "response_headers": _ref_text(m.response_headers), "body": _ref_text(m.body),
        "body_truncated": int(m.body_truncated), "content_type": m.content_type,
        "error": m.error, "fetch_key": _fetch_key(m.url), "capture": m.capture,
        "content": _ref_text(m.content), "transfer_coding": m.transfer_coding,
        "content_coding": m.content_coding, "content_truncated": int(m.content_truncated),
        "surplus": _ref_text(m.surplus), "text_encoding": m.text_encoding,
        "text_encoding_source": m.text_encoding_source, "render_id": m.render_id,
        "request_secrets": _ref_text(m.request_secrets)}
    actual = {
        "attempt_id": attempt_id, "run_id": run_id, "url": url, "sequence": sequence,
        "method": method, "started_at": started_at, "elapsed_ms": elapsed_ms,
        "outcome": outcome, "http_status": status,
        "request_headers": _row_ref(q_id, q_ns, q_digest, q_size),
        "response_headers": _row_ref(h_id, h_ns, h_digest, h_size),
        "body": _row_ref(b_id, b_ns, b_digest, b_size), "body_truncated": truncated,
        "content_type": content_type, "error": error, "fetch_key": _row_key(m.url, version, key),
        "capture": capture, "content": _row_ref(c_id, c_ns, c_digest, c_size),
        "transfer_coding": transfer_coding, "content_coding": content_coding,
        "content_truncated": content_truncated, "surplus": _row_ref(s_id, s_ns, s_digest, s_size),
        "text_encoding": text_encoding, "text_encoding_source": text_source,
        "render_id": render_id, "request_secrets": _row_ref(o_id, o_ns, o_digest, o_size)}
    expected.update(_connection_expected(m))
    actual.update(_connection_actual(connection))
    _compare(found, "fetch_attempt", seq, f"attempt {m.attempt_id}", expected, actual, index)


def _connection_expected(m: FetchAttempt) -> dict[str, object]:
    """The connection columns an attempt's message gives (``_apply._connection_row``), its
    resolution's row included: an edited answer shows at every attempt that used it."""
    c = m.connection
    if c is None:
        return dict.fromkeys(_CONNECTION_FIELDS)
    d, t = c.dns, c.tls
    return {
        "remote_address": c.remote_address, "remote_port": c.remote_port,
        "local_address": c.local_address, "local_port": c.local_port,
        "connection_reused": int(c.reused),
        "dns_resolution": None if d is None else (
            d.resolution_id, d.host, d.port, format_time(d.resolved_at), d.source,
            _JSON.encode(d.addresses).decode(), d.ttl),
        "tls_version": t and t.version, "tls_cipher": t and t.cipher, "tls_sni": t and t.sni,
        "tls_alpn": t and t.alpn, "tls_chain": None if t is None else _ref_text(t.chain),
        "tls_verified": None if t is None else int(t.verified)}


def _connection_actual(row: list) -> dict[str, object]:
    (remote, remote_port, local, local_port, reused, r_seq, r_id, r_host, r_port, r_at,
     r_source, r_addresses, r_ttl, version, cipher, sni, alpn, t_id, t_ns, t_digest, t_size,
     verified) = row
    resolution: object = None
    if r_seq is not None:
        resolution = (f"dns_resolution row {r_seq} (missing)" if r_id is None else
                      (r_id, r_host, r_port, r_at, r_source, r_addresses, r_ttl))
    return {
        "remote_address": remote, "remote_port": remote_port, "local_address": local,
        "local_port": local_port, "connection_reused": reused, "dns_resolution": resolution,
        "tls_version": version, "tls_cipher": cipher, "tls_sni": sni, "tls_alpn": alpn,
        "tls_chain": _row_ref(t_id, t_ns, t_digest, t_size), "tls_verified": verified}


_CONNECTION_FIELDS = ("remote_address", "remote_port", "local_address", "local_port",
                      "connection_reused", "dns_resolution", "tls_version", "tls_cipher",
                      "tls_sni", "tls_alpn", "tls_chain", "tls_verified")


def _check_discovery(found: Findings, conn: apsw.Connection, m: Discovery, index: int,
                     rows: list[tuple]) -> None:
    wanted: dict[tuple[int, str], ObservedRef] = {}
    for observed_ref in m.refs:  # ON CONFLICT DO NOTHING: the first equal anchor is kept
        wanted.setdefault((observed_ref.position, observed_ref.observed), observed_ref)
    seen: set[tuple[int, str]] = set()
    for row in rows:
        (_, edge_id, run_id, attempt_id, _seq, s_id, s_ns, s_digest, s_size, position,
         observed, version, key, edge_kind, tag, attr, rel, render_id) = row
        ref = wanted.get((position, observed))
        if ref is None or (position, observed) in seen:
            found.add("row_unlogged", f"discovery_edge row {edge_id} (position {position}, "
                      f"{observed!r}) is not among the references of its ledger entry (log "
                      f"index {index})", table="discovery_edge", row_id=edge_id, log_index=index)
            continue
        seen.add((position, observed))
        expected = {"run_id": m.run_id, "source_attempt_id": m.source_attempt_id,
                    "source_artifact": _ref_text(m.source_artifact),
                    "target_fetch_key": _fetch_key(ref.url), "edge_kind": ref.edge_kind,
                    "tag": ref.tag, "attr": ref.attr, "rel": ref.rel, "render_id": m.render_id}
        actual = {"run_id": run_id, "source_attempt_id": attempt_id,
                  "source_artifact": _row_ref(s_id, s_ns, s_digest, s_size),
                  "target_fetch_key": _row_key(ref.url, version, key), "edge_kind": edge_kind,
                  "tag": tag, "attr": attr, "rel": rel, "render_id": render_id}
        _compare(found, "discovery_edge", edge_id, f"discovery {m.message_id}", expected,
                 actual, index)
    missing = [anchor for anchor in wanted if anchor not in seen]
    if not missing:
        return
    source = conn.execute("SELECT artifact_id FROM artifact WHERE namespace = ? AND digest = ?",
                          (m.source_artifact.namespace, m.source_artifact.digest)).fetchall()
    for position, observed in missing:
        owner = [] if not source else conn.execute(
            "SELECT log_index FROM discovery_edge WHERE run_id = ? AND source_artifact_id = ? "
            "AND position = ? AND observed_ref = ?",
            (m.run_id, source[0][0], position, observed)).fetchall()
        if owner and owner[0][0] < index:
            continue  # an earlier message recorded the same edge first (redelivered page)
        found.add("row_missing", f"the discovery_edge of discovery {m.message_id} at position "
                  f"{position} ({observed!r}, log index {index}) is missing",
                  table="discovery_edge", log_index=index)


def _check_render(found: Findings, m: Render, index: int, rows: list[tuple]) -> None:
    if not rows:
        found.add("row_missing", f"the render row of render {m.render_id} (log index "
                  f"{index}) is missing", table="render", log_index=index)
        return
    for extra in rows[1:]:
        _unlogged(found, "render", extra, "already the entry of another row")
    (_, seq, render_id, run_id, source, url, started_at, elapsed_ms, outcome, error, browser,
     width, height, settle, final_url, title, d_id, d_ns, d_digest, d_size, s_id, s_ns,
     s_digest, s_size, shot_cut, h_id, h_ns, h_digest, h_size, requests, not_recorded,
     made, b_id, b_ns, b_digest, b_size) = rows[0]
    expected = {
        "render_id": m.render_id, "run_id": m.run_id, "source_attempt_id": m.source_attempt_id,
        "url": m.url, "started_at": format_time(m.started_at), "elapsed_ms": m.elapsed_ms,
        "outcome": m.outcome, "error": m.error, "browser": m.browser,
        "viewport_width": m.viewport_width, "viewport_height": m.viewport_height,
        "settle": m.settle, "final_url": m.final_url, "title": m.title,
        "dom": _ref_text(m.dom), "screenshot": _ref_text(m.screenshot),
        "screenshot_truncated": int(m.screenshot_truncated), "mhtml": _ref_text(m.mhtml),
        "requests": m.requests, "not_recorded": _JSON.encode(m.not_recorded).decode(),
        "requests made": m.requests, "behaviors": _ref_text(m.behaviors)}
    actual = {
        "render_id": render_id, "run_id": run_id, "source_attempt_id": source, "url": url,
        "started_at": started_at, "elapsed_ms": elapsed_ms, "outcome": outcome,
        "error": error, "browser": browser, "viewport_width": width,
        "viewport_height": height, "settle": settle, "final_url": final_url, "title": title,
        "dom": _row_ref(d_id, d_ns, d_digest, d_size),
        "screenshot": _row_ref(s_id, s_ns, s_digest, s_size),
        "screenshot_truncated": shot_cut, "mhtml": _row_ref(h_id, h_ns, h_digest, h_size),
        "requests": requests, "not_recorded": not_recorded, "requests made": made,
        "behaviors": _row_ref(b_id, b_ns, b_digest, b_size)}
    _compare(found, "render", seq, f"render {m.render_id}", expected, actual, index)


def _check_rule(found: Findings, m: RuleEvaluated, index: int, rows: list[tuple]) -> None:
    if not rows:
        found.add("row_missing", f"the rule_evaluation row of {m.message_id} (rule {m.rule_id} "
                  f"v{m.rule_version}, log index {index}) is missing", table="rule_evaluation",
                  log_index=index)
        return
    for extra in rows[1:]:
        _unlogged(found, "rule_evaluated", extra, "already the entry of another row")
    (_, evaluation_id, run_id, version, key, rule_id, rule_version, input_hash, verdict,
     attempt_seq, attempt_id, evaluated_at, details) = rows[0]
    expected = {"run_id": m.run_id, "fetch_key": _fetch_key(m.url), "rule_id": m.rule_id,
                "rule_version": m.rule_version, "input_hash": m.input_hash,
                "verdict": m.verdict, "attempt_id": m.attempt_id,
                "evaluated_at": format_time(m.evaluated_at),
                "details": _JSON.encode(m.details).decode()}
    actual = {"run_id": run_id, "fetch_key": _row_key(m.url, version, key), "rule_id": rule_id,
              "rule_version": rule_version, "input_hash": input_hash, "verdict": verdict,
              "attempt_id": attempt_id if attempt_seq is None or attempt_id is not None
              else f"attempt row {attempt_seq} (missing)",
              "evaluated_at": evaluated_at, "details": details}
    _compare(found, "rule_evaluation", evaluation_id, f"rule {m.rule_id} v{m.rule_version}",
             expected, actual, index)


def _check_documents(found: Findings, conn: apsw.Connection, m: SessionDocuments,
                     index: int, rows: list[tuple]) -> None:
    """session_document rows (a completed session's record, the next one's baseline)."""
    wanted: dict[str, DocumentRecord] = {}
    for doc in m.documents:  # ON CONFLICT DO NOTHING: the first of two equal keys is kept
        wanted.setdefault(_fetch_key(doc.url), doc)
    seen: set[str] = set()
    for row in rows:
        (_, row_id, session_id, version, key, url, change, status, digest, attempt_id,
         fetched_at) = row
        own = key if version in (None, NORMALIZER_VERSION) else _fetch_key(url)
        recorded = wanted.get(own)
        if recorded is None or own in seen:
            found.add("row_unlogged", f"session_document row {row_id} ({url!r}) is not among "
                      f"the documents of its ledger entry (log index {index})",
                      table="session_document", row_id=row_id, log_index=index)
            continue
        seen.add(own)
        expected = {"session_id": m.session_id, "url": recorded.url,
                    "change": recorded.change, "http_status": recorded.http_status,
                    "body_digest": recorded.body_digest, "attempt_id": recorded.attempt_id,
                    "fetched_at": None if recorded.fetched_at is None
                    else format_time(recorded.fetched_at), "fetch_key": own}
        actual = {"session_id": session_id, "url": url, "change": change,
                  "http_status": status, "body_digest": digest, "attempt_id": attempt_id,
                  "fetched_at": fetched_at, "fetch_key": key if key is not None else None}
        _compare(found, "session_document", row_id, f"session {m.session_id} document",
                 expected, actual, index)
    for key in wanted.keys() - seen:
        owner = conn.execute(
            "SELECT d.log_index FROM session_document d JOIN url_identity u "
            "ON u.url_id = d.url_id WHERE d.session_id = ? AND u.normalizer_version = ? "
            "AND u.fetch_key = ?", (m.session_id, NORMALIZER_VERSION, key)).fetchall()
        if owner and owner[0][0] < index:
            continue  # an earlier message recorded the same document first
        found.add("row_missing", f"the session_document of session {m.session_id} for "
                  f"{wanted[key].url!r} (log index {index}) is missing",
                  table="session_document", log_index=index)


def _expect_fact(sessions: dict[str, dict[str, tuple[object, int]]],
                 runs: dict[str, dict[str, tuple[object, int]]], m: Message, i: int) -> None:
    """Sessions and runs: the row each started/ended message implies (ends start as NULL)."""
    if isinstance(m, SessionStarted):
        sessions[m.session_id] = {
            "session_id": (m.session_id, i), "started_at": (format_time(m.started_at), i),
            "mode": (m.mode, i), "config": (_JSON.encode(m.config).decode(), i),
            "baseline_session_id": (m.baseline_session_id, i), "ended_at": (None, i),
            "outcome": (None, i)}
    elif isinstance(m, SessionEnded):
        fields = sessions.setdefault(m.session_id, {})
        fields.update(ended_at=(format_time(m.ended_at), i), outcome=(m.outcome, i))
    elif isinstance(m, RunStarted):
        runs[m.run_id] = {
            "run_id": (m.run_id, i), "session_id": (m.session_id, i),
            "started_at": (format_time(m.started_at), i), "program": (m.program, i),
            "host": (m.host, i), "pid": (m.pid, i), "ended_at": (None, i),
            "outcome": (None, i), "reason": (None, i)}
    elif isinstance(m, RunEnded):
        fields = runs.setdefault(m.run_id, {})
        fields.update(ended_at=(format_time(m.ended_at), i), outcome=(m.outcome, i),
                      reason=(m.reason, i))


def _check_facts(found: Findings, conn: apsw.Connection, table: str, key: str,
                 expected: dict[str, dict[str, tuple[object, int]]],
                 columns: tuple[str, ...]) -> None:
    rows = {row[0]: dict(zip(columns, row, strict=True)) for row in conn.execute(
        f"SELECT {', '.join(columns)} FROM {table}")}
    for ident, fields in expected.items():
        indices = {f: i for f, (_, i) in fields.items()}
        first = min(indices.values())
        if ident not in rows:
            found.add("row_missing", f"the {table} row of {key} {ident} (log index {first}) "
                      "is missing", table=table, row_id=ident, log_index=first)
            continue
        want = {f: v for f, (v, _) in fields.items()}
        _compare(found, table, ident, f"{key} {ident}", want, rows[ident], indices)
    for ident in rows.keys() - expected.keys():
        found.add("row_unlogged", f"{table} row {ident} has no ledger entry: no accepted "
                  "message wrote it", table=table, row_id=ident)


# --- contents against the wire ---------------------------------------------------------

_CONTENT_SQL = """
SELECT f.attempt_seq, f.attempt_id, f.transfer_coding, f.content_coding, f.content_truncated,
       h.namespace, h.digest, h.size, b.namespace, b.digest, b.size,
       c.namespace, c.digest, c.size
FROM fetch_attempt f
JOIN artifact h ON h.artifact_id = f.response_headers_id
JOIN artifact b ON b.artifact_id = f.body_id
LEFT JOIN artifact c ON c.artifact_id = f.content_id
WHERE f.capture = 'wire' AND f.attempt_seq > ? ORDER BY f.attempt_seq LIMIT ?
"""


def _check_contents(store: Store, conn: apsw.Connection, found: Findings) -> int:
    """Derive each wire attempt's content again from its head and body; compare."""
    n = after = 0
    while True:
        with store.errors():  # each page its own short snapshot
            page = conn.execute(_CONTENT_SQL, (after, _PAGE)).fetchall()
        if not page:
            return n
        for (seq, attempt_id, transfer, coding, truncated, *refs) in page:
            n, after = n + 1, seq
            head_ref, body_ref = ArtifactRef(*refs[0:3]), ArtifactRef(*refs[3:6])
            content_ref = None if refs[6] is None else ArtifactRef(*refs[6:9])
            try:  # a missing or damaged file is the artifact check's finding
                head, body = store.artifacts.read(head_ref), store.artifacts.read(body_ref)
                stored = body if content_ref is None else store.artifacts.read(content_ref)
            except ArtifactError:
                continue
            limit = len(stored) if truncated else len(stored) + 1
            derived = derive_content(head, body, limit)
            same = derived.data == stored and (derived.transfer_coding, derived.content_coding) \
                == (transfer, coding)
            if not same:
                found.add("content_mismatch", f"attempt {attempt_id}: its content is not what "
                          "its stored head and body derive to (codings recorded "
                          f"{transfer}/{coding}, derived {derived.transfer_coding}/"
                          f"{derived.content_coding})", table="fetch_attempt", row_id=seq,
                          digest=(content_ref or body_ref).digest)


# --- orphans -------------------------------------------------------------------------

def _quarantined_refs(conn: apsw.Connection, after: int = 0) -> tuple[set[tuple[str, str]], int]:
    """Artifacts named by quarantined messages: kept, so an auditor can see what was refused."""
    refs: set[tuple[str, str]] = set()
    last = after
    for qid, payload in conn.execute(
            "SELECT quarantine_id, payload FROM quarantine WHERE quarantine_id > ?", (after,)):
        last = max(last, qid)
        try:
            message = decode_message(payload)
        except MessageError:  # undecodable payloads are quarantined for exactly that
            continue
        named: tuple[ArtifactRef | None, ...]
        if isinstance(message, FetchAttempt):
            named = (message.request_headers, message.response_headers, message.body,
                     message.content, message.surplus, message.request_secrets)
        elif isinstance(message, Discovery):
            named = (message.source_artifact,)
        elif isinstance(message, Render):
            named = (message.dom, message.screenshot, message.mhtml, message.behaviors)
        else:
            named = ()
        refs.update((r.namespace, r.digest) for r in named if r is not None)
    return refs, last


def _orphan_files(store: Store, conn: apsw.Connection) -> list[tuple[ArtifactRef, float]]:
    return list(_orphans(store, conn))


def _referenced(conn: apsw.Connection, ref: ArtifactRef) -> bool:
    return bool(conn.execute("SELECT 1 FROM artifact WHERE namespace = ? AND digest = ?",
                             (ref.namespace, ref.digest)).fetchall())


def _orphans(store: Store, conn: apsw.Connection) -> Iterator[tuple[ArtifactRef, float]]:
    """(ref, age in seconds) of each file no row and no quarantined message references."""
    with store.errors():
        quarantined, _ = _quarantined_refs(conn)
    for ref in store.artifacts.iter_refs():
        if (ref.namespace, ref.digest) in quarantined:
            continue
        with store.errors():
            if _referenced(conn, ref):
                continue
        age = store.artifacts.age(ref)
        if age is not None:
            yield ref, age


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


@dataclass(frozen=True, kw_only=True)
class ReclaimHooks:
    """Named points in ``reclaim_orphans``, for tests that interleave a commit."""

    before_lock: Callable[[ArtifactRef], None] | None = None  # candidate chosen, no lock yet
    while_locked: Callable[[ArtifactRef], None] | None = None  # lock held, re-checked, pre-unlink


class ReclaimReport(msgspec.Struct, kw_only=True):
    removed: list[str]  # where each removed payload was (its file; its pack and offset)
    bytes_freed: int
    kept_young: int  # orphans inside the grace period
    kept_referenced: int  # became referenced before they could be deleted
    skipped_busy: int  # the write lock could not be had within the busy timeout


def reclaim_orphans(store: Store, grace_seconds: float, *,
                    hooks: ReclaimHooks | None = None) -> ReclaimReport:
    """Remove orphaned payloads last put more than ``grace_seconds`` ago.

    The artifact store prepares each removal first (a pack is rewritten without its
    orphans; a file has nothing to prepare), then each is re-checked and committed under the
    store's write lock (see the module docstring for why that cannot race a commit), or
    abandoned, leaving everything as it was, if any of its payloads was referenced or put
    again meanwhile. Directories are left in place: removing one could race a put that has
    just created it.
    """
    if grace_seconds < 0:
        raise ValueError(f"grace_seconds must be >= 0, not {grace_seconds!r}")
    hooks = hooks or ReclaimHooks()
    report = ReclaimReport(removed=[], bytes_freed=0, kept_young=0, kept_referenced=0,
                           skipped_busy=0)
    with store.reader() as reader:
        candidates = []
        for ref, age in list(_orphans(store, reader)):
            if age < grace_seconds:
                report.kept_young += 1
            else:
                candidates.append(ref)
    if not candidates:
        return report
    removals = collections.deque(store.artifacts.plan_removal(candidates))
    try:
        with store.errors():
            # Its own connection: the store's write connection belongs to the writer.
            conn = store.backend.connect_writer()
            try:
                quarantined, last_q = _quarantined_refs(conn)
                while removals:
                    removal = removals.popleft()
                    for ref in removal.refs:
                        if hooks.before_lock:
                            hooks.before_lock(ref)
                    try:
                        # The write lock: no commit can interleave.
                        conn.execute(store.backend.dialect.begin_write)
                    except store.backend.BusyError:
                        report.skipped_busy += len(removal.refs)
                        removal.abort()
                        continue
                    try:
                        more, last_q = _quarantined_refs(conn, last_q)
                        quarantined |= more
                        _reclaim_one(store, conn, removal, quarantined, grace_seconds, hooks,
                                     report)
                    finally:
                        conn.execute("ROLLBACK")  # nothing was written; this releases the lock
            finally:
                conn.close()
    finally:
        for removal in removals:  # not reached: an error stopped the loop
            removal.abort()
    return report


def _reclaim_one(store: Store, conn: apsw.Connection, removal: Removal,
                 quarantined: set[tuple[str, str]], grace_seconds: float, hooks: ReclaimHooks,
                 report: ReclaimReport) -> None:
    """Under the write lock: re-check every payload of the removal, then commit it; if any
    is referenced or young again, abort it whole. Anything doubtful keeps the bytes."""
    refresh = getattr(store.artifacts, "refresh", None)
    if refresh is not None:
        refresh()  # puts again by other processes (touches) since the plan was made
    keep = False
    for ref in removal.refs:
        if (ref.namespace, ref.digest) in quarantined or _referenced(conn, ref):
            report.kept_referenced += 1
            keep = True
            continue
        age = store.artifacts.age(ref)
        if age is None:
            keep = True
        elif age < grace_seconds:  # put again since the scan
            report.kept_young += 1
            keep = True
    if keep:
        removal.abort()
        return
    for ref in removal.refs:
        if hooks.while_locked:
            hooks.while_locked(ref)
    where = [store.artifacts.location(ref) for ref in removal.refs]
    report.bytes_freed += removal.commit()
    report.removed.extend(where)
