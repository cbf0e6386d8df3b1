"""The serialized writer: batches, dedup, quarantine, projection, log, failures."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import apsw
import msgspec
import pytest

from evidence import (
    ArtifactRef,
    CommitError,
    MessageError,
    Store,
    SyncError,
    Writer,
    WriterClosedError,
    WriterLimits,
    check_log,
)
from evidence._write.limits import WriterHooks

from .conftest import Factory, asubmit, reference_mth
from .faultvfs import FaultVFS

pytestmark = pytest.mark.anyio


def count(store: Store, table: str, where: str = "1", args: tuple = ()) -> int:
    return store.connection.execute(
        f"SELECT count(*) FROM {table} WHERE {where}", args).fetchall()[0][0]


def projection(store: Store) -> dict[tuple[str, str], int]:
    return {(r, k): s for r, k, s in store.connection.execute(
        "SELECT c.run_id, u.fetch_key, c.sequence FROM url_current c "
        "JOIN url_identity u USING (url_id)")}


async def test_submit_resolves_after_commit_with_log_position(store: Store,
                                                              make: Factory) -> None:
    async with Writer(store) as w:
        acks = [await w.submit(make.session()), await w.submit(make.run())]
    assert [(a.status, a.log_index) for a in acks] == [("committed", 0), ("committed", 1)]
    assert count(store, "commit_log") == 2 and count(store, "ingest_ledger") == 2


async def test_poison_message_fails_alone_in_a_batch_of_500(store: Store,
                                                            make: Factory) -> None:
    await asubmit(store, [make.session(), make.run()])
    body = make.body()
    messages = [make.attempt(f"http://example.com/p{i}", body=body) for i in range(500)]
    missing = ArtifactRef(namespace="body", digest="ab" * 32, size=10)
    messages[250] = make.attempt("http://example.com/poison", body=missing)
    acks: dict[str, object] = {}
    limits = WriterLimits(max_batch_messages=500, max_batch_delay=5.0)
    async with Writer(store, limits=limits) as w, anyio.create_task_group() as tg:
        async def one(m):
            acks[m.message_id] = await w.submit(m)
        for m in messages:
            tg.start_soon(one, m)
    statuses = [acks[m.message_id].status for m in messages]
    assert statuses.count("committed") == 499
    poison = acks[messages[250].message_id]
    assert poison.status == "rejected" and "is not in the store" in poison.reason
    assert {acks[m.message_id].batch_seq for m in messages if m is not messages[250]} == {3}
    assert count(store, "fetch_attempt") == 499
    assert count(store, "quarantine", "reason_code = 'rejected'") == 1


async def test_poison_late_in_a_batch_leaves_the_rows_a_batch_without_it_would_leave(
        store: Store, make: Factory) -> None:
    # A batch is first applied without a savepoint per message; a failure rolls that attempt
    # back and re-applies the batch a message at a time. Ids interned by the abandoned
    # attempt (here the poison's first URL, before its bad one) must not survive in the
    # writer's caches: the row id goes to another URL, and a later batch must not be told
    # the poison's URL has it.
    await asubmit(store, [make.session(), make.run()])
    body = make.body(b"<html>fresh</html>")
    first = [make.attempt(f"http://example.com/a{i}", body=body) for i in range(10)]
    poison = make.discovery(first[0], body, ["http://example.com/p1", "mailto:nobody"])
    after = make.attempt("http://example.com/q", body=body)
    limits = WriterLimits(max_batch_messages=100)
    async with Writer(store, limits=limits) as w:
        acks = await w.submit_group([*first, poison, after])
        assert [a.status for a in acks] == ["committed"] * 10 + ["rejected", "committed"]
        later = make.attempt("http://example.com/p1", body=body)
        links = make.discovery(later, body, ["http://example.com/p1", "http://example.com/a3"])
        assert {a.status for a in await w.submit_group([later, links])} == {"committed"}
    assert count(store, "url_identity") == 12
    assert store.connection.execute("PRAGMA foreign_key_check").fetchall() == []
    keys = dict(store.connection.execute(
        "SELECT f.attempt_id, u.fetch_key FROM fetch_attempt f JOIN url_identity u USING "
        "(url_id)").fetchall())
    assert keys == {m.attempt_id: m.url for m in [*first, after, later]}
    targets = store.connection.execute(
        "SELECT u.fetch_key FROM discovery_edge e JOIN url_identity u "
        "ON u.url_id = e.target_url_id ORDER BY e.edge_id").fetchall()
    assert [t for (t,) in targets] == ["http://example.com/p1", "http://example.com/a3"]
    assert check_log(store.connection)[2] == []


async def test_missing_artifact_is_refused_and_nothing_of_it_is_written(
        store: Store, make: Factory) -> None:
    await asubmit(store, [make.session(), make.run()])
    before = {t: count(store, t) for t in ("fetch_attempt", "url_identity", "artifact",
                                           "ingest_ledger", "url_current")}
    missing = ArtifactRef(namespace="body", digest="cd" * 32, size=5)
    [ack] = await asubmit(store, [make.attempt("http://example.com/new", body=missing)])
    assert ack.status == "rejected" and "cd" * 32 in ack.reason
    after = {t: count(store, t) for t in before}
    assert after == before, "no evidence row, url, artifact, ledger or projection row"
    payload = store.connection.execute("SELECT payload FROM quarantine").fetchall()[0][0]
    assert msgspec.msgpack.decode(payload)["url"] == "http://example.com/new"


async def test_same_id_different_payload_is_quarantined_and_original_untouched(
        store: Store, make: Factory) -> None:
    original = make.attempt(body=make.body())
    await asubmit(store, [make.session(), make.run(), original])
    ledger_before = store.connection.execute("SELECT * FROM ingest_ledger").fetchall()
    forged = msgspec.structs.replace(original, http_status=404)
    async with Writer(store) as w:
        ack = await w.submit(forged)
        assert w.statistics().conflicts == 1
    assert ack.status == "conflict" and "already recorded with payload hash" in ack.reason
    assert store.connection.execute("SELECT * FROM ingest_ledger").fetchall() == ledger_before
    assert store.connection.execute("SELECT http_status FROM fetch_attempt").fetchall() == [
        (200,)]
    rows = store.connection.execute(
        "SELECT message_id, reason_code, payload FROM quarantine").fetchall()
    assert [(r[0], r[1]) for r in rows] == [(original.message_id, "conflict")]
    assert msgspec.msgpack.decode(rows[0][2])["http_status"] == 404, "kept whole"


async def test_redelivery_is_a_duplicate_with_the_original_position(
        store: Store, make: Factory) -> None:
    attempt = make.attempt()
    first = (await asubmit(store, [make.session(), make.run(), attempt]))[2]
    again = await asubmit(store, [attempt, attempt])
    assert [a.status for a in again] == ["duplicate", "duplicate"]
    assert {a.log_index for a in again} == {first.log_index}
    assert count(store, "ingest_ledger") == 3 and count(store, "commit_log") == 3


async def test_late_attempt_is_kept_but_never_moves_projection_backward(
        store: Store, make: Factory) -> None:
    url = "http://example.com/page"
    await asubmit(store, [make.session(), make.run(), make.attempt(url, sequence=5)])
    acks = await asubmit(store, [make.attempt(url, sequence=3), make.attempt(url, sequence=4)])
    assert [a.status for a in acks] == ["committed", "committed"]
    assert projection(store) == {("r1", url): 5}
    assert count(store, "fetch_attempt") == 3
    await asubmit(store, [make.attempt(url, sequence=9)])
    assert projection(store) == {("r1", url): 9}


async def test_same_run_url_and_sequence_under_another_attempt_is_rejected(
        store: Store, make: Factory) -> None:
    await asubmit(store, [make.session(), make.run(), make.attempt(sequence=1)])
    [ack] = await asubmit(store, [make.attempt(sequence=1)])
    assert ack.status == "rejected" and "UNIQUE" in ack.reason


@pytest.mark.parametrize(("change", "reason"), [
    ({"run_id": "nope"}, "run nope is not recorded"),
    ({"outcome": "response", "http_status": None}, "needs an http_status"),
    ({"outcome": "refused_by_robots", "http_status": 200}, "never requested"),
    ({"url": "ftp://example.com/"}, "attempt"),
])
async def test_invalid_attempts_are_rejected_with_a_reason(
        store: Store, make: Factory, change: dict, reason: str) -> None:
    await asubmit(store, [make.session(), make.run()])
    [ack] = await asubmit(store, [msgspec.structs.replace(make.attempt(), **change)])
    assert ack.status == "rejected" and reason in ack.reason
    assert count(store, "fetch_attempt") == 0


async def test_malformed_bytes_raise_and_write_nothing(store: Store) -> None:
    async with Writer(store) as w:
        with pytest.raises(MessageError):
            await w.submit_bytes(b"\x93\x01\x02")
        with pytest.raises(MessageError, match="at `\\$.sequence`"):
            await w.submit_bytes(b'{"kind": "fetch_attempt", "sequence": "x"}', format="json")
    assert count(store, "ingest_ledger") + count(store, "quarantine") == 0


_mth = reference_mth


async def test_commit_log_roots_match_an_independent_recomputation(
        store: Store, make: Factory) -> None:
    await asubmit(store, [make.session(), make.run()])
    body = make.body()
    for batch in range(5):
        limits = WriterLimits(max_batch_delay=0.5, max_batch_messages=7)
        async with Writer(store, limits=limits) as w, anyio.create_task_group() as tg:
            for i in range(batch * 3 + 1):
                tg.start_soon(w.submit, make.attempt(f"http://e.com/{batch}/{i}", body=body))
    leaves = [hashlib.sha256(b"\x00" + p).digest() for (p,) in store.connection.execute(
        "SELECT payload FROM ingest_ledger ORDER BY log_index")]
    rows = store.connection.execute(
        "SELECT tree_size, root FROM commit_log ORDER BY batch_seq").fetchall()
    assert len(rows) > 5
    for size, root in rows:
        assert root == _mth(leaves[:size])
    size, root, findings = check_log(store.connection)
    assert (size, root, findings) == (len(leaves), _mth(leaves), [])


async def test_a_flush_ends_the_linger_and_what_is_queued_still_joins(
        store: Store, make: Factory) -> None:
    # A producer that knows nothing more is coming says so (flush): the batch commits
    # then, not after max_batch_delay (30 s here: the test would time out), and a group
    # queued before it is in the same batch.
    await asubmit(store, [make.session(), make.run()])
    limits = WriterLimits(max_batch_delay=30.0, max_batch_messages=100)
    acks: dict[str, list] = {}
    with anyio.fail_after(10):
        async with Writer(store, limits=limits) as w, anyio.create_task_group() as tg:
            async def group(name: str, flush: bool) -> None:
                acks[name] = await w.submit_group(
                    [make.attempt(f"http://e.com/{name}/{i}") for i in range(3)], flush=flush)
            tg.start_soon(group, "a", False)
            await anyio.sleep(0.05)  # a is queued; the writer lingers for more
            tg.start_soon(group, "b", True)
    assert {a.batch_seq for a in acks["a"] + acks["b"]} == {acks["a"][0].batch_seq}
    assert [a.status for a in acks["a"] + acks["b"]] == ["committed"] * 6


async def test_a_flush_said_while_a_batch_commits_does_not_cut_the_next_one_short(
        store: Store, make: Factory) -> None:
    # A crawl's pages take turns with the writer: while one batch commits, the pages not in
    # it queue up; once it has committed, its pages come back (each with the next page
    # claimed in its group). A flush said while a batch commits is no news (the batch
    # after it is taken when it ends): what was queued then waits, with the linger, for
    # those pages, and one whole batch commits instead of two half ones.
    await asubmit(store, [make.session(), make.run()])
    entered, gate = threading.Event(), threading.Event()
    hooks = WriterHooks(before_commit=lambda seq: (entered.set(), gate.wait(10)))
    limits = WriterLimits(max_batch_delay=30.0, max_batch_messages=100)
    acks: dict[str, list] = {}
    with anyio.fail_after(20):
        # A batch held open while the test goes on: the commit thread's pipeline (a SQLite
        # store otherwise commits on the event loop's thread, which the gate would block).
        async with Writer(store, limits=limits, hooks=hooks, commit_thread=True) as w, \
                anyio.create_task_group() as tg:
            async def group(name: str) -> None:
                acks[name] = await w.submit_group(
                    [make.attempt(f"http://e.com/{name}/{i}") for i in range(2)], flush=True)
            gate.set()
            await group("first")  # the writer learns that this producer says flush
            gate.clear()
            entered.clear()
            tg.start_soon(group, "held")
            await anyio.to_thread.run_sync(entered.wait, 10)  # "held" is committing
            tg.start_soon(group, "queued")  # its flush is said while a batch commits
            await anyio.sleep(0.05)
            gate.set()
            while "held" not in acks:
                await anyio.sleep(0.01)
            await group("after")  # says flush with no batch committing: the batch goes
    seqs = {name: {a.batch_seq for a in found} for name, found in acks.items()}
    assert seqs["queued"] == seqs["after"]  # one batch, not two
    assert seqs["held"] != seqs["queued"]
    assert all(a.status == "committed" for found in acks.values() for a in found)


async def test_committing_inline_a_batch_wakes_its_submitters_before_the_next_is_taken(
        store: Store, make: Factory) -> None:
    # On a local store the event loop waits while a batch commits, so the next batch is
    # taken once this one's acks are out: its submitters run first, and what they submit
    # next joins the group that was queued meanwhile (a commit thread takes that group
    # alone, before the acks resolve, to commit it while the event loop wakes them).
    await asubmit(store, [make.session(), make.run()])
    seqs: dict[str, int] = {}
    limits = WriterLimits(max_batch_messages=4)  # two groups of two

    async def group(w: Writer, name: str, then: str | None = None) -> None:
        acks = await w.submit_group([make.attempt(f"http://e.com/{name}/{i}")
                                     for i in range(2)])
        seqs[name] = acks[0].batch_seq
        if then is not None:
            await group(w, then)

    async with Writer(store, limits=limits) as w, anyio.create_task_group() as tg:
        tg.start_soon(group, w, "a", "a-next")
        tg.start_soon(group, w, "b", "b-next")
        tg.start_soon(group, w, "c")  # queued while a and b commit
    assert seqs["a"] == seqs["b"] != seqs["c"]
    assert seqs["c"] in (seqs["a-next"], seqs["b-next"]), seqs
    assert count(store, "fetch_attempt") == 10


async def test_a_batch_that_would_wait_for_the_write_lock_waits_off_the_event_loop(
        store: Store, make: Factory) -> None:
    # Another process holds the write lock (here another connection): an inline writer
    # must not stall its event loop for the busy timeout. The batch waits on a thread
    # while the loop goes on, commits once the lock is free, and the next is inline again.
    await asubmit(store, [make.session(), make.run()])
    threads: list[int] = []
    ticks = 0
    other = apsw.Connection(str(store.db_path))
    other.execute("BEGIN IMMEDIATE")
    try:
        async with Writer(store, hooks=WriterHooks(
                after_apply=lambda seq: threads.append(threading.get_ident()))) as w:
            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await anyio.sleep(0.01)
                    ticks += 1

            async with anyio.create_task_group() as tg:
                tg.start_soon(ticker)
                with anyio.fail_after(30):
                    tg.start_soon(w.submit, make.attempt("http://e.com/held"))
                    await anyio.sleep(0.5)
                    # Ten ticks of 10 ms, waited for (a loaded machine may take longer
                    # than 0.5 s) but within 4 s: less than the 5 s busy timeout a stalled
                    # loop would stand still for.
                    with anyio.fail_after(4):
                        while ticks < 10:
                            await anyio.sleep(0.01)
                    assert threads == []  # no batch began: the lock is held
                    other.execute("COMMIT")
                    while not threads:
                        await anyio.sleep(0.01)
                    ack = await w.submit(make.attempt("http://e.com/after"))
                tg.cancel_scope.cancel()
        assert ack.status == "committed"
        assert threads[0] != threading.get_ident() and threads[1:] == [threading.get_ident()]
        assert count(store, "fetch_attempt") == 2
    finally:
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()


async def test_a_local_batch_is_applied_on_the_loop_and_its_fsyncs_wait_off_it(
        store: Store, make: Factory) -> None:
    # A local store's batch is applied on the event loop's thread (no GIL hand-offs per
    # statement); its payloads' fsync, COMMIT and checkpoint then run on the writer's
    # thread while the loop goes on: the after_commit hook below waits for the loop.
    await asubmit(store, [make.session(), make.run()])
    applied: list[int] = []
    committed: list[int] = []
    loop_ran = threading.Event()

    def after(seq: int) -> None:
        committed.append(threading.get_ident())
        assert loop_ran.wait(10), "the event loop stood still while the batch committed"

    hooks = WriterHooks(after_apply=lambda seq: applied.append(threading.get_ident()),
                        after_commit=after)
    async with Writer(store, hooks=hooks) as w, anyio.create_task_group() as tg:
        tg.start_soon(w.submit, make.attempt("http://e.com/x"))
        with anyio.fail_after(10):
            while not committed:
                await anyio.sleep(0.005)
        loop_ran.set()
    assert applied == [threading.get_ident()]
    assert committed[0] != threading.get_ident()
    assert count(store, "fetch_attempt") == 1


async def test_full_queue_makes_submit_wait(store: Store, make: Factory) -> None:
    await asubmit(store, [make.session(), make.run()])
    gate = threading.Event()
    hooks = WriterHooks(before_commit=lambda seq: gate.wait(10))
    limits = WriterLimits(queue_size=2, max_batch_messages=1)
    acked = 0
    async with Writer(store, limits=limits, hooks=hooks, commit_thread=True) as w:
        async def one(i: int) -> None:
            nonlocal acked
            await w.submit(make.attempt(f"http://e.com/{i}"))
            acked += 1
        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)
            await anyio.sleep(0.3)
            stats = w.statistics()
            assert acked == 0, "nothing is acked before its commit"
            assert stats.queue_depth == 2, "the queue holds its bound and no more"
            assert stats.oldest_pending_age >= 0.2
            gate.set()
    assert acked == 8 and count(store, "fetch_attempt") == 8


async def test_close_drains_the_queue_and_later_submits_are_refused(
        store: Store, make: Factory) -> None:
    await asubmit(store, [make.session(), make.run()])
    acks = []
    async with Writer(store) as w:
        for i in range(50):
            acks.append(await w.submit(make.attempt(f"http://e.com/{i}")))
    assert len(acks) == 50 and count(store, "fetch_attempt") == 50
    with pytest.raises(WriterClosedError):
        await w.submit(make.attempt("http://e.com/late"))


async def test_busy_database_gets_bounded_retries_then_a_clear_error(
        tmp_path: Path, make: Factory) -> None:
    with Store.create(tmp_path / "busy", busy_timeout_ms=20) as store:
        await asubmit(store, [make.session()])
        blocker = apsw.Connection(str(store.db_path))
        blocker.execute("BEGIN IMMEDIATE")
        try:
            async with Writer(store, limits=WriterLimits(busy_retries=2)) as w:
                with pytest.raises(CommitError, match="stayed locked through 3 attempts"):
                    await w.submit(make.run())
                assert w.statistics().busy_retries == 3
                blocker.execute("ROLLBACK")
                assert (await w.submit(make.run("r2"))).status == "committed"
        finally:
            blocker.close()


@pytest.fixture
def fault_vfs():
    vfs = FaultVFS()
    yield vfs
    vfs.unregister()


async def test_a_failed_sync_at_commit_acks_nothing_and_stops_the_writer(
        tmp_path: Path, make: Factory, fault_vfs: FaultVFS) -> None:
    # Rule 11 ("an error at COMMIT: reopen and ack from what is there") cannot hold after a
    # failed fsync: Linux marks the unwritten pages clean, so the commit-log row read back
    # may exist only in the page cache (issue 12). Nothing of the batch is acked, the
    # writer stops and marks the store; opening it again resyncs it first, and then the
    # ledger answers for the redelivered message, whichever way the commit went.
    with Store.create(tmp_path / "s", vfs=fault_vfs.name) as store:
        await asubmit(store, [make.session(), make.run()])
        fault_vfs.arm("sync", "-wal")
        attempt, later = make.attempt(), make.attempt("http://e.com/later")
        with pytest.RaisesGroup(SyncError):
            async with Writer(store) as w:
                with pytest.raises(CommitError, match="an fsync failed at COMMIT") as info:
                    await w.submit(attempt)
                assert "resynced" in (info.value.hint or "")
                with pytest.raises(WriterClosedError, match="stopped"):
                    await w.submit(later)
        assert fault_vfs.fired == [("sync", "-wal")]
        assert (tmp_path / "s" / "sync-failed").exists()
        with pytest.raises(SyncError):
            Writer(store)
    with Store.open(tmp_path / "s", vfs=fault_vfs.name) as store:  # resynced
        assert not (tmp_path / "s" / "sync-failed").exists()
        on_disk = count(store, "fetch_attempt", "attempt_id = ?", (attempt.attempt_id,))
        async with Writer(store) as w:
            assert (await w.submit(attempt)).status == ("duplicate" if on_disk else "committed")
            assert (await w.submit(later)).status == "committed"
        assert count(store, "fetch_attempt") == 2
        assert check_log(store.connection)[2] == []


async def test_commit_that_did_not_reach_disk_is_not_acked_and_can_be_redelivered(
        tmp_path: Path, make: Factory, fault_vfs: FaultVFS) -> None:
    with Store.create(tmp_path / "s", vfs=fault_vfs.name) as store:
        await asubmit(store, [make.session(), make.run()])
        fault_vfs.arm("write", "-wal")
        attempt = make.attempt()
        async with Writer(store) as w:
            with pytest.raises(CommitError, match="did not commit|nothing of it was written"):
                await w.submit(attempt)
            assert count(store, "fetch_attempt") == 0
            assert (await w.submit(attempt)).status == "committed"
            assert w.statistics().commit_errors == 1
        assert check_log(store.connection)[2] == []


CHILD = r"""
import os, signal, sys
import anyio
sys.path.insert(0, sys.argv[2])
from conftest import Factory
from evidence import Store, Writer
from evidence._write.limits import WriterHooks

def die(seq):
    print("committed", seq, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

async def main():
    store = Store.open(sys.argv[1])
    make = Factory(store)
    make.now = make.now.replace(microsecond=0, second=0, minute=0, hour=0)
    async with Writer(store, hooks=WriterHooks(after_commit=die)) as w:
        await w.submit(make.attempt("http://e.com/late", sequence=int(sys.argv[3]),
                                    message_id="crash-1", attempt_id="crash-a1"))
        print("acked", flush=True)  # never reached: killed between COMMIT and ack

anyio.run(main)
"""


async def test_crash_between_commit_and_ack_redelivers_as_duplicate(
        store: Store, make: Factory) -> None:
    url = "http://e.com/late"
    await asubmit(store, [make.session(), make.run(), make.attempt(url, sequence=7)])
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(store.path), str(Path(__file__).parent), "3"],
        capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert "committed" in child.stdout and "acked" not in child.stdout.replace(
        "committed", "")
    before = projection(store)
    assert before == {("r1", url): 7}
    with Store.open(store.path) as again:
        make_again = Factory(again)
        make_again.now = make.now.replace(microsecond=0, second=0, minute=0, hour=0)
        redelivered = make_again.attempt(url, sequence=3, message_id="crash-1",
                                         attempt_id="crash-a1")
        [ack] = await asubmit(again, [redelivered])
        assert ack.status == "duplicate"
        assert projection(again) == before
        assert count(again, "fetch_attempt") == 2


async def test_statistics_report_batches_and_latency(store: Store, make: Factory) -> None:
    await asubmit(store, [make.session(), make.run()])
    async with Writer(store, limits=WriterLimits(max_batch_delay=0.5,
                                                 max_batch_messages=10)) as w:
        async with anyio.create_task_group() as tg:
            for i in range(30):
                tg.start_soon(w.submit, make.attempt(f"http://e.com/{i}"))
        stats = w.statistics()
    assert stats.committed == 30 and stats.batches == 3
    assert stats.batch_sizes["10"] == 3
    assert 0 < stats.commit_latency_p50 <= stats.commit_latency_max
    assert stats.tree_size == 32 and stats.queue_depth == 0
    assert os.path.getsize(store.db_path) > 0


async def test_wal_grows_under_a_long_reader_and_shrinks_after_it(
        store: Store, make: Factory) -> None:
    await asubmit(store, [make.session(), make.run()])
    body = make.body(b"x" * 2000)
    limits = WriterLimits(checkpoint_wal_bytes=256 * 1024)
    reader = apsw.Connection(str(store.db_path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM ingest_ledger").fetchall()  # holds a snapshot
        async with Writer(store, limits=limits) as w:
            for i in range(300):
                await w.submit(make.attempt(f"http://e.com/{i}", body=body,
                                            error="e" * 1500))
            grown = store.wal_size()
            assert grown > 4 * limits.checkpoint_wal_bytes, "the reader pins the WAL"
            reader.execute("COMMIT")
            await w.submit(make.attempt("http://e.com/after", body=body))
            stats = w.statistics()
        assert stats.wal_truncations >= 1
        assert store.wal_size() < grown / 4, "checkpointed and truncated once it could"
    finally:
        reader.close()
