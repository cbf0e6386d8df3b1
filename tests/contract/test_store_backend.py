"""The store-backend contract (``evidence._store.backend.StoreBackend``), stated once and
run over every backend (tests/contract/conftest.py), through the public ``Writer``:
append-only evidence enforced by the database, the sequence guard on ``url_current``,
redelivery (duplicate, conflict), and the commit-outcome rule."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import blake3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence import ArtifactRef, CommitError, Store, Writer, WriterClosedError
from evidence._store.s3 import S3ArtifactStore
from evidence._store.sqlite import SQLiteBackend
from evidence._write.limits import WriterHooks

from ..conftest import Factory, asubmit
from .conftest import StoreKind

pytestmark = pytest.mark.anyio

# Evidence tables, and a statement that would edit each row in place or remove it.
APPEND_ONLY = {
    "fetch_attempt": "UPDATE fetch_attempt SET http_status = 500",
    "artifact": "UPDATE artifact SET size = size + 1",
    "ingest_ledger": "UPDATE ingest_ledger SET payload = x'00'",
    "commit_log": "UPDATE commit_log SET root = x'00'",
    "discovery_edge": "UPDATE discovery_edge SET observed_ref = 'edited'",
    "url_identity": "UPDATE url_identity SET fetch_key = 'edited'",
}


def count(store: Store, table: str) -> int:
    with store.snapshot() as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]


async def populated(store: Store) -> Factory:
    make = Factory(store)
    body = make.body(b"<a href=/x>x</a>")
    attempt = make.attempt(body=body)
    acks = await asubmit(store, [make.session(), make.run(), attempt,
                                 make.discovery(attempt, body, ["http://example.com/x"])])
    assert {a.status for a in acks} == {"committed"}
    return make


@pytest.mark.parametrize("table", sorted(APPEND_ONLY))
async def test_the_database_refuses_to_edit_or_delete_evidence(
        store_kind: StoreKind, tmp_path: Path, table: str) -> None:
    with store_kind.open(tmp_path / "s") as store:
        await populated(store)
        before = count(store, table)
        db = store.backend
        conn = db.connect_writer()  # any connection, not only the writer's
        try:
            for statement in (APPEND_ONLY[table], f"DELETE FROM {table}"):
                with pytest.raises(db.Error):
                    conn.execute(statement)
        finally:
            conn.close()
        assert count(store, table) == before


@pytest.mark.slow
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequences=st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=8,
                         unique=True))  # run + URL + sequence is one attempt
async def test_url_current_only_moves_forward_whatever_order_attempts_arrive_in(
        backend_kind: StoreKind, tmp_path_factory: pytest.TempPathFactory,
        sequences: list[int]) -> None:
    with backend_kind.open(tmp_path_factory.mktemp("s") / "s") as store:
        make = Factory(store)
        await asubmit(store, [make.session(), make.run()])
        for sequence in sequences:  # each in its own batch, in the order given
            await asubmit(store, [make.attempt("http://example.com/p", sequence=sequence)])
        with store.snapshot() as conn:
            [(current,)] = conn.execute("SELECT sequence FROM url_current").fetchall()
        assert current == max(sequences)
        assert count(store, "fetch_attempt") == len(sequences)  # late ones kept


async def test_redelivery_is_a_duplicate_or_a_conflict_never_a_second_row(
        store_kind: StoreKind, tmp_path: Path) -> None:
    with store_kind.open(tmp_path / "s") as store:
        make = Factory(store)
        await asubmit(store, [make.session(), make.run()])
        attempt = make.attempt()
        changed = make.attempt(message_id=attempt.message_id, http_status=404)
        first, again, other = await asubmit(store, [attempt, attempt, changed])
        assert first.status == "committed"
        assert (again.status, again.log_index) == ("duplicate", first.log_index)
        assert other.status == "conflict"
        assert count(store, "fetch_attempt") == 1
        assert count(store, "quarantine") == 1  # the conflicting copy, kept whole
        with store.snapshot() as conn:
            assert conn.execute("SELECT http_status FROM fetch_attempt").fetchall() == [(200,)]


async def test_a_commit_that_failed_acks_nothing_and_redelivery_commits_once(
        store_kind: StoreKind, tmp_path: Path) -> None:
    with store_kind.open(tmp_path / "s") as store:
        make = Factory(store)
        await asubmit(store, [make.session(), make.run()])
        attempt = make.attempt()
        async with Writer(store) as writer:
            store_kind.fail_next_commit()
            with pytest.raises(CommitError):
                await writer.submit(attempt)
            assert count(store, "fetch_attempt") == 0
            assert (await writer.submit(attempt)).status == "committed"
        assert count(store, "fetch_attempt") == 1


async def test_a_batch_is_applied_on_the_event_loop_thread_only_when_every_step_is_local(
        store_kind: StoreKind, tmp_path: Path) -> None:
    """SQLite with payloads in local files applies a batch inline (no GIL hand-offs with a
    busy event loop; only its fsyncs wait on the writer's thread); a server database or an
    object store commits on the writer's thread, so the event loop goes on while a batch
    waits on the network."""
    threads: list[int] = []
    with store_kind.open(tmp_path / "s") as store:
        make = Factory(store)
        local = (isinstance(store.backend, SQLiteBackend)
                 and not isinstance(store.artifacts, S3ArtifactStore))
        async with Writer(store, hooks=WriterHooks(
                after_apply=lambda seq: threads.append(threading.get_ident()))) as writer:
            acks = await writer.submit_group([make.session(), make.run()])
        assert [a.status for a in acks] == ["committed", "committed"]
        assert (threads == [threading.get_ident()]) is local, (threads, local)


async def test_trying_to_begin_a_write_never_waits_for_a_lock_held_elsewhere(
        store_kind: StoreKind, tmp_path: Path) -> None:
    """``try_begin_write`` begins when the write lock is free; while another connection
    holds it, it says so at once (not after the busy or lock timeout, 5 s) with nothing
    begun, and waiting writes still wait (the timeout is left as it was)."""
    with store_kind.open(tmp_path / "s") as store:
        backend = store.backend
        mine, other = backend.connect_writer(), backend.connect_writer()
        try:
            assert backend.try_begin_write(mine) is True
            mine.execute("COMMIT")
            other.execute(backend.dialect.begin_write)
            started = time.monotonic()
            assert backend.try_begin_write(mine) is False
            assert time.monotonic() - started < 2.5  # half the timeout it did not wait
            assert mine.get_autocommit()  # nothing was begun
            released = threading.Timer(0.3, lambda: other.execute("COMMIT"))
            released.start()
            try:
                mine.execute(backend.dialect.begin_write)  # waits for the lock, then has it
            finally:
                released.join()
            mine.execute("COMMIT")
        finally:
            mine.close()
            other.close()


async def test_a_commit_whose_ack_was_lost_is_a_duplicate_when_redelivered(
        store_kind: StoreKind, tmp_path: Path) -> None:
    """The outcome of a COMMIT is what the store holds, not what the producer heard."""
    def lost(batch_seq: int) -> None:
        raise RuntimeError("the process died between COMMIT and the ack")

    with store_kind.open(tmp_path / "s") as store:
        make = Factory(store)
        await asubmit(store, [make.session(), make.run()])
        attempt = make.attempt()
        with pytest.raises(BaseException):  # noqa: B017 - the writer fails as a whole
            async with Writer(store, hooks=WriterHooks(after_commit=lost)) as writer:
                with pytest.raises(WriterClosedError):
                    await writer.submit(attempt)
        [ack] = await asubmit(store, [attempt])
        assert ack.status == "duplicate"
        assert count(store, "fetch_attempt") == 1


async def test_a_payload_is_referenced_only_once_its_store_holds_it(
        store_kind: StoreKind, tmp_path: Path) -> None:
    """Durable before referenced, through the writer, wherever the store keeps its payloads
    (its directory's packs, or an S3 bucket): a message naming a payload the artifact store
    does not hold is refused whole; once the payload is put, the same evidence commits."""
    with store_kind.open(tmp_path / "s") as store:
        make = Factory(store)
        await asubmit(store, [make.session(), make.run()])
        data = b"<p>not stored yet</p>"
        ref = ArtifactRef("body", blake3.blake3(data).hexdigest(), len(data))
        [ack] = await asubmit(store, [make.attempt(body=ref)])
        assert ack.status == "rejected"
        assert (count(store, "fetch_attempt"), count(store, "artifact")) == (0, 0)
        assert store.artifacts.put("body", data) == ref
        [ack] = await asubmit(store, [make.attempt(body=ref)])
        assert ack.status == "committed"
        assert (count(store, "fetch_attempt"), count(store, "artifact")) == (1, 1)
        assert store.artifacts.read(ref, verify=True) == data
