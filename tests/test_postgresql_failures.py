"""PostgreSQL failures, for real (issue 16, part 1): the server stopped mid-batch with
``pg_ctl stop -m immediate`` and started again; the active writer service SIGKILLed while a
standby waits. Nothing acknowledged is lost, nothing is recorded twice, verify passes."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from evidence import Store, Writer, verify
from evidence._write.limits import WriterHooks
from evidence.testing.pgcluster import PgCluster

from .conftest import Factory

pytestmark = pytest.mark.anyio


@pytest.fixture
def own_cluster(pg_cluster) -> Iterator[PgCluster]:
    """A cluster of its own: these tests stop and start the server."""
    with PgCluster.start() as cluster:
        yield cluster


def count(store: Store, table: str) -> int:
    with store.snapshot() as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]


async def test_server_stopped_at_commit_the_writer_reconnects_and_commits_once(
        own_cluster: PgCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The server dies (immediate shutdown: no checkpoint, WAL recovery at start) just before
    a batch's COMMIT: the COMMIT fails with the connection; the writer reports it,
    reconnects with backoff while the server is down, reads the commit log (the batch is not
    there), applies the batch again and acknowledges it: each message once."""
    url = own_cluster.create_database("e")
    restarted = threading.Event()
    stopped = []

    def stop_then_restart(batch_seq: int) -> None:
        if batch_seq == 3 and not stopped:
            stopped.append(batch_seq)
            own_cluster.stop_server("immediate")

            def restart() -> None:
                time.sleep(1.0)
                own_cluster.start_server()
                restarted.set()
            threading.Thread(target=restart).start()

    caplog.set_level(logging.WARNING, logger="evidence")
    with Store.create(url, artifacts=str(tmp_path / "art")) as store:
        make = Factory(store)
        messages = [make.session(), make.run()] + [
            make.attempt(f"http://example.com/{i}", body=make.body(b"page %d" % i))
            for i in range(6)]
        async with Writer(store, hooks=WriterHooks(before_commit=stop_then_restart)) as writer:
            acks = [await writer.submit(m) for m in messages]
            stats = writer.statistics()
        assert restarted.wait(30)
        assert [a.status for a in acks] == ["committed"] * len(messages)
        assert [a.log_index for a in acks] == list(range(len(messages)))
        assert stats.reconnects >= 1 and stats.commit_errors == 0
        assert any("connection to the database was lost during COMMIT" in r.message
                   for r in caplog.records)
        assert any("had not committed: applying it again" in r.message for r in caplog.records)
        assert count(store, "ingest_ledger") == len(messages)
        assert count(store, "fetch_attempt") == 6
        assert verify(store).ok


async def test_server_stopped_at_random_moments_every_submission_resolves_once(
        own_cluster: PgCluster, tmp_path: Path) -> None:
    """Producers stream attempts while the server is stopped (immediately) and restarted
    three times, at whatever point the writer is in (BEGIN, a statement, COMMIT). Every
    submission ends acknowledged (committed, or as the commit log says for a batch whose
    COMMIT was in doubt); the ledger holds each message exactly once."""
    url = own_cluster.create_database("r")
    with Store.create(url, artifacts=str(tmp_path / "art")) as store:
        make = Factory(store)
        body = make.body(b"<html>x</html>")
        acked: dict[str, str] = {}
        outages_done = anyio.Event()
        async with Writer(store) as writer:
            await writer.submit_group([make.session(), make.run()])

            async def produce(k: int) -> None:
                for i in range(100_000):
                    if outages_done.is_set():
                        return
                    message = make.attempt(f"http://example.com/{k}/{i}", body=body)
                    acked[message.message_id] = (await writer.submit(message)).status

            async def outages() -> None:
                for _ in range(3):
                    before = len(acked)
                    while len(acked) < before + 50:  # mid-stream
                        await anyio.sleep(0.01)
                    await anyio.to_thread.run_sync(own_cluster.stop_server, "immediate")
                    await anyio.sleep(0.3)
                    await anyio.to_thread.run_sync(own_cluster.start_server)
                outages_done.set()

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(outages)
                    for k in range(4):
                        tg.start_soon(produce, k)
            stats = writer.statistics()
        assert len(acked) > 150 and set(acked.values()) <= {"committed", "duplicate"}
        assert stats.reconnects >= 3 and stats.commit_errors == 0
        assert count(store, "fetch_attempt") == len(acked)
        assert count(store, "ingest_ledger") == len(acked) + 2
        assert verify(store).ok


def _serve(url: str, socket_path: Path, log: Path) -> subprocess.Popen[str]:
    with open(log, "w") as stderr:  # the child has its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "evidence", "serve", url, "--socket", str(socket_path),
             "--json", "--batch-delay", "0"], stdout=subprocess.PIPE, stderr=stderr, text=True)


class _Ready:
    """Waits in a thread for the service's "ready" line (printed once it holds the writer
    lock and listens), noting when it came."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.event: dict = {}
        self.at = 0.0
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            if event.get("event") == "ready":
                self.at = time.monotonic()
                self.event = event
                return

    def wait(self, timeout: float) -> dict:
        self._thread.join(timeout)
        if not self.event:
            raise AssertionError(f"no ready line within {timeout} s (exit {self.proc.poll()})")
        return self.event


async def test_sigkill_of_the_active_writer_a_standby_takes_over_nothing_lost_or_twice(
        pg_url: str, tmp_path: Path) -> None:
    """Two `evidence serve` processes on one PostgreSQL store: the second waits as a
    standby on the writer lock. Producers stream through the socket; the active one is
    SIGKILLed mid-stream (its server session ends, which releases the lock); the standby
    takes over within seconds, binds the socket (the dead one's is stale), the clients
    reconnect and redeliver. Every message is acknowledged; each is in the ledger once."""
    from evidence.client import AsyncClient, ClientLimits

    with Store.create(pg_url, artifacts=str(tmp_path / "art")) as store:
        make = Factory(store)
        body = make.body(b"<html>page</html>")
        messages = [make.attempt(f"http://example.com/{i}", body=body) for i in range(600)]
        first = [make.session(), make.run()]
    sock = tmp_path / "w.sock"
    active = _serve(pg_url, sock, tmp_path / "a.log")
    standby = None
    try:
        _Ready(active).wait(30)
        standby = _serve(pg_url, sock, tmp_path / "b.log")
        takeover = _Ready(standby)
        deadline = time.monotonic() + 30
        while "standby" not in (tmp_path / "b.log").read_text():
            assert time.monotonic() < deadline, (tmp_path / "b.log").read_text()
            await anyio.sleep(0.05)
        acks: dict[str, str] = {}
        killed_at: list[float] = []

        async with AsyncClient(sock, limits=ClientLimits(reconnect_timeout=60)) as client:
            await client.submit_group(first)

            async def produce(part: list) -> None:
                for message in part:
                    acks[message.message_id] = (await client.submit(message)).status
                    if len(acks) == 150 and not killed_at:
                        os.kill(active.pid, signal.SIGKILL)
                        killed_at.append(time.monotonic())

            async with anyio.create_task_group() as tg:
                for k in range(8):
                    tg.start_soon(produce, messages[k::8])
            reconnects = client.statistics().connections - 1
        ready = takeover.wait(5)  # it printed its ready line when it took over
        assert ready["socket"] == str(sock)
        assert takeover.at - killed_at[0] < 5.0  # measured here: well under a second
        assert active.wait(10) == -signal.SIGKILL
        assert reconnects >= 1
        assert len(acks) == 600 and set(acks.values()) <= {"committed", "duplicate"}
        standby.send_signal(signal.SIGTERM)
        assert standby.wait(30) == 0
        with Store.open(pg_url) as store:
            assert count(store, "fetch_attempt") == 600
            assert count(store, "ingest_ledger") == 602
            with store.snapshot() as conn:
                ids = {m for (m,) in conn.execute("SELECT message_id FROM ingest_ledger")}
            assert set(acks) <= ids
            assert verify(store).ok
        assert "standby" in (tmp_path / "b.log").read_text()
    finally:
        for proc in (active, standby):
            if proc is not None:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                assert proc.stdout is not None
                proc.stdout.close()


def test_evidence_stop_signals_the_writer_service_of_a_postgresql_store(
        pg_url: str, tmp_path: Path) -> None:
    """`evidence stop URL` finds the writer lock's holder (pid and host from its connection)
    and sends it SIGTERM: the service drains and exits 0, and the lock is free again."""
    with Store.create(pg_url, artifacts=str(tmp_path / "art")):
        pass
    service = _serve(pg_url, tmp_path / "w.sock", tmp_path / "s.log")
    try:
        _Ready(service).wait(30)
        stop = subprocess.run([sys.executable, "-m", "evidence", "stop", pg_url],
                              capture_output=True, text=True, timeout=60)
        assert stop.returncode == 0, stop.stderr
        assert f"pid {service.pid}" in stop.stdout
        assert service.wait(30) == 0
        with Store.open(pg_url, read_only=True) as store:
            assert store.running_writer() is None
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()
        assert service.stdout is not None
        service.stdout.close()
