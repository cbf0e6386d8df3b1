"""Backup, restore and compare: what makes an archive hold up in front of a third party.

    backup    the online backup API copies one snapshot into ``DIR/evidence.db``; then the
              artifacts its rows reference are copied (after the snapshot: a payload is
              durable before any row references it, so none can be missing), and the copy
              is checked: integrity_check, check_log, every referenced artifact present.
    restore   the dump is loaded into a fresh database under an authorizer that admits only
              what a dump contains (CREATE, INSERT, two pragmas), then re-dumped: counts,
              section hashes and the Merkle root must equal the manifest, and the schema
              must equal what the migrations create. Only then does the store appear.
    compare   two stores or archives, reduced to the same private copies, compared by
              table, by run, by a fixed set of report queries and row by row; and their
              payloads: which each side references and holds (``full``: re-hashed).

Invariant: a target directory is never half-written. Everything is built in a hidden
sibling and renamed into place when complete and checked (``_archive.snapshot.building``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import apsw
import blake3
import msgspec

from .._errors import CorruptStoreError, MigrationError, StoreError
from .._model.refs import ArtifactRef
from .._store.artifacts import ArtifactStore
from .._store.backend import ArtifactBackend
from .._store.db import ARTIFACTS_DIR, DB_NAME, Store
from .._store.fsync import fsync_file
from .._store.location import database_kind, is_server_database, label, redact
from .._store.log import check_log, load_head
from .._store.packs import open_artifact_store
from .._store.sqlite import copy_migrated, load_migrations, map_sqlite_errors
from .carried import keep, restore_problems
from .export import (
    FileEntry,
    Manifest,
    Output,
    dump,
    ident,
    read_manifest,
    schema_sql,
    sql_literal,
    tables,
)
from .segments import archive_payloads
from .snapshot import (
    HELD,
    MANIFEST,
    Gap,
    PayloadSource,
    Progress,
    Source,
    artifact_refs,
    building,
    copy_artifacts,
    open_source,
    payload_states,
)

__all__ = ["BackupReport", "Comparison", "Difference", "RestoreReport", "backup", "compare",
           "load_dump", "restore"]


def _counts(conn: apsw.Connection) -> dict[str, int]:
    return {t.name: conn.execute(f"SELECT count(*) FROM {ident(t.name)}").fetchall()[0][0]
            for t in tables(conn)}


def _integrity(conn: apsw.Connection) -> list[str]:
    return [f"integrity_check: {r}" for (r,) in conn.execute("PRAGMA integrity_check")
            if r != "ok"]


def _foreign_keys(conn: apsw.Connection) -> list[str]:
    return [f"foreign_key_check: {t} row {rowid} references a missing {parent} row"
            for t, rowid, parent, _ in conn.execute("PRAGMA foreign_key_check")]


# --- backup --------------------------------------------------------------------------------

class BackupReport(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    store_id: str
    schema_version: int
    pages: int
    tables: dict[str, int]
    tree_size: int
    root: str
    artifacts: int
    artifact_bytes: int
    findings: list[str]  # empty when every check passed


def backup(source: Source, out_dir: os.PathLike[str] | str, *,
           progress: Progress | None = None) -> BackupReport:
    """Copy a store, while it is being written, into the new directory ``out_dir``.

    The result is itself a store (``evidence.db`` in WAL mode and ``artifacts/``), plus
    ``backup.json`` (this report). Findings (a referenced artifact missing from the source,
    a log that does not check) are reported, not raised: the copy is still the best there is.
    A payload that cannot be read is no finding: ``ArtifactReadError``, and nothing is left
    at ``out_dir``.
    """
    with open_source(source) as (backend, artifacts), building(out_dir, "backup") as tmp:
        db = tmp / DB_NAME
        pages = backend.copy_snapshot(db, progress=progress)
        with map_sqlite_errors(db):
            conn = apsw.Connection(str(db))
            try:
                findings = _integrity(conn) + _foreign_keys(conn)
                size, root, log = check_log(conn)
                head = load_head(conn)
                findings += [f"check_log: {f.detail}" for f in log]
                if (size, root) != (head.tree.size, head.tree.root()):
                    findings.append(f"check_log: head size {head.tree.size} != {size}")
                refs, counts = artifact_refs(conn), _counts(conn)
                store_id = dict(conn.execute("SELECT key, value FROM store_meta")).get(
                    "store_id", "")
                version = conn.execute("PRAGMA user_version").fetchall()[0][0]
                conn.execute("PRAGMA journal_mode = WAL").fetchall()
            finally:
                conn.close()
        fsync_file(db)
        # A backup is a new store: its payloads go into packs (the default layout).
        copy = open_artifact_store(tmp / ARTIFACTS_DIR, max_payload=2**62)
        try:
            copied, gaps = copy_artifacts(refs, artifacts, copy, progress)
            findings += [f"{g.kind}: {g.subject}: {g.detail}" for g in gaps]
            known = {g.subject for g in gaps}
            findings += [f"artifact_missing: {r.namespace}/{r.digest} is not in the backup"
                         for r in refs if f"{r.namespace}/{r.digest}" not in known
                         and not copy.exists(r)]  # checked again, independently of the copy
        finally:
            copy.close()
        report = BackupReport(path=str(Path(out_dir)), store_id=store_id,
                              schema_version=version, pages=pages,
                              tables=counts, tree_size=size, root=root.hex(),
                              artifacts=len(refs), artifact_bytes=copied, findings=findings)
        _write_json(tmp / "backup.json", report)
    return report


def _write_json(path: Path, value: msgspec.Struct) -> None:
    with open(path, "xb") as handle:
        handle.write(msgspec.json.format(msgspec.json.encode(value), indent=2) + b"\n")
        handle.flush()
        os.fsync(handle.fileno())


# --- restore -------------------------------------------------------------------------------

class RestoreReport(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    store_id: str
    schema_version: int
    run_id: str | None
    tables: dict[str, int]
    tree_size: int
    root: str
    artifacts: int
    artifact_bytes: int
    checks: list[str]  # what was compared with the manifest, and matched
    findings: list[str]  # known gaps carried over from the archive; never a mismatch


_ALLOWED = {apsw.SQLITE_CREATE_TABLE, apsw.SQLITE_CREATE_INDEX, apsw.SQLITE_CREATE_TRIGGER,
            apsw.SQLITE_CREATE_VIEW, apsw.SQLITE_INSERT, apsw.SQLITE_READ, apsw.SQLITE_SELECT,
            apsw.SQLITE_FUNCTION, apsw.SQLITE_TRANSACTION, apsw.SQLITE_REINDEX}


def _authorize(op: int, p1: str | None, p2: str | None, db: str | None,
               trigger: str | None) -> int:
    """Admit only what a dump contains: an archive is input, never trusted code."""
    if db not in (None, "main"):
        return apsw.SQLITE_DENY  # no TEMP objects, no attached databases
    if op in _ALLOWED or (op == apsw.SQLITE_UPDATE and p1 == "sqlite_master"):
        return apsw.SQLITE_OK  # CREATE writes its sqlite_master row
    if op == apsw.SQLITE_PRAGMA and p1 in ("foreign_keys", "user_version"):
        return apsw.SQLITE_OK
    return apsw.SQLITE_DENY  # ATTACH (and so VACUUM INTO), DELETE, UPDATE, DROP, pragmas


def load_dump(dump_file: Path, db: Path, progress: Progress | None = None) -> apsw.Connection:
    """Execute a dump into the new database ``db``; return its open connection."""
    total, done = dump_file.stat().st_size, 0
    with map_sqlite_errors(db):
        conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READWRITE
                               | apsw.SQLITE_OPEN_CREATE | apsw.SQLITE_OPEN_EXCLUSIVE)
    try:
        # Unjournaled and unsynced while loading: the file is private until it is renamed.
        conn.execute("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; "
                     "PRAGMA cache_size = -65536")
        conn.limit(apsw.SQLITE_LIMIT_ATTACHED, 0)
        conn.authorizer = _authorize
        with open(dump_file, "rb") as handle:
            buffered, pending = b"", ""
            while True:
                block = handle.read(1 << 22)
                buffered += block
                cut = buffered.rfind(b"\n") + 1 if block else len(buffered)
                text, buffered = buffered[:cut].decode(), buffered[cut:]
                pending += text
                done += len(text)
                # Rows are one line each; a CREATE may span lines: run only whole statements.
                if pending and (apsw.complete(pending) or not block):
                    for _ in conn.execute(pending):
                        pass
                    pending = ""
                    if progress:
                        progress("load", min(done, total), total)
                if not block:
                    break
        conn.authorizer = None
    except (apsw.Error, UnicodeDecodeError) as exc:
        conn.close()
        raise CorruptStoreError(f"{dump_file}: the dump does not load ({exc})",
                                hint="the archive is damaged or was not written by evidence "
                                "export", path=str(dump_file)) from exc
    return conn


def _file_matches(path: Path, expected: FileEntry | None) -> bool:
    """Does the file exist with the manifest's size and BLAKE3 hash?"""
    if expected is None or not path.is_file() or path.stat().st_size != expected.bytes:
        return False
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    hasher.update_mmap(path)
    return hasher.hexdigest() == expected.blake3


def _mismatches(conn: apsw.Connection, manifest: Manifest, migrations: list,
                log: tuple[int, bytes]) -> tuple[list[str], dict[str, int]]:
    """Every way the loaded database differs from what its manifest promises; row counts."""
    problems = []
    schema, sections = dump(conn, Output(None))
    if schema.blake3 != manifest.schema.blake3:
        problems.append("the schema section hashes differently from the manifest's")
    for name in sorted(set(sections) | set(manifest.tables)):
        got, want = sections.get(name), manifest.tables.get(name)
        if got is None or want is None:
            state = "missing" if got is None else "not in the manifest"
            problems.append(f"table {name} is {state}")
        elif (got.rows, got.blake3) != (want.rows, want.blake3):
            problems.append(f"table {name}: {got.rows} rows, blake3 {got.blake3[:16]}; the "
                            f"manifest says {want.rows} rows, blake3 {want.blake3[:16]}")
    if manifest.run_id is None:  # a run's subset of the ledger is not a whole tree
        size, root = log
        if (size, root.hex()) != (manifest.log.tree_size, manifest.log.root):
            problems.append(f"the Merkle tree recomputed from the ledger (size {size}, root "
                            f"{root.hex()[:16]}) is not the manifest's (size "
                            f"{manifest.log.tree_size}, root {manifest.log.root[:16]})")
    reference = apsw.Connection(":memory:")
    try:
        copy_migrated(reference, migrations[:manifest.schema_version])
        if schema_sql(reference, tables(reference)) != schema_sql(conn, tables(conn)):
            problems.append(f"the schema is not what migrations 001-"
                            f"{manifest.schema_version:03d} create")
    finally:
        reference.close()
    return problems, {name: s.rows for name, s in sections.items()}


def restore(archive: os.PathLike[str] | str, store_path: os.PathLike[str] | str, *,
            artifacts: os.PathLike[str] | str | None = None,
            progress: Progress | None = None, check_carried: bool = True) -> RestoreReport:
    """Build a store at ``store_path`` (new or empty) from an archive, and prove it.

    ``store_path`` may be a PostgreSQL connection string to an empty database; the
    payloads then go to the new or empty directory ``artifacts``, which the store's meta
    names (``_restore_postgres``).

    Raises ``StoreError`` for a non-empty target, ``CorruptStoreError`` when anything
    differs from the manifest (the partial store is removed: nothing appears at the target).
    A checkpoint the archive carries must be one the loaded log holds (``check_carried``
    False: only its files are checked, so that ``verify_archive`` reports the difference);
    a store directory keeps it (``_archive.carried``).
    """
    archive = Path(archive)
    manifest = read_manifest(archive)
    if manifest.format != "sql":
        raise StoreError(f"{archive} is a {manifest.format} export, for review tools only",
                         hint="restore from an archive exported with --format sql")
    migrations = load_migrations()
    if manifest.schema_version > len(migrations):
        raise MigrationError(f"{archive} has schema version {manifest.schema_version}, newer "
                             f"than this program supports ({len(migrations)})",
                             hint="upgrade evidence to restore this archive")
    dump_file = archive / "dump.sql"
    if not _file_matches(dump_file, manifest.files.get("dump.sql")):
        raise CorruptStoreError(f"{dump_file} is missing or does not match its manifest "
                                "(size or BLAKE3)", hint="the archive was altered or damaged",
                                path=str(dump_file))
    if database_kind(store_path) == "postgresql":
        return _restore_postgres(archive, manifest, migrations, str(store_path), artifacts,
                                 progress)
    if artifacts is not None:
        raise StoreError("--artifacts is for a restore into PostgreSQL; a store directory "
                         "keeps its payloads in its artifacts/",
                         hint="leave out --artifacts, or restore into postgresql://...")
    with building(store_path, "restoring") as tmp:
        db = tmp / DB_NAME
        conn = load_dump(dump_file, db, progress)
        try:
            with map_sqlite_errors(db):
                size, root, _ = check_log(conn)
                problems, counts = _mismatches(conn, manifest, migrations, (size, root))
                problems += _integrity(conn)
                problems += restore_problems(archive, manifest.files, conn,
                                             against_log=check_carried)
                findings = _foreign_keys(conn)  # the source's, if any: the hashes matched
                refs = artifact_refs(conn)
                conn.execute("PRAGMA journal_mode = WAL").fetchall()
        finally:
            conn.close()
        fsync_file(db)
        keep(archive, list(manifest.files), tmp)
        copied, gaps, new = _restore_payloads(
            archive, manifest, refs, open_artifact_store(tmp / ARTIFACTS_DIR,
                                                         max_payload=2**62), progress)
        problems += new
        if problems:
            raise CorruptStoreError(
                f"{archive} does not restore to what its manifest describes; nothing was "
                "written at the target:\n  " + "\n  ".join(problems),
                hint="the archive was altered or damaged; use another copy",
                path=str(archive), problems=problems)
    return _report(manifest, str(Path(store_path)), counts, size, root, refs, gaps, copied,
                   findings)


def _restore_payloads(archive: Path, manifest: Manifest, refs: list[ArtifactRef],
                      restored: ArtifactBackend, progress: Progress | None
                      ) -> tuple[int, list[Gap], list[str]]:
    """Copy the archive's payloads into ``restored`` (closed after), re-hashed: (bytes
    copied, every gap, the gaps its manifest did not list, as problems)."""
    payloads = archive_payloads(archive, manifest.format_version)
    try:
        copied, gaps = copy_artifacts(refs, payloads, restored, progress)
    finally:
        restored.close()
        payloads.close()
    known = {(g.kind, g.subject) for g in manifest.gaps}
    return copied, gaps, [f"{g.kind}: {g.subject}: {g.detail}" for g in gaps
                          if (g.kind, g.subject) not in known]


def _report(manifest: Manifest, where: str, counts: dict[str, int], size: int, root: bytes,
            refs: list, gaps: list, copied: int, findings: list[str],
            extra: tuple[str, ...] = ()) -> RestoreReport:
    checks = ["dump.sql size and BLAKE3", "schema section", f"{len(counts)} table sections "
              "(rows and BLAKE3)", "schema equals the migrations'", "integrity_check",
              f"{len(refs) - len(gaps)} artifacts re-hashed", *extra]
    if manifest.run_id is None:
        checks.append("Merkle tree size and root")
    return RestoreReport(
        path=where, store_id=manifest.store_id,
        schema_version=manifest.schema_version, run_id=manifest.run_id, tables=counts,
        tree_size=size, root=root.hex(), artifacts=len(refs), artifact_bytes=copied,
        checks=checks, findings=findings + [f"known gap, {g.kind}: {g.subject}: {g.detail}"
                                 for g in manifest.gaps])


def _restore_postgres(archive: Path, manifest: Manifest, migrations: list, location: str,
                      artifacts: os.PathLike[str] | str | None,
                      progress: Progress | None) -> RestoreReport:
    """Restore into an empty PostgreSQL database: the dump is loaded and proved in a private
    SQLite file exactly as for a store directory; the artifacts are copied into a hidden
    sibling of ``artifacts``; then every row goes into the database in one transaction,
    which commits only if its own snapshot dumps to the manifest's hashes again (else it
    rolls back, leaving the database empty); last, the artifact directory is renamed into
    place."""
    from .._store.pgschema import restore_rows

    if artifacts is None:
        raise StoreError("a restore into PostgreSQL needs a directory for the payloads",
                         hint="add --artifacts DIR (a new or empty directory)")
    where = redact(location)
    with building(artifacts, "restoring") as tmp, \
            tempfile.TemporaryDirectory(prefix=".evidence-restore-", dir=tmp.parent) as scratch:
        db = Path(scratch) / DB_NAME
        conn = load_dump(archive / "dump.sql", db, progress)
        try:
            with map_sqlite_errors(db):
                size, root, _ = check_log(conn)
                problems, counts = _mismatches(conn, manifest, migrations, (size, root))
                problems += _integrity(conn)
                problems += restore_problems(archive, manifest.files, conn)
                findings = _foreign_keys(conn)
                refs = artifact_refs(conn)
        finally:
            conn.close()
        copied, gaps, new = _restore_payloads(
            archive, manifest, refs, ArtifactStore(tmp, max_payload=2**62), progress)
        problems += new

        def check(snapshot: Path) -> list[str]:
            with map_sqlite_errors(snapshot), contextlib.closing(
                    apsw.Connection(str(snapshot))) as copy:
                return [f"in PostgreSQL: {p}" for p in _mismatches(
                    copy, manifest, migrations, check_log(copy)[:2])[0]]

        if not problems:
            problems = restore_rows(location, db, manifest.schema_version,
                                    str(Path(artifacts).absolute()), check)
        if problems:
            raise CorruptStoreError(
                f"{archive} does not restore to what its manifest describes; nothing was "
                "written at the target:\n  " + "\n  ".join(problems),
                hint="the archive was altered or damaged; use another copy",
                path=str(archive), problems=problems)
    return _report(manifest, where, counts, size, root, refs, gaps, copied, findings,
                   ("the database's own snapshot dumps to the same hashes",))


# --- compare ---------------------------------------------------------------------------------

# The fixed report queries: (SQL, number of key columns); the other columns are the values.
REPORTS = {
    "pages_per_status_per_run": (
        "SELECT c.run_id, a.outcome, a.http_status, count(*) FROM url_current c "
        "JOIN fetch_attempt a ON a.attempt_seq = c.attempt_seq GROUP BY 1, 2, 3", 3),
    "rule_verdicts_per_rule": (
        "SELECT rule_id, rule_version, verdict, count(*) FROM rule_evaluation "
        "GROUP BY 1, 2, 3", 3),
    # An artifact's media type is the content_type (without parameters) of the attempts that
    # have it as their body; one served under two types counts under both.
    "artifacts_per_media_type": (
        "WITH typed AS (SELECT DISTINCT body_id AS artifact_id, lower(trim(CASE WHEN "
        "instr(content_type, ';') THEN substr(content_type, 1, instr(content_type, ';') - 1) "
        "ELSE content_type END)) AS media_type FROM fetch_attempt WHERE body_id IS NOT NULL) "
        "SELECT coalesce(media_type, '(none)'), count(*), sum(a.size) FROM typed "
        "JOIN artifact a USING (artifact_id) GROUP BY 1 UNION ALL "
        "SELECT '(not a body)', count(*), coalesce(sum(size), 0) FROM artifact a WHERE NOT "
        "EXISTS (SELECT 1 FROM fetch_attempt f WHERE f.body_id = a.artifact_id)", 1),
    "edges_per_run": (
        "SELECT run_id, edge_kind, count(*) FROM discovery_edge GROUP BY 1, 2", 2),
}


class Difference(msgspec.Struct, frozen=True, kw_only=True):
    """One thing that differs. ``a``/``b`` are None where that side has nothing (for a
    payload: where that side's rows do not reference it)."""

    what: str  # archive, schema, table, run, report, payload, row
    name: str  # the table, run, report, archive or payload (namespace/digest)
    key: str = ""  # the table of a run, the report row, the row's primary key
    a: str | None = None
    b: str | None = None

    def __str__(self) -> str:
        where = f"{self.what} {self.name}" + (f" [{self.key}]" if self.key else "")
        return f"{where}: a={self.a if self.a is not None else '(none)'} " \
               f"b={self.b if self.b is not None else '(none)'}"


class Side(msgspec.Struct, frozen=True, kw_only=True):
    source: str
    kind: str  # store or archive
    store_id: str
    tree_size: int
    root: str
    rows: int
    payloads: int = 0  # the payloads its rows reference
    payloads_held: int = 0  # of those, the ones it holds (full: whose bytes re-hashed)


class Comparison(msgspec.Struct, frozen=True, kw_only=True):
    a: Side
    b: Side
    equal: bool
    tables: int
    runs: int
    report_rows: int
    differences: list[Difference]
    payloads: int = 0  # payloads compared: referenced by either side
    full: bool = False  # their bytes were re-hashed (else: present, with their size)


def compare(a: Source, b: Source, *, full: bool = False, rows_per_table: int = 20,
            scratch: os.PathLike[str] | str | None = None,
            progress: Progress | None = None) -> Comparison:
    """Compare two stores or archives; ``equal`` only when nothing at all differs.

    Each side becomes a private database (a store's snapshot, an archive's loaded dump) in
    a temporary directory under ``scratch``. Up to ``rows_per_table`` differing rows are
    listed per table, each by primary key with the columns that differ. The payloads are
    the evidence too: each side's referenced payloads are looked up where that side keeps
    them (present with their size; ``full``: their bytes re-hashed), and one referenced or
    held by one side only, or corrupt on one side only, is a difference. A payload that
    cannot be read raises ``ArtifactReadError``: no verdict is given without it.
    """
    with tempfile.TemporaryDirectory(prefix="evidence-compare-", dir=scratch) as tmp:
        paths = [Path(tmp) / "a.db", Path(tmp) / "b.db"]
        diffs: list[Difference] = []
        summaries = []
        for source, path in zip((a, b), paths, strict=True):
            summary, notes = _summarize(source, path, full, progress)
            summaries.append(summary)
            diffs += notes
        sa, sb = summaries
        diffs += _diff_summaries(sa, sb)
        changed = [t for t in sa["tables"] if t in sb["tables"]
                   and sa["tables"][t] != sb["tables"][t] and sa["columns"][t] == sb["columns"][t]]
        if changed:
            diffs += _row_diffs(paths, changed, sa["columns"], rows_per_table)
    return Comparison(a=sa["side"], b=sb["side"], equal=not diffs,
                      tables=len(set(sa["tables"]) | set(sb["tables"])),
                      runs=len({r for r, _ in sa["runs"]} | {r for r, _ in sb["runs"]}),
                      report_rows=sum(len(r) for r in sa["reports"].values()), differences=diffs,
                      payloads=len(set(sa["payloads"]) | set(sb["payloads"])), full=full)


def _summarize(source: Source, path: Path, full: bool, progress: Progress | None
               ) -> tuple[dict, list[Difference]]:
    payloads: PayloadSource
    notes: list[Difference] = []
    with contextlib.ExitStack() as stack:
        if isinstance(source, Store) or is_server_database(source) or not (
                Path(source) / MANIFEST).exists():
            backend, payloads = stack.enter_context(open_source(source))
            backend.copy_snapshot(path, progress=progress)
            summary = _summarize_copy(source, "store", apsw.Connection(str(path)), path,
                                      progress)
        else:
            assert not isinstance(source, Store)
            conn, notes = _load_archive(Path(source), path, progress)
            summary = _summarize_copy(source, "archive", conn, path, progress)
            held = archive_payloads(Path(source), read_manifest(Path(source)).format_version)
            stack.callback(held.close)
            payloads = held
        states = payload_states(summary.pop("refs"), payloads, full=full, progress=progress)
    side = msgspec.structs.replace(summary["side"], payloads=len(states), payloads_held=sum(
        state == HELD for state in states.values()))
    return {**summary, "side": side, "payloads": states}, notes


def _load_archive(archive: Path, path: Path, progress: Progress | None
                  ) -> tuple[apsw.Connection, list[Difference]]:
    """An archive's dump loaded into ``path``; a dump that does not match its manifest is a
    difference (it is compared as it is)."""
    notes: list[Difference] = []
    manifest = read_manifest(archive)
    if manifest.format != "sql":
        raise StoreError(f"{archive} is a {manifest.format} export; compare reads sql "
                         "archives", hint="export with --format sql")
    dump_file = archive / "dump.sql"
    if not dump_file.is_file():
        raise CorruptStoreError(f"{dump_file} is missing", path=str(dump_file))
    if not _file_matches(dump_file, manifest.files.get("dump.sql")):
        notes.append(Difference(what="archive", name=str(archive), key="dump.sql",
                                a="does not match its manifest (size or BLAKE3)"))
    return load_dump(dump_file, path, progress), notes


def _summarize_copy(source: Source, kind: str, conn: apsw.Connection, path: Path,
                    progress: Progress | None) -> dict:
    """What is compared of one side's private copy (``conn``, closed here)."""
    name = source.location if isinstance(source, Store) else label(source)
    with contextlib.closing(conn), map_sqlite_errors(path):
        per_run: dict[tuple[str, str], list] = {}
        schema, sections = dump(conn, Output(None), per_run=per_run, progress=progress)
        reports = {}
        for name, (sql, keys) in REPORTS.items():
            try:
                rows = conn.execute(sql).fetchall()
            except apsw.SQLError as exc:
                rows = [("(query failed)", str(exc))]
            reports[name] = {tuple(r[:keys]): tuple(r[keys:]) for r in rows}
        head = load_head(conn)
        meta = dict(conn.execute("SELECT key, value FROM store_meta"))
        columns = {t.name: (t.columns, t.order) for t in tables(conn)}
        refs = artifact_refs(conn)
    side = Side(source=name, kind=kind, store_id=meta.get("store_id", ""),
                tree_size=head.tree.size, root=head.tree.root().hex(),
                rows=sum(s.rows for s in sections.values()))
    return {"side": side, "schema": schema.blake3, "columns": columns, "reports": reports,
            "tables": {t: (s.rows, s.blake3) for t, s in sections.items()},
            "runs": {k: (n, h.hexdigest()) for k, (n, h) in per_run.items()},
            "refs": refs}


def _show(value: tuple[int, str] | None) -> str | None:
    return None if value is None else f"{value[0]} rows, blake3 {value[1][:16]}"


def _ordered(keys: set) -> list:
    return sorted(keys, key=lambda k: tuple((v is None, str(v)) for v in k))


def _diff_summaries(sa: dict, sb: dict) -> list[Difference]:
    diffs = []
    if sa["schema"] != sb["schema"]:
        diffs.append(Difference(what="schema", name="schema", a=sa["schema"][:16],
                                b=sb["schema"][:16]))
    for table in [*sa["tables"], *(t for t in sb["tables"] if t not in sa["tables"])]:
        ta, tb = sa["tables"].get(table), sb["tables"].get(table)
        if ta != tb:
            diffs.append(Difference(what="table", name=table, a=_show(ta), b=_show(tb)))
    for run, table in _ordered(set(sa["runs"]) | set(sb["runs"])):
        ra, rb = sa["runs"].get((run, table)), sb["runs"].get((run, table))
        if ra != rb:
            diffs.append(Difference(what="run", name=str(run), key=table, a=_show(ra),
                                    b=_show(rb)))
    for report in REPORTS:
        ra, rb = sa["reports"][report], sb["reports"][report]
        for key in _ordered(set(ra) | set(rb)):
            if ra.get(key) != rb.get(key):
                diffs.append(Difference(
                    what="report", name=report, key=", ".join(map(str, key)),
                    a=None if key not in ra else ", ".join(map(str, ra[key])),
                    b=None if key not in rb else ", ".join(map(str, rb[key]))))
    pa, pb = sa["payloads"], sb["payloads"]
    for ref in sorted(set(pa) | set(pb), key=lambda r: (r.namespace, r.digest, r.size)):
        if pa.get(ref) != pb.get(ref):
            diffs.append(Difference(what="payload", name=f"{ref.namespace}/{ref.digest}",
                                    a=pa.get(ref), b=pb.get(ref)))
    return diffs


def _row_diffs(paths: list[Path], changed: list[str], columns: dict,
               limit: int) -> list[Difference]:
    """Rows that differ, located by primary key, with the columns that differ."""
    diffs = []
    conn = apsw.Connection(str(paths[0]))
    with contextlib.closing(conn), map_sqlite_errors(paths[0]):
        conn.execute("ATTACH ? AS other", (str(paths[1]),))
        for table in changed:
            cols, order = columns[table]
            at = [cols.index(c) for c in order]
            select = ", ".join(ident(c) for c in cols)
            sides = []
            for one, two in (("main", "other"), ("other", "main")):
                query = (f"SELECT {select} FROM {one}.{ident(table)} EXCEPT "
                         f"SELECT {select} FROM {two}.{ident(table)}")
                total = conn.execute(f"SELECT count(*) FROM ({query})").fetchall()[0][0]
                rows = conn.execute(f"{query} ORDER BY {', '.join(ident(c) for c in order)} "
                                    f"LIMIT {limit}").fetchall()
                sides.append((total, {tuple(r[i] for i in at): r for r in rows}))
            (count_a, rows_a), (count_b, rows_b) = sides
            for key in _ordered(set(rows_a) | set(rows_b)):
                ra, rb = rows_a.get(key), rows_b.get(key)
                where = ", ".join(f"{c}={_short(v)}" for c, v in zip(order, key, strict=True))
                if ra is None or rb is None:
                    diffs.append(Difference(what="row", name=table, key=where,
                                            a=None if ra is None else "present",
                                            b=None if rb is None else "present"))
                    continue
                changed_cols = [i for i, (x, y) in enumerate(zip(ra, rb, strict=True))
                                if sql_literal(x) != sql_literal(y)]
                diffs.append(Difference(
                    what="row", name=table, key=where,
                    a=", ".join(f"{cols[i]}={_short(ra[i])}" for i in changed_cols),
                    b=", ".join(f"{cols[i]}={_short(rb[i])}" for i in changed_cols)))
            if max(count_a, count_b) > limit:
                diffs.append(Difference(what="row", name=table, key="(more)",
                                        a=f"{count_a} rows only here", b=f"{count_b} rows "
                                        f"only here; the first {limit} are listed"))
    return diffs


def _short(value: object) -> str:
    text = sql_literal(value)
    return text if len(text) <= 60 else text[:57] + "..."
