"""Verify a store, and reclaim orphaned artifact files without racing the writer.

``verify(store)`` answers "is anything here not as the writer left it?" and says where.
In one read snapshot of the database it runs, in order:

  1. the schema against the migrations (a dropped append-only trigger is a finding);
  2. ``PRAGMA quick_check`` (``full=True``: ``integrity_check``) and ``foreign_key_check``;
  3. the log: every leaf, Merkle root and hash-chain link recomputed (``check_log``);
  4. every ledger entry decoded and checked against the rows it produced
     (``check_rows``): a row edited or deleted with the triggers dropped is named here;
  5. ``url_current`` rebuilt from ``fetch_attempt`` (max sequence per run + URL);
  6. quarantined payloads against their hashes.

With ``full``, every attempt captured from the wire has its content derived again from its
stored head and body (``_model.http1.derive_content``; an HTTP/2 attempt's head and body
are first derived again from its stored frames, ``_model.wire``, and compared with them)
and compared with the content it records
(its ``content`` artifact, or its body), and the codings it says were removed.

Then, outside that snapshot (artifact rows are append-only, so paging them by id sees the
same rows), every referenced artifact is checked on disk (present with its size; ``full``:
re-hashed with BLAKE3), and files under ``artifacts/`` that nothing references are listed
as orphans. Orphans are *notices*: a crash between storing a payload and committing its
message leaves one, harmlessly (design rule 18). Everything else is an *error*.

With ``quick``, the quick tier (``verify_quick``): steps 1-3 and 6, each table's rows
counted against the ledger instead of compared with it, and the payloads checked by pack;
no orphan listing. The report's ``mode`` says which tier ran, ``not_checked`` what it left.

The checks live in one module per concern, each a few hundred lines: ``verify_sqlite`` (the
schema, SQLite's own check, foreign keys), ``verify_rows`` (every row against its ledger
entry), ``verify_state`` (frontier and host_state replayed), ``verify_artifacts`` (payloads
on disk, contents against the wire, orphans and their reclaim), ``verify_quick`` (the quick
tier's counts and payloads by pack); ``verify_findings`` holds what they report. This
module runs them in order over one snapshot and builds the report.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import msgspec

from .._errors import ArtifactError, StoreError
from .._model.merkle import EMPTY_ROOT
from .._model.messages import now_text
from .._store import quarantine as _quarantine
from .._store.db import DB_NAME, Store
from .._store.log import Head, check_log, check_log_bulk, check_times, identity_bound
from .._store.resync import SYNC_MARKER, read_marker
from .._store.sqlite import load_migrations
from .checkpoints import CheckpointMatch, SignedCheckpoint, match_checkpoint
from .verify_artifacts import (
    ReclaimHooks,
    ReclaimReport,
    age_text,
    check_artifacts,
    check_contents,
    orphan_files,
    reclaim_orphans,
)
from .verify_findings import NOTICE_KINDS, Finding, Findings, Location
from .verify_quick import NOT_CHECKED, LedgerShape, check_counts, check_payloads
from .verify_rows import check_rows
from .verify_sqlite import check_foreign_keys, check_schema, check_sqlite
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
LEGACY_CLOSED_AT = 10  # the migration that closed the pre-006 quarantine layout


class VerifyReport(msgspec.Struct, kw_only=True):
    path: str
    store_id: str
    full: bool
    mode: str = "default"  # "quick", "default" or "full": which tier ran
    checked_at: str
    tree_size: int
    root: str  # hex, recomputed from the ledger
    checks: dict[str, int]  # what was checked: name -> how many items
    findings: list[Finding]
    omitted: dict[str, int]  # findings left out per kind, beyond max_findings_per_kind
    orphan_bytes: int = 0  # the payloads no row references, in all (checks["orphans"] of them)
    checkpoint: str | None = None  # with a checkpoint: what was compared with it
    not_checked: list[str] = msgspec.field(default_factory=list)  # quick: what it left out

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


def verify(store: Store, *, full: bool = False, quick: bool = False,
           max_findings_per_kind: int = 1000,
           checkpoint: SignedCheckpoint | None = None) -> VerifyReport:
    """Check the database, the log, the rows against the ledger, and the artifact files.

    ``checkpoint`` (one whose signature the caller checked, ``proofs.open_checkpoint``):
    also whether the store still holds what it signed (``proofs.match_checkpoint``).
    ``quick``: the quick tier (``verify_quick``): the schema, ``quick_check``, the log,
    each table's rows counted against the ledger and the payloads by pack; what it leaves
    out is in the report's ``not_checked``."""
    if full and quick:
        raise ValueError("full and quick exclude each other")
    if quick:
        return _verify_quick(store, max_findings_per_kind, checkpoint)
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
            step("schema_objects", check_schema, conn, found, store.schema_version)
            step("sqlite_" + ("integrity_check" if full else "quick_check"), check_sqlite,
                 conn, found, full)
        else:  # the server's own objects; the copy's schema is the migrations' by making
            step("schema_objects", server, found, store.schema_version)
        step("foreign_key_check", check_foreign_keys, conn, found)
        step("migration_rows", _check_migrations, conn, found, store.schema_version)
        heads: dict[int, Head] = {}
        size, root = step("log_entries", _check_log, conn, found, heads) or (0, EMPTY_ROOT)
        step("commit_times", _check_times, conn, found)
        matched = None
        if checkpoint is not None:
            matched = step("checkpoint", _check_checkpoint, conn, found, checkpoint, heads)
        state = _working_state(conn, store.schema_version)
        step("ledger_entries", check_rows, conn, found, state)
        if state is not None:
            step("working_state_rows", _compare_state, state, found)
        step("projection_rows", _check_projection, conn, found)
        step("interned_rows", _check_interned, conn, found)
        step("quarantined", _quarantine.check_records, conn, found.add)
        step("legacy_quarantine", _check_legacy_quarantine, conn, found,
             store.schema_version)
        max_artifact = step(None, _max_artifact_id, conn) or 0
        if full:
            step("artifacts_rehashed", check_artifacts, store, conn, found, max_artifact, True)
        else:  # present with its size: the quick tier's check, by the packs' listing
            step("artifacts", check_payloads, store, conn, found, max_artifact)
        if full:
            step("contents_derived", check_contents, store, conn, found)
        orphans = step(None, orphan_files, store, conn)  # None: the listing was aborted
        if orphans is not None:
            checks["orphans"] = len(orphans)
    for ref, age in orphans or []:
        found.add("orphan", f"{ref.namespace}/{ref.digest} ({ref.size} bytes, "
                  f"{age_text(age)} old) is referenced by no row",
                  path=store.artifacts.location(ref), digest=ref.digest)
    return VerifyReport(
        path=store.location, store_id=store_id, full=full, mode="full" if full else "default",
        checked_at=now_text(), tree_size=size, root=root.hex(), checks=checks,
        findings=[Finding(kind=k, severity=s, location=loc, message=m)
                  for k, s, loc, m in found.items],
        omitted=dict(found.omitted), orphan_bytes=sum(ref.size for ref, _ in orphans or []),
        checkpoint=None if matched is None else matched.statement)


def _verify_quick(store: Store, max_findings_per_kind: int,
                  checkpoint: SignedCheckpoint | None) -> VerifyReport:
    """The quick tier: steps 1-3 and the quarantine checks as the default runs them, the
    rows counted and the payloads checked by pack (``verify_quick``), in one snapshot."""
    found = Findings(max_findings_per_kind)
    checks: dict[str, int] = {}
    step = _Steps(found, checks)
    with _snapshot(store) as (conn, server):
        store_id = step(None, _meta, conn, "store_id") or ""
        if server is None:
            step("schema_objects", check_schema, conn, found, store.schema_version)
            step("sqlite_quick_check", check_sqlite, conn, found, False)
        else:
            step("schema_objects", server, found, store.schema_version)
        step("migration_rows", _check_migrations, conn, found, store.schema_version)
        heads: dict[int, Head] = {}
        shape = LedgerShape()
        logged = step("log_entries", _check_log_quick, conn, found, heads, shape)
        size, root = logged or (0, EMPTY_ROOT)
        step("commit_times", _check_times, conn, found)
        matched = None
        if checkpoint is not None:
            matched = step("checkpoint", _check_checkpoint, conn, found, checkpoint, heads)
        if logged is not None:  # the ledger was read whole: its figures are complete
            step("row_counts", check_counts, conn, found, shape)
        step("quarantined", _quarantine.check_records, conn, found.add)
        step("legacy_quarantine", _check_legacy_quarantine, conn, found,
             store.schema_version)
        max_artifact = step(None, _max_artifact_id, conn) or 0
        step("artifacts", check_payloads, store, conn, found, max_artifact)
    return VerifyReport(
        path=store.location, store_id=store_id, full=False, mode="quick",
        checked_at=now_text(), tree_size=size, root=root.hex(), checks=checks,
        findings=[Finding(kind=k, severity=s, location=loc, message=m)
                  for k, s, loc, m in found.items],
        omitted=dict(found.omitted), not_checked=list(NOT_CHECKED),
        checkpoint=None if matched is None else matched.statement)


def _check_log_quick(conn: apsw.Connection, found: Findings, heads: dict[int, Head],
                     shape: LedgerShape) -> tuple[int, bytes]:
    """``_check_log`` in one pass over the ledger that also feeds ``shape``; when anything
    disagrees, ``_check_log`` itself says what and where."""
    agreed = check_log_bulk(conn, heads, shape)
    if agreed is None:
        heads.clear()
        return _check_log(conn, found, heads)
    if identity_bound(conn) is False:
        _unbound(found)
    return agreed


# Verify reads every page (quick_check, the ledger, the rows): through a memory map,
# SQLite reads each in place, where a read() per page copied it out of the page cache,
# about half of quick_check's CPU on a 400 MiB store (docs/archives.md has the figures).
# As much as the library allows (SQLITE_MAX_MMAP_SIZE caps it). Safe because a store's
# database file never shrinks under a map: nothing here runs VACUUM, and a checkpoint
# truncates only the WAL. The connection is verify's own, closed with its snapshot. A page
# the disk cannot read is then a SIGBUS that ends the process, where a read() gave an I/O
# error (a check_aborted finding): the report is lost, never turned into a pass.
_MAPPED = "PRAGMA mmap_size = 1099511627776"


@contextlib.contextmanager
def _snapshot(store: Store) -> Iterator[tuple[Any, Callable[..., int] | None]]:
    """The connection every check reads, and for a server database, its schema check.

    A SQLite store is read in one snapshot of its own file. A PostgreSQL store is read in
    a private SQLite copy of one REPEATABLE READ snapshot (``copy_snapshot``, what export
    reads): every row check, the log, the replayed state and the artifacts then run exactly
    as they do on SQLite, over exactly what the server held; the objects that only the
    server has (tables, triggers, functions: the append-only guards) are compared with
    what schema/postgresql creates (``pgschema.check_schema``)."""
    if store.path is not None:
        with store.snapshot() as conn:
            conn.execute(_MAPPED)
            yield conn, None
        return
    from .._store.pgschema import check_schema

    with tempfile.TemporaryDirectory(prefix="evidence-verify-") as scratch:
        copy = Path(scratch) / DB_NAME
        with store.errors():
            store.backend.copy_snapshot(copy)
        conn = apsw.Connection(str(copy), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            conn.execute(_MAPPED)
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
        # type, which only a damaged page or a hand-edited row gives; ArtifactError: a
        # payload's file or pack unreadable where the check lists them (the orphans of a
        # pack cut short after the store opened it).
        except (apsw.Error, StoreError, ArtifactError, TypeError, ValueError) as exc:
            label = (name or fn.__name__.strip("_")).replace("_", " ")
            label += "" if label.endswith("check") else " check"
            self.found.add("check_aborted", f"the {label} could not finish: "
                           f"{type(exc).__name__}: {exc}")
            return None
        if name is not None:  # how many items it checked: a count, or one thing
            count = result[0] if isinstance(result, tuple) else result
            self.checks[name] = count if isinstance(count, int) else 1
        return result


def _check_log(conn: apsw.Connection, found: Findings,
               heads: dict[int, Head]) -> tuple[int, bytes]:
    size, root, log_findings = check_log(conn, heads)
    for lf in log_findings:
        found.add(f"log_{lf.what}", lf.detail, table="commit_log" if lf.log_index is None
                  else "ingest_ledger", log_index=lf.log_index, batch_seq=lf.batch_seq)
    if identity_bound(conn) is False:
        _unbound(found)
    return size, root


def _unbound(found: Findings) -> None:
    found.add("identity_unbound", "the hash chain starts from zeros, not from the store's "
              "identity (the store's first batch predates issue 12): an edit of "
              "store_meta's store_id would not show", table="store_meta", row_id="store_id")


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


