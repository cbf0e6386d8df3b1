"""verify --quick (issue 35 point 4): the edits it claims to find, found as the default
finds them; the edit it leaves to the default, passed by it; refused where it means nothing.

Each edit is one an attacker (or a crash) makes to a real store written by the writer:
append-only triggers dropped (and put back), rows deleted or forged, a page of the file
overwritten, a pack removed or cut short. docs/verify.md's table says which tier finds what;
these tests hold it."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence import ArtifactRef, RuleEvaluated, RunEnded, Store
from evidence._audit.checkpoints import checkpoint, open_checkpoint
from evidence._audit.keys import SigningKey
from evidence._audit.verify import verify

from .conftest import LAYOUTS, Factory, new_s3_url, payload_place, run_cli, submit_all


def found(report) -> set[tuple]:
    """Each finding as (kind, table, row, log index, batch): what both tiers must agree on."""
    return {(f.kind, f.location.table, f.location.row_id, f.location.log_index,
             f.location.batch_seq) for f in report.findings}


def both(store: Store) -> tuple:
    return verify(store, quick=True), verify(store)


def unguarded(store: Store, trigger: str, *edits: str) -> None:
    """Make ``edits`` with ``trigger`` dropped, then put it back as it was: nothing left for
    the schema check to see."""
    conn = store.connection
    [(sql,)] = conn.execute("SELECT sql FROM sqlite_schema WHERE name = ?", (trigger,))
    conn.execute(f"DROP TRIGGER {trigger}")
    for edit in edits:
        conn.execute(edit)
    conn.execute(sql)


def reopened(store: Store) -> Store:
    """The store closed (its packs sealed, its WAL folded in) and opened read-only again,
    as an operator's verify after a crash or a deploy opens it."""
    path = store.path
    store.close()
    return Store.open(path, read_only=True)


# --- an intact store -------------------------------------------------------------------

@pytest.mark.parametrize("artifact_layout", LAYOUTS)  # SQLite, payloads in packs or files
def test_quick_finds_nothing_on_an_intact_store_and_says_what_it_left_out(
        populated_store: Store, capsys) -> None:
    quick, default = both(populated_store)
    assert quick.ok and quick.findings == [] and quick.mode == "quick"
    assert default.mode == "default" and not default.not_checked
    assert (quick.tree_size, quick.root) == (default.tree_size, default.root)
    assert quick.checks["log_entries"] == default.checks["ledger_entries"] == 6
    assert quick.checks["artifacts"] == default.checks["artifacts"] == 1
    assert quick.checks["row_counts"] == 6  # an attempt, 2 edges, a verdict, a session, a run
    assert {"projection_rows", "foreign_key_check", "ledger_entries"}.isdisjoint(quick.checks)
    assert any("field by field" in line for line in quick.not_checked)
    assert run_cli("verify", populated_store.path, "--quick") == 0
    out = capsys.readouterr().out
    assert "mode     quick:" in out and "OK: no errors" in out
    assert (f"quick:   rows were not compared with their ledger entries; `evidence verify "
            f"{populated_store.path}` does") in out
    assert run_cli("verify", populated_store.path, "--quick", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mode"] == "quick" and data["ok"] and "row_counts" in data["checks"]
    assert "foreign_key_check" in data["not_checked"]


# --- what it finds, as the default finds it -----------------------------------------------

def test_an_edited_ledger_entry_is_found_at_its_leaf(populated_store: Store) -> None:
    unguarded(populated_store, "ingest_ledger_no_update",
              "UPDATE ingest_ledger SET payload = CAST(payload || x'00' AS BLOB) "
              "WHERE log_index = 3")
    quick, default = both(populated_store)
    assert [f.location.log_index for f in quick.findings if f.kind == "log_leaf"] == [3]
    assert {f for f in found(quick) if f[0].startswith("log_")} == {
        f for f in found(default) if f[0].startswith("log_")}


@pytest.mark.parametrize("table", ["fetch_attempt", "discovery_edge", "rule_evaluation"])
def test_a_deleted_row_is_found_at_its_ledger_entry(populated_store: Store, table: str) -> None:
    index = populated_store.connection.execute(
        f"SELECT max(log_index) FROM {table}").fetchall()[0][0]
    unguarded(populated_store, f"{table}_no_delete", "PRAGMA foreign_keys = OFF",
              f"DELETE FROM {table} WHERE rowid = (SELECT max(rowid) FROM {table})")
    quick, default = both(populated_store)
    [missing] = [f for f in quick.findings if f.kind == "row_missing"]
    assert (missing.location.table, missing.location.log_index) == (table, index)
    # At its table, the same finding (the default also compares the rows that named a
    # deleted attempt, and finds the URL a deleted link named now referenced by no row).
    assert {f for f in found(quick) if f[1] == table} == {
        f for f in found(default) if f[1] == table}


def test_a_dropped_trigger_is_found(populated_store: Store) -> None:
    populated_store.connection.execute("DROP TRIGGER discovery_edge_no_delete")
    [schema] = verify(populated_store, quick=True).findings
    assert schema.kind == "schema" and "trigger discovery_edge_no_delete is missing" in \
        schema.message


@pytest.mark.parametrize("at", ["discovery", "beyond"])
def test_an_inserted_row_is_found_unlogged(populated_store: Store, at: str) -> None:
    conn = populated_store.connection
    index = (conn.execute("SELECT log_index FROM discovery_edge LIMIT 1").fetchall()[0][0]
             if at == "discovery" else 99)
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("INSERT INTO rule_evaluation (run_id, url_id, rule_id, rule_version, "
                 "input_hash, verdict, evaluated_at, details, log_index) SELECT 'r1', url_id, "
                 f"'forged', '1', 'x', 'pass', 'now', '{{}}', {index} FROM url_identity LIMIT 1")
    quick, default = both(populated_store)
    [forged] = [f for f in quick.findings if f.kind == "row_unlogged"]
    assert forged.location.table == "rule_evaluation" and forged.location.log_index == index
    assert ("which is a discovery entry" if at == "discovery" else "beyond the end of the "
            "ledger") in forged.message
    assert {f for f in found(quick) if f[0] == "row_unlogged"} == {
        f for f in found(default) if f[0] == "row_unlogged"}


def test_a_link_stored_once_for_two_entries_is_no_finding(store: Store, make: Factory) -> None:
    """The writer stores an edge once (ON CONFLICT DO NOTHING): the same document, with
    the same links, discovered twice in a run. The counts disagree with the entries'; the
    entries whose rows differ in number are checked as the default checks them, which
    finds the owner of each link."""
    body = make.body(b"<a href=/a>a</a>")
    first, again = (make.attempt(f"http://example.com/{n}", body=body) for n in ("x", "y"))
    submit_all(store, [make.session(), make.run(), first, again,
                       make.discovery(first, body, ["http://example.com/a"]),
                       make.discovery(again, body, ["http://example.com/a"])])
    quick, default = both(store)
    assert quick.ok and quick.findings == default.findings == []
    unguarded(store, "discovery_edge_no_delete", "DELETE FROM discovery_edge")
    quick, default = both(store)
    missing = {f for f in found(quick) if f[1] == "discovery_edge"}
    assert {(f[0], f[3]) for f in missing} == {("row_missing", 4), ("row_missing", 5)}
    assert {f for f in found(default) if f[1] == "discovery_edge"} == missing


def test_a_damaged_page_is_found(populated_store: Store, capsys) -> None:
    path = populated_store.path
    [(root,)] = populated_store.connection.execute(
        "SELECT rootpage FROM sqlite_schema WHERE name = 'discovery_edge'")
    [(page_size,)] = populated_store.connection.execute("PRAGMA page_size")
    populated_store.close()
    with open(path / "evidence.db", "r+b") as handle:
        handle.seek((root - 1) * page_size + 8)
        handle.write(b"\xff" * 200)
    assert run_cli("verify", path, "--quick") == 1
    out = capsys.readouterr().out
    assert "error  sqlite_integrity  [discovery_edge]" in out and "FAILED" in out


def cut_short(pack: Path, at: int) -> None:
    pack.chmod(0o644)
    with open(pack, "r+b") as handle:
        handle.truncate(at)
    pack.chmod(0o444)


@pytest.mark.parametrize(("how", "kind"), [("removed", "artifact_missing"),
                                           ("cut short", "artifact_missing"),
                                           ("cut short while open", "artifact_corrupt")])
def test_a_pack_removed_or_cut_short_is_found(populated_store: Store, how: str,
                                              kind: str) -> None:
    """A pack opened after it was cut short is read as a crash leaves one (its records up
    to the first torn one); one cut short after the store opened it is not the size it
    was sealed at: each payload is then looked up as the default looks it up."""
    namespace, digest, size = populated_store.connection.execute(
        "SELECT namespace, digest, size FROM artifact").fetchall()[0]
    store = reopened(populated_store)
    pack, offset = payload_place(store, ArtifactRef(namespace, digest, size))
    if how == "removed":
        pack.unlink()
    elif how == "cut short":
        cut_short(pack, offset + 10)
    if how != "cut short while open":
        store.close()
        store = Store.open(populated_store.path, read_only=True)
    else:
        cut_short(pack, offset + 10)
    with store:
        quick = verify(store, quick=True)
        default = verify(store)
    [lost] = quick.errors
    assert (lost.kind, lost.location.digest) == (kind, digest)
    listed = {f for f in found(default) if f[0] != "orphan"}
    if how == "cut short while open":
        # The default's orphan listing reads the pack again and stops at the change: that
        # is a finding too, where it raised (a traceback at the command line).
        assert {f[0] for f in listed - found(quick)} == {"check_aborted"}, default.findings
        assert "orphans" not in default.checks
        listed = {f for f in listed if f[0] != "check_aborted"}
    assert found(quick) == listed


@pytest.mark.parametrize("artifact_layout", ["files"])
def test_a_payload_file_removed_is_found(populated_store: Store) -> None:
    namespace, digest, size = populated_store.connection.execute(
        "SELECT namespace, digest, size FROM artifact").fetchall()[0]
    populated_store.artifacts.path_for(ArtifactRef(namespace, digest, size)).unlink()
    [lost] = verify(populated_store, quick=True).errors
    assert (lost.kind, lost.location.digest) == ("artifact_missing", digest)


def test_a_checkpoint_not_matched_is_found(populated_store: Store, tmp_path: Path) -> None:
    key = SigningKey.generate("example.com/crawl")
    with Store.create(tmp_path / "other") as other:
        made = Factory(other)
        submit_all(other, [made.session(), made.run()])
        note = checkpoint(other, key).note()
    signed = open_checkpoint(note, key.public_key)
    quick = verify(populated_store, quick=True, checkpoint=signed)
    default = verify(populated_store, checkpoint=signed)
    assert "checkpoint_mismatch" in {f.kind for f in quick.errors}
    assert found(quick) == found(default)
    own = open_checkpoint(checkpoint(populated_store, key).note(), key.public_key)
    assert verify(populated_store, quick=True, checkpoint=own).ok


# --- what it leaves to the default -----------------------------------------------------------

def test_a_column_edited_in_place_passes_quick_and_fails_the_default(
        populated_store: Store) -> None:
    """The boundary of docs/verify.md's table: rows are counted, not compared."""
    unguarded(populated_store, "fetch_attempt_no_update",
              "UPDATE fetch_attempt SET http_status = 500")
    quick, default = both(populated_store)
    assert quick.ok and quick.findings == []
    assert [f.kind for f in default.errors] == ["row_mismatch"]
    assert "http_status is 500" in default.errors[0].message


# --- refused where it means nothing -------------------------------------------------------

def test_quick_is_refused_with_full_reclaim_an_archive_and_a_wacz(
        populated_store: Store, tmp_path: Path, capsys) -> None:
    path = populated_store.path
    wacz = tmp_path / "x.wacz"
    wacz.write_bytes(b"PK")
    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / "manifest.json").write_text("{}")
    for argv, said in (((path, "--quick", "--full"), "exclude each other"),
                       ((path, "--quick", "--reclaim-orphans"), "needs the orphan listing"),
                       ((archive, "--quick"), "an archive is restored"),
                       ((wacz, "--quick"), "a WACZ file is always checked whole")):
        assert run_cli("verify", *argv) == 2
        out = capsys.readouterr().out
        assert "Error: " in out and said in out and "Try: evidence" in out
    with pytest.raises(ValueError, match="exclude each other"):
        verify(populated_store, quick=True, full=True)


# --- other backends and payload stores ---------------------------------------------------

def populate(store: Store) -> None:
    """Every evidence table written, as ``populated_store`` writes it."""
    make = Factory(store)
    body = make.body()
    attempt = make.attempt(body=body)
    submit_all(store, [make.session(), make.run(), attempt,
                       make.discovery(attempt, body, ["http://example.com/a"]),
                       RuleEvaluated(message_id=make.id("m"), run_id="r1", url=attempt.url,
                                     rule_id="title", rule_version="1",
                                     input_hash=body.digest, verdict="pass",
                                     evaluated_at=make.now, attempt_id=attempt.attempt_id)])


def test_quick_on_sqlite_with_payloads_in_s3(tmp_path: Path, seaweed, monkeypatch) -> None:
    for name, value in seaweed.environ.items():
        monkeypatch.setenv(name, value)
    with Store.create(tmp_path / "s", artifacts=new_s3_url(seaweed, "quick")) as store:
        populate(store)
        quick, default = both(store)
        assert quick.ok and quick.findings == [] and quick.checks["artifacts"] == 1
        unguarded(store, "rule_evaluation_no_delete", "DELETE FROM rule_evaluation")
        quick, default = both(store)
        assert {f[0] for f in found(quick)} == {"row_missing"}
        assert found(quick) == found(default)


@pytest.mark.parametrize("payloads", ["files", "packs", "s3"])
def test_quick_on_postgresql(tmp_path: Path, pg_url: str, pg_cluster, payloads: str,
                             request, monkeypatch) -> None:
    from urllib.parse import urlsplit

    if payloads == "s3":
        seaweed = request.getfixturevalue("seaweed")
        for name, value in seaweed.environ.items():
            monkeypatch.setenv(name, value)
        where = new_s3_url(seaweed, "pg")
    else:
        where = str(tmp_path / "art")
    layout = "files" if payloads == "files" else "packs"
    with Store.create(pg_url, artifacts=where, artifact_layout=layout) as store:
        populate(store)
        quick, default = both(store)
        assert quick.ok and quick.findings == [] and quick.mode == "quick"
        assert quick.checks["schema_objects"] > 50 and quick.checks["row_counts"] == 5
        pg_cluster.sql("ALTER TABLE rule_evaluation DISABLE TRIGGER rule_evaluation_no_update; "
                       "DELETE FROM rule_evaluation", dbname=urlsplit(pg_url).path.lstrip("/"))
        quick, default = both(store)
        assert {f[0] for f in found(quick)} == {"schema", "row_missing"}
        assert found(quick) == found(default)


# --- any sequence of writer batches ----------------------------------------------------------

async def submit_in_batches(store: Store, messages: list, size: int) -> None:
    """Through a real writer, ``size`` messages at a time submitted together (so committed
    in batches of up to that many), each group acknowledged before the next."""
    import asyncio

    from evidence import Writer

    async with Writer(store) as writer:
        for at in range(0, len(messages), size):
            acks = await asyncio.gather(*(writer.submit(m) for m in messages[at:at + size]))
            assert {a.status for a in acks} == {"committed"}


PAGES = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.booleans()),
                 min_size=1, max_size=6)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pages=PAGES, batch=st.integers(1, 4), ended=st.booleans())
def test_quick_finds_nothing_on_any_sequence_of_writer_batches(
        tmp_path_factory, pages: list[tuple[int, int, bool]], batch: int,
        ended: bool) -> None:
    """Pages with 0-3 links, a body from a pool of three (the same document again: its
    links stored once), a verdict or not, in batches of 1-4 messages, the run ended or
    not: --quick finds nothing, and the log and payloads it counted are the default's."""
    with Store.create(tmp_path_factory.mktemp("q") / "s") as store:
        make = Factory(store)
        bodies = [make.body(f"<p>{n}</p>".encode()) for n in range(3)]
        messages: list = [make.session(), make.run()]
        for n, (links, body, rule) in enumerate(pages):
            attempt = make.attempt(f"http://example.com/{n}", body=bodies[body])
            messages += [attempt, make.discovery(attempt, bodies[body], [
                f"http://example.com/l{k}" for k in range(links)])]
            if rule:
                messages.append(RuleEvaluated(
                    message_id=make.id("m"), run_id="r1", url=attempt.url, rule_id="t",
                    rule_version="1", input_hash=bodies[body].digest, verdict="pass",
                    evaluated_at=make.now, attempt_id=attempt.attempt_id))
        if ended:
            messages.append(RunEnded(message_id=make.id("m"), run_id="r1", ended_at=make.now,
                                     outcome="completed"))
        anyio.run(submit_in_batches, store, messages, batch)
        quick, default = both(store)
        assert quick.findings == default.errors == []  # (unused bodies: orphan notices)
        assert (quick.tree_size, quick.root) == (default.tree_size, default.root)
        assert quick.checks["log_entries"] == default.checks["ledger_entries"]
        assert quick.checks["artifacts"] == default.checks["artifacts"]
        tables = ("fetch_attempt", "discovery_edge", "rule_evaluation", "crawl_session",
                  "crawl_run")
        assert quick.checks["row_counts"] == sum(store.connection.execute(
            f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in tables)


def test_the_quick_decoder_reads_how_many_rows_an_entry_wrote_from_its_list_header() -> None:
    """The quick decoder's defaults are empty: an entry without the field counts -1 rows
    (the strict decoder then says what is wrong), never the rows of another entry."""
    from evidence._audit.verify_quick import _SHAPE, _items

    shape = _SHAPE.decode(msgspec.msgpack.encode({"kind": "discovery", "x": [1, 2]}))
    assert _items(shape.refs) == -1 and _items(shape.documents) == -1
    shape = _SHAPE.decode(msgspec.msgpack.encode({"kind": "discovery", "refs": list(range(20))}))
    assert _items(shape.refs) == 20


# --- the log's bulk path -----------------------------------------------------------------

@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.integers(1, 5), min_size=1, max_size=6), bits=st.integers(0, 3))
def test_the_bulk_log_check_agrees_with_the_leaf_by_leaf_one(
        tmp_path_factory, monkeypatch, batches: list[int], bits: int) -> None:
    """For any sequence of batches, and chunks of 1-8 leaves (so batches and chunks end
    anywhere against each other), ``check_log_bulk`` gives ``LogCheck``'s size, root and
    every batch's head; a leaf changed, and it answers None (``LogCheck`` then says what)."""
    from evidence._store import log

    monkeypatch.setattr(log, "_CHUNK_BITS", bits)
    monkeypatch.setattr(log, "_CHUNK", 1 << bits)
    with Store.create(tmp_path_factory.mktemp("log") / "s") as store:
        make = Factory(store)
        conn = store.connection
        messages: list = [make.session(), make.run()]
        sizes = [2]
        for n, size in enumerate(batches):
            messages += [make.attempt(f"http://example.com/{n}/{k}") for k in range(size)]
            sizes.append(size)
        anyio.run(submit_grouped, store, messages, sizes)
        bulk_heads: dict = {}
        leaf_heads: dict = {}
        agreed = log.check_log_bulk(conn, bulk_heads)
        check = log.LogCheck(conn, leaf_heads)
        for row in conn.execute(log._leaves_sql(conn)):
            check.leaf(*row)
        size, root, findings = check.finish()
        assert findings == [] and agreed == (size, root) and bulk_heads == leaf_heads
        assert len(leaf_heads) == conn.execute("SELECT count(*) FROM commit_log").fetchall()[0][0]
        unguarded(store, "ingest_ledger_no_update", "UPDATE ingest_ledger SET payload = "
                  "CAST(payload || x'00' AS BLOB) WHERE log_index = (SELECT max(log_index) "
                  "FROM ingest_ledger)")
        assert log.check_log_bulk(conn) is None
        assert log.check_log(conn)[2][0].what == "leaf"


async def submit_grouped(store: Store, messages: list, sizes: list[int]) -> None:
    """Through a real writer: each group of ``sizes`` submitted together (one batch when
    the writer takes them at once), acknowledged before the next."""
    import asyncio

    from evidence import Writer

    async with Writer(store) as writer:
        at = 0
        for size in sizes:
            acks = await asyncio.gather(*(writer.submit(m) for m in messages[at:at + size]))
            assert {a.status for a in acks} == {"committed"}
            at += size
