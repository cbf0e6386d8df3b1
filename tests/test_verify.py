"""verify: tampering is found and located; orphans are listed and reclaimed without races."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import apsw
import pytest

from evidence import ArtifactRef, Store
from evidence._audit.verify import ReclaimHooks, reclaim_orphans, verify
from evidence._cli.common import parse_duration

from .conftest import (
    LAYOUTS,
    Factory,
    backdate_payload,
    flip_payload_byte,
    lose_payload,
    payload_place,
    run_cli,
    submit_all,
)

DAY = 86400


def tamper(store: Store, *statements: str) -> None:
    for sql in statements:
        store.connection.execute(sql)


def one(store: Store, sql: str) -> tuple:
    return store.connection.execute(sql).fetchall()[0]


def kinds(report) -> set[str]:
    return {f.kind for f in report.findings}


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


# --- a clean store -------------------------------------------------------------------

@pytest.mark.parametrize("full", [False, True])
def test_a_store_written_by_the_writer_verifies_clean(populated_store: Store, full: bool) -> None:
    report = verify(populated_store, full=full)
    assert report.findings == [] and report.ok
    assert report.checks["ledger_entries"] == report.tree_size == 6
    assert report.checks["artifacts_rehashed" if full else "artifacts"] == 1
    assert report.checks["sqlite_integrity_check" if full else "sqlite_quick_check"] == 1
    assert report.checks["quarantined"] == 1 and report.checks["projection_rows"] == 1


def test_cli_verify_exits_zero_and_says_ok(populated_store: Store, capsys) -> None:
    assert run_cli("verify", populated_store.path) == 0
    out = capsys.readouterr().out
    assert "OK: no errors" in out and "checked  schema objects" in out


# --- tampering, found and located ----------------------------------------------------

ROW_EDITS = [
    # (trigger to drop, the edit, table, field named in the finding)
    ("fetch_attempt_no_update", "UPDATE fetch_attempt SET http_status = 500",
     "fetch_attempt", "http_status"),
    ("fetch_attempt_no_update", "UPDATE fetch_attempt SET started_at = '2001-01-01T00:00:00Z'",
     "fetch_attempt", "started_at"),
    # the attempt's message has no connection: its columns are all NULL, compared as such
    ("fetch_attempt_no_update", "UPDATE fetch_attempt SET remote_address = '192.0.2.1'",
     "fetch_attempt", "remote_address"),
    ("fetch_attempt_no_update", "PRAGMA foreign_keys = OFF; UPDATE fetch_attempt SET "
     "request_headers_id = 999999", "fetch_attempt", "request_headers"),
    ("discovery_edge_no_update", "UPDATE discovery_edge SET edge_kind = 'embed' "
     "WHERE position = 1", "discovery_edge", "edge_kind"),
    ("discovery_edge_no_update", "UPDATE discovery_edge SET rel = 'nofollow' "
     "WHERE position = 1", "discovery_edge", "rel"),
    ("discovery_edge_no_update", "UPDATE discovery_edge SET target_url_id = (SELECT "
     "min(url_id) FROM url_identity) WHERE target_url_id != (SELECT min(url_id) FROM "
     "url_identity)", "discovery_edge", "target_fetch_key"),
    ("discovery_edge_no_update", f"INSERT INTO artifact (namespace, digest, size) VALUES "
     f"('body', '{'0' * 64}', 1); UPDATE discovery_edge SET source_artifact_id = "
     "(SELECT max(artifact_id) FROM artifact)", "discovery_edge", "source_artifact"),
    ("rule_evaluation_no_update", "UPDATE rule_evaluation SET verdict = 'fail'",
     "rule_evaluation", "verdict"),
    ("crawl_run_end_once", "UPDATE crawl_run SET outcome = 'failed'", "crawl_run", "outcome"),
    ("crawl_session_end_once", "UPDATE crawl_session SET config = '{\"scope\":1}'",
     "crawl_session", "config"),
    ("url_identity_no_update", "UPDATE url_identity SET fetch_key = 'http://evil.example/' "
     "WHERE fetch_key = 'http://example.com/'", "fetch_attempt", "fetch_key"),
    ("artifact_no_update", "UPDATE artifact SET size = 1", "fetch_attempt", "body"),
]


@pytest.mark.parametrize(("trigger", "edit", "table", "field"), ROW_EDITS,
                         ids=[e[1].split(" SET ")[1][:30] for e in ROW_EDITS])
def test_a_row_changed_with_triggers_dropped_is_found_and_located(
        populated_store: Store, trigger: str, edit: str, table: str, field: str) -> None:
    tamper(populated_store, f"DROP TRIGGER {trigger}", edit)
    report = verify(populated_store)
    assert not report.ok
    [schema] = [f for f in report.findings if f.kind == "schema"]
    assert f"trigger {trigger} is missing" in schema.message
    mismatches = [f for f in report.findings if f.kind == "row_mismatch"]
    assert any(f.location.table == table and f": {field} is " in f.message
               for f in mismatches), mismatches
    for finding in mismatches:  # every mismatch names its row and the ledger entry
        assert finding.location.row_id is not None and finding.location.log_index is not None


def test_the_edited_attempt_is_named_by_row_and_log_index(populated_store: Store) -> None:
    seq, index = one(populated_store, "SELECT attempt_seq, log_index FROM fetch_attempt")
    tamper(populated_store, "DROP TRIGGER fetch_attempt_no_update",
           "UPDATE fetch_attempt SET content_type = 'text/evil'")
    [finding] = [f for f in verify(populated_store).findings if f.kind == "row_mismatch"]
    assert (finding.location.table, finding.location.row_id, finding.location.log_index) == (
        "fetch_attempt", seq, index)
    assert "content_type is 'text/evil', its ledger entry" in finding.message


@pytest.mark.parametrize("table", ["rule_evaluation", "discovery_edge"])
def test_a_deleted_row_is_found_at_its_ledger_entry(populated_store: Store, table: str) -> None:
    index = one(populated_store, f"SELECT min(log_index) FROM {table}")[0]
    tamper(populated_store, f"DROP TRIGGER {table}_no_delete",
           f"DELETE FROM {table} WHERE rowid = (SELECT max(rowid) FROM {table})")
    report = verify(populated_store)
    [missing] = [f for f in report.findings if f.kind == "row_missing"]
    assert (missing.location.table, missing.location.log_index) == (table, index)


def test_a_deleted_attempt_is_found_by_ledger_and_foreign_keys(populated_store: Store) -> None:
    index = one(populated_store, "SELECT log_index FROM fetch_attempt")[0]
    tamper(populated_store, "PRAGMA foreign_keys = OFF", "DROP TRIGGER fetch_attempt_no_delete",
           "DELETE FROM fetch_attempt")
    report = verify(populated_store)
    assert {"row_missing", "foreign_key", "projection_extra"} <= kinds(report)
    [missing] = [f for f in report.findings if f.kind == "row_missing"]
    assert (missing.location.table, missing.location.log_index) == ("fetch_attempt", index)
    dangling = {f.location.table for f in report.findings if f.kind == "foreign_key"}
    assert dangling == {"discovery_edge", "rule_evaluation", "url_current"}



def test_an_edge_moved_to_a_later_entry_is_found_at_both_entries(store: Store,
                                                                  make: Factory) -> None:
    """Edges are read in edge_id order when that is log order (no sort), else sorted by
    log index: an edge whose log index an edit moved to a later discovery is missing at its
    own entry and not among the references of the later one, as the sorted merge says."""
    bodies = [make.body(f"<p>{i}</p>".encode()) for i in range(2)]
    attempts = [make.attempt(f"http://example.com/{i}", body=b) for i, b in enumerate(bodies)]
    submit_all(store, [make.session(), make.run(), *attempts,
                       make.discovery(attempts[0], bodies[0], ["http://example.com/a",
                                                               "http://example.com/c"]),
                       make.discovery(attempts[1], bodies[1], ["http://example.com/b"])])
    (first, later), (edge,) = (
        [i for (i,) in store.connection.execute(
            "SELECT log_index FROM ingest_ledger WHERE kind = 'discovery' ORDER BY 1")],
        store.connection.execute("SELECT min(edge_id) FROM discovery_edge").fetchall())
    tamper(store, "DROP TRIGGER discovery_edge_no_update",
           f"UPDATE discovery_edge SET log_index = {later} WHERE edge_id = {edge[0]}")
    found = [f for f in verify(store).findings if f.kind.startswith("row_")]
    assert sorted((f.kind, f.location.table, f.location.log_index) for f in found) == [
        ("row_missing", "discovery_edge", first), ("row_unlogged", "discovery_edge", later)]
    assert "is not among the references of its ledger entry" in str(found)


def test_a_row_inserted_without_a_message_is_unlogged(populated_store: Store) -> None:
    edge_index = one(populated_store, "SELECT log_index FROM discovery_edge LIMIT 1")[0]
    tamper(populated_store, "INSERT INTO rule_evaluation (run_id, url_id, rule_id, "
           "rule_version, input_hash, verdict, evaluated_at, details, log_index) "
           f"SELECT 'r1', url_id, 'forged', '1', 'x', 'pass', 'now', '{{}}', {edge_index} "
           "FROM url_identity LIMIT 1")
    [finding] = verify(populated_store).findings
    assert finding.kind == "row_unlogged" and finding.location.table == "rule_evaluation"
    assert f"claims log index {edge_index}, which is a discovery entry" in finding.message


@pytest.mark.parametrize(("edit", "kind"), [
    ("UPDATE commit_log SET committed_at = '2001-01-01T00:00:00.000000Z' WHERE batch_seq = 2",
     "log_chain"),
    ("UPDATE commit_log SET root = zeroblob(32) WHERE batch_seq = 2", "log_root"),
    ("UPDATE commit_log SET tree_size = 9 WHERE batch_seq = 2", "log_root"),
])
def test_an_edited_commit_log_row_is_found_at_its_batch(populated_store: Store, edit: str,
                                                        kind: str) -> None:
    tamper(populated_store, "DROP TRIGGER commit_log_no_update", edit)
    report = verify(populated_store)
    located = [f for f in report.findings if f.kind == kind]
    assert located and located[0].location.batch_seq == 2, report.findings


def test_an_edited_ledger_payload_breaks_its_leaf(populated_store: Store) -> None:
    tamper(populated_store, "DROP TRIGGER ingest_ledger_no_update",
           "UPDATE ingest_ledger SET payload = CAST(payload || x'00' AS BLOB) WHERE log_index = 3")
    report = verify(populated_store)
    leaf = [f for f in report.findings if f.kind == "log_leaf"]
    assert [f.location.log_index for f in leaf] == [3]
    assert any(f.kind == "ledger_entry" and f.location.log_index == 3 for f in report.findings)


def test_a_projection_moved_forward_is_found(populated_store: Store) -> None:
    # url_current's own trigger allows moving forward: only the rebuild can tell.
    tamper(populated_store, "UPDATE url_current SET sequence = 7")
    [finding] = verify(populated_store).findings
    assert finding.kind == "projection_stale" and finding.location.table == "url_current"
    assert "says sequence 7" in finding.message and "the attempts say sequence 0" in finding.message


def test_a_deleted_projection_row_is_found(populated_store: Store) -> None:
    tamper(populated_store, "DROP TRIGGER url_current_no_delete", "DELETE FROM url_current")
    assert {f.kind for f in verify(populated_store).findings} == {"projection_missing",
                                                                 "schema"}


def test_a_dropped_table_is_reported_not_raised(populated_store: Store) -> None:
    tamper(populated_store, "DROP TABLE quarantine")
    report = verify(populated_store)
    assert "table quarantine is missing (the migrations create it)" in {
        f.message for f in report.findings if f.kind == "schema"}
    aborted = sorted(f.message.split(" could not")[0] for f in report.findings
                     if f.kind == "check_aborted")
    assert aborted == ["the legacy quarantine check", "the orphan files check",
                       "the quarantined check"]
    assert report.checks["ledger_entries"] == 6  # the other checks still ran


@pytest.mark.parametrize("artifact_layout", LAYOUTS)
def test_a_flipped_byte_in_an_artifact_is_found_by_full_only(populated_store: Store) -> None:
    namespace, digest, size = one(populated_store, "SELECT namespace, digest, size FROM artifact")
    ref = ArtifactRef(namespace, digest, size)
    flip_payload_byte(populated_store, ref)
    quick = verify(populated_store)
    assert quick.ok and kinds(quick) == {"artifact_writable"}  # a notice, not a detection
    full = verify(populated_store, full=True)
    [corrupt] = full.errors
    assert corrupt.kind == "artifact_corrupt"
    assert (corrupt.location.path, corrupt.location.digest) == (
        populated_store.artifacts.location(ref), digest)
    assert f"expected blake3 {digest}" in corrupt.message


@pytest.mark.parametrize("artifact_layout", LAYOUTS)
def test_every_payload_of_a_writable_file_is_named_though_its_mode_is_read_once(
        populated_store: Store, make: Factory, artifact_layout: str) -> None:
    """A pack is looked at once for all of its payloads (``writable_each``): each payload
    in a pack made writable is still a notice of its own, with its own place."""
    submit_all(populated_store, [make.attempt(f"http://example.com/{i}", body=make.body(
        f"page {i}".encode())) for i in range(3)])
    refs = [ArtifactRef(*row) for row in populated_store.connection.execute(
        "SELECT namespace, digest, size FROM artifact")]
    path, _ = payload_place(populated_store, refs[0])
    path.chmod(0o644)
    held = {ref.digest for ref in refs if payload_place(populated_store, ref)[0] == path}
    assert len(held) >= (2 if artifact_layout == "packs" else 1)
    report = verify(populated_store)
    writable = [f for f in report.findings if f.kind == "artifact_writable"]
    assert report.ok and {f.location.digest for f in writable} == held
    assert len(writable) == len(held)
    assert {f.location.path for f in writable} == {
        populated_store.artifacts.location(ref) for ref in refs if ref.digest in held}


@pytest.mark.parametrize("artifact_layout", LAYOUTS)
def test_a_missing_artifact_file_is_found_by_quick(populated_store: Store) -> None:
    namespace, digest, size = one(populated_store, "SELECT namespace, digest, size FROM artifact")
    ref = ArtifactRef(namespace, digest, size)
    lose_payload(populated_store, ref)
    [missing] = verify(populated_store).findings
    assert missing.kind == "artifact_missing"
    assert missing.location.path == populated_store.artifacts.location(ref)


def test_cli_verify_names_each_finding_and_exits_one(populated_store: Store, capsys) -> None:
    tamper(populated_store, "DROP TRIGGER rule_evaluation_no_update",
           "UPDATE rule_evaluation SET verdict = 'fail'",
           "DROP TRIGGER commit_log_no_update",
           "UPDATE commit_log SET committed_at = 'x' WHERE batch_seq = 3")
    assert run_cli("verify", populated_store.path) == 1
    out = capsys.readouterr().out
    assert "error  row_mismatch  [rule_evaluation row 1, log index 4]" in out
    assert "verdict is 'fail', its ledger entry (log index 4) says 'pass'" in out
    assert "error  log_chain  [commit_log, batch 3]" in out
    # two dropped triggers, the row, the chain, the batch's leaves no longer received at
    # its commit time, and a commit time that is not a time
    assert "FAILED: 6 error(s)" in out
    assert run_cli("verify", populated_store.path, "--json") == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False
    assert {f["kind"] for f in data["findings"]} == {"schema", "row_mismatch", "log_chain",
                                                     "log_batch", "log_time"}


def test_findings_beyond_the_limit_are_counted_not_listed(store: Store, make: Factory) -> None:
    attempts = [make.attempt(f"http://example.com/{i}", body=make.body()) for i in range(5)]
    submit_all(store, [make.session(), make.run(), *attempts])
    tamper(store, "DROP TRIGGER fetch_attempt_no_update", "UPDATE fetch_attempt SET error = 'x'")
    report = verify(store, max_findings_per_kind=2)
    assert len([f for f in report.findings if f.kind == "row_mismatch"]) == 2
    assert report.omitted == {"row_mismatch": 3}


# --- orphans -------------------------------------------------------------------------

@pytest.mark.parametrize("artifact_layout", LAYOUTS)
def test_orphans_are_listed_as_notices_not_errors(populated_store: Store, capsys) -> None:
    ref = populated_store.artifacts.put("body", b"fetched, then the crawler crashed")
    report = verify(populated_store)
    assert report.ok
    [orphan] = report.notices
    assert orphan.kind == "orphan" and orphan.location.digest == ref.digest
    assert orphan.location.path == populated_store.artifacts.location(ref)
    assert run_cli("verify", populated_store.path) == 0
    assert run_cli("verify", populated_store.path, "--strict") == 1
    assert "notice orphan" in capsys.readouterr().out


def test_many_orphans_are_one_line_with_the_command_that_reclaims_them(
        populated_store: Store, capsys) -> None:
    refs = [populated_store.artifacts.put("body", b"orphan %d" % i) for i in range(5)]
    assert run_cli("verify", populated_store.path) == 0
    out = capsys.readouterr().out
    orphan_lines = [line for line in out.splitlines()
                    if "orphan" in line and not line.startswith(("store ", "checked "))]
    assert orphan_lines == [
        f"notice orphan  5 payload(s), {sum(r.size for r in refs)} B, stored but referenced "
        "by no row (a crash between storing and committing leaves them; --json lists each)",
        f"       reclaim those older than a day: evidence verify {populated_store.path} "
        "--reclaim-orphans"]
    assert not any(r.digest in out for r in refs), "no path per orphan in the text report"
    assert out.rstrip().endswith("OK: no errors (5 notice(s))")


def test_artifacts_of_quarantined_messages_are_not_orphans(store: Store, make: Factory) -> None:
    body = make.body(b"refused: its run was never started")
    acks = submit_all(store, [make.session(), make.attempt(run_id="nope", body=body)])
    assert acks[1].status == "rejected"
    report = verify(store)
    assert report.findings == []
    assert reclaim_orphans(store, 0).removed == []
    assert store.artifacts.exists(body)


@pytest.mark.parametrize("artifact_layout", LAYOUTS)
def test_reclaim_deletes_only_orphans_older_than_the_grace(populated_store: Store) -> None:
    old = populated_store.artifacts.put("body", b"orphaned two days ago")
    young = populated_store.artifacts.put("body", b"orphaned just now")
    referenced = ArtifactRef(*one(populated_store, "SELECT namespace, digest, size FROM artifact"))
    backdate_payload(populated_store, old, 2 * DAY)
    backdate_payload(populated_store, referenced, 30 * DAY)
    artifacts = populated_store.artifacts
    where = artifacts.location(old)
    report = reclaim_orphans(populated_store, DAY)
    assert report.removed == [where]
    assert report.bytes_freed == old.size and report.kept_young == 1
    assert not artifacts.exists(old) and artifacts.exists(young)
    assert artifacts.exists(referenced)
    assert verify(populated_store, full=True).findings[0].location.digest == young.digest


@pytest.mark.parametrize("artifact_layout", LAYOUTS)
def test_a_file_referenced_before_its_deletion_is_kept(store: Store, make: Factory) -> None:
    submit_all(store, [make.session(), make.run()])
    body = make.body(b"orphaned, then re-fetched with the same bytes")
    backdate_payload(store, body, 2 * DAY)  # put() of equal bytes keeps the old copy

    def commit_a_reference(ref: ArtifactRef) -> None:
        submit_all(store, [make.attempt(body=ref)])  # the crawler's message commits now

    report = reclaim_orphans(store, DAY, hooks=ReclaimHooks(before_lock=commit_a_reference))
    assert report.removed == [] and report.kept_referenced == 1
    assert store.artifacts.exists(body)
    assert verify(store, full=True).findings == []


@pytest.mark.parametrize("artifact_layout", LAYOUTS)
def test_reclaim_holds_the_write_lock_while_it_deletes(populated_store: Store) -> None:
    orphan = populated_store.artifacts.put("body", b"old orphan")
    backdate_payload(populated_store, orphan, 2 * DAY)
    blocked = []

    def try_to_commit(ref: ArtifactRef) -> None:
        other = apsw.Connection(str(populated_store.db_path))
        try:
            other.execute("BEGIN IMMEDIATE")
        except apsw.BusyError:
            blocked.append(ref)
        finally:
            other.close()

    report = reclaim_orphans(populated_store, DAY, hooks=ReclaimHooks(while_locked=try_to_commit))
    assert blocked == [orphan] and len(report.removed) == 1


@pytest.mark.parametrize("artifact_layout", LAYOUTS)
def test_a_message_whose_artifact_was_reclaimed_is_refused_whole(store: Store,
                                                                 make: Factory) -> None:
    # The other order of the race: the removal wins, and the writer's check refuses the
    # message (packs: the writer looks at the pack file, so a pack compacted by another
    # process is seen).
    submit_all(store, [make.session(), make.run()])
    body = make.body(b"old orphan about to be re-referenced")
    backdate_payload(store, body, 2 * DAY)
    assert len(reclaim_orphans(store, DAY).removed) == 1
    [ack] = submit_all(store, [make.attempt(body=body)])
    assert ack.status == "rejected" and "not in the store" in ack.reason
    assert verify(store).findings == []  # no row names a missing file


@pytest.mark.parametrize("artifact_layout", LAYOUTS)
def test_cli_reclaims_only_a_store_without_errors(populated_store: Store, capsys) -> None:
    orphan = populated_store.artifacts.put("body", b"old orphan")
    backdate_payload(populated_store, orphan, 2 * DAY)
    where = populated_store.artifacts.location(orphan)
    populated_store.artifacts.close()  # another process (the CLI) reclaims
    tamper(populated_store, "DROP TRIGGER rule_evaluation_no_update",
           "UPDATE rule_evaluation SET verdict = 'fail'")
    assert run_cli("verify", populated_store.path, "--reclaim-orphans", "--grace", "1d") == 1
    assert populated_store.artifacts.exists(orphan)
    assert "not reclaiming" in capsys.readouterr().err
    tamper(populated_store, "UPDATE rule_evaluation SET verdict = 'pass'",
           "CREATE TRIGGER rule_evaluation_no_update BEFORE UPDATE ON rule_evaluation\n"
           "BEGIN SELECT RAISE(ABORT, 'rule_evaluation is append-only'); END")
    assert run_cli("verify", populated_store.path, "--reclaim-orphans", "--grace", "1d",
                   "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["reclaimed"]["removed"] == [where]
    assert not Store.open(populated_store.path, read_only=True).artifacts.exists(orphan)


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("30m", 1800),
                                               ("24h", DAY), ("1.5d", 1.5 * DAY)])
def test_grace_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_a_bad_grace_is_refused() -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration("a day")


# --- a damaged database ----------------------------------------------------------------

def damage(store: Store, name: str) -> None:
    """Close the store (its WAL folded into the file), then overwrite the cell pointers of
    the b-tree page of table or index ``name`` (``page 1``: the schema's)."""
    root = 1 if name == "page 1" else one(
        store, f"SELECT rootpage FROM sqlite_schema WHERE name = '{name}'")[0]
    page_size = one(store, "PRAGMA page_size")[0]
    store.close()
    assert not Path(f"{store.db_path}-wal").exists(), "checkpointed at close"
    with open(store.db_path, "r+b") as handle:
        handle.seek((root - 1) * page_size + (100 if root == 1 else 0) + 8)
        handle.write(b"\xff" * 200)


@pytest.mark.parametrize(("name", "kind", "table"), [
    ("fetch_attempt_by_url", "index", "fetch_attempt"),
    ("discovery_edge", "table", "discovery_edge"),
    ("commit_log", "table", "commit_log"),
])
@pytest.mark.parametrize("full", [False, True])
def test_verify_says_which_table_or_index_is_damaged_and_exits_one(
        populated_store: Store, name: str, kind: str, table: str, full: bool, capsys) -> None:
    # Before issue 12: one finding with SQLite's raw report, naming no table ("Tree 9 page
    # 9 ..."), or, where the check stopped at the damage, only "check_aborted" findings.
    path = populated_store.path
    damage(populated_store, name)
    assert run_cli("verify", path, *(["--full"] if full else [])) == 1
    out = capsys.readouterr().out
    assert f"error  sqlite_integrity  [{table}]" in out, out
    assert f"{kind} {name}" in out and "is damaged" in out
    assert "FAILED" in out


def test_verify_reports_a_database_it_cannot_read_at_all(populated_store: Store,
                                                          capsys) -> None:
    # Before issue 12 verify could not open it and advised to "run 'evidence verify' on a
    # copy" (exit 2). Now the report says so, and other commands point to verify.
    path = populated_store.path
    damage(populated_store, "page 1")
    assert run_cli("verify", path) == 1
    out = capsys.readouterr().out
    assert "error  sqlite_integrity  [sqlite_schema" in out
    assert "the database cannot be read at all" in out and "FAILED: 1 error(s)" in out
    assert run_cli("verify", path, "--json") == 1
    assert json.loads(capsys.readouterr().out)["ok"] is False
    from evidence._cli.main import main as cli_main

    assert cli_main(["status", str(path)]) == 2
    err = capsys.readouterr().err
    assert "damaged" in err and "Try: 'evidence verify STORE --full' says what is damaged" in err


# --- the store identity and counted quarantine records (issue 12) -----------------------

def legacy_store(path: Path) -> None:
    """A store as the program before issue 12 left it: schema 4, a log whose chain starts
    from 32 zero bytes, and a conflict delivered twice as two quarantine rows."""
    import msgspec

    from evidence import SessionStarted, canonical_encode, payload_hash, utc_now
    from evidence._model.merkle import CompactTree, leaf_hash
    from evidence._store.log import GENESIS_HASH, entry_hash
    from evidence._store.sqlite import (
        apply_migrations,
        connect_writer,
        ensure_store_id,
        load_migrations,
    )

    path.mkdir()
    (path / "artifacts").mkdir()
    conn = connect_writer(path / "evidence.db", "full", 1000, create=True)
    try:
        apply_migrations(conn, load_migrations()[:4])
        ensure_store_id(conn)
        message = SessionStarted(message_id="m1", session_id="s1", started_at=utc_now())
        payload = canonical_encode(message)
        at = "2025-03-03T12:00:00.000000Z"
        tree = CompactTree()
        tree.append(leaf_hash(payload))
        chain = entry_hash(GENESIS_HASH, 1, 0, 1, tree.root(), at)
        changed = canonical_encode(msgspec.structs.replace(message, mode="incremental"))
        with conn:
            conn.execute("INSERT INTO ingest_ledger VALUES (0, 'm1', 'session_started', ?, ?, "
                         "?, 1, ?)", (payload_hash(payload), leaf_hash(payload), payload, at))
            conn.execute("INSERT INTO commit_log VALUES (1, ?, 0, 1, ?, ?, ?, ?)",
                         (at, tree.root(), tree.to_bytes(), GENESIS_HASH, chain))
            conn.execute("INSERT INTO crawl_session (session_id, started_at, mode, config) "
                         "VALUES ('s1', ?, 'full', '{}')", (msgspec.json.decode(
                             msgspec.json.encode(message.started_at)),))
            for _ in range(2):
                conn.execute("INSERT INTO quarantine (received_at, message_id, kind, "
                             "reason_code, reason, payload_hash, payload) VALUES (?, 'm1', "
                             "'session_started', 'conflict', 'other content', ?, ?)",
                             (at, payload_hash(changed), changed))
    finally:
        conn.close()


def test_a_new_store_binds_its_identity_and_an_edit_of_it_is_found(store: Store,
                                                                   make: Factory) -> None:
    from evidence._store.log import identity_bound, identity_genesis

    submit_all(store, [make.session()])
    assert identity_bound(store.connection) is True
    assert one(store, "SELECT prev_hash FROM commit_log WHERE batch_seq = 1")[0] == \
        identity_genesis(store.store_id)
    store.connection.execute("UPDATE store_meta SET value = 'store-other' "
                             "WHERE key = 'store_id'")
    [finding] = verify(store).errors
    assert finding.kind == "log_identity" and "store_id was changed" in finding.message


def test_a_store_from_before_issue_12_verifies_and_keeps_its_quarantine_rows(
        tmp_path: Path) -> None:
    legacy_store(tmp_path / "old")
    with Store.open(tmp_path / "old") as store:  # migrated to the current schema
        rows = store.connection.execute(
            "SELECT quarantine_id, deliveries FROM quarantine").fetchall()
        assert rows == [(1, None), (2, None)], "never rewritten"
        report = verify(store)
        assert report.ok, report.errors
        assert kinds(report) == {"identity_unbound"}  # a notice: its id is not bound
        quick = verify(store, quick=True)  # the same of its log and its rows
        assert quick.ok and kinds(quick) == {"identity_unbound"}, quick.findings
        from evidence import decode_message

        payload = one(store, "SELECT payload FROM quarantine WHERE quarantine_id = 1")[0]
        changed = decode_message(payload)  # the same conflict, delivered twice more
        acks = submit_all(store, [changed]) + submit_all(store, [changed])
        assert [a.status for a in acks] == ["conflict", "conflict"]
        assert store.connection.execute(
            "SELECT quarantine_id, deliveries FROM quarantine ORDER BY 1").fetchall() == [
            (1, None), (2, None), (3, 2)], "new deliveries are counted in one new record"
        assert verify(store).ok
