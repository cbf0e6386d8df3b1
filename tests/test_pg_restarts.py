"""PostgreSQL restarts and dropped sessions, for real (issue 29, point 6): the server stopped
with ``pg_ctl stop -m immediate`` and started again on the same socket, and a writer's
session ended with ``pg_terminate_backend``. A crawl (in one process and with worker
processes) pauses and goes on, each page fetched once; past ``--db-outage-deadline`` it
fails with a clear error and resumes later; an active ``evidence serve`` takes its lock
again at once, so a second one stays a standby; a standby and an idle service ride
through a restart."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from evidence import Store, verify
from evidence._demo.site import SiteConfig, TestSite
from evidence._store.pglock import WRITER_LOCK
from evidence.testing.pgcluster import PgCluster

from .conftest import Factory
from .test_crawl import done_pages
from .test_postgresql_failures import _Ready, _serve

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def own_cluster(pg_cluster) -> Iterator[PgCluster]:
    """A cluster of this module's own: these tests stop and start the server (each test
    has a database of its own in it)."""
    with PgCluster.start() as cluster:
        yield cluster


def restart(cluster: PgCluster) -> None:
    """A crash of the server (no checkpoint: WAL recovery at the start), then a start on the
    same socket and port."""
    cluster.stop_server("immediate")
    cluster.start_server()


def lock_holder_pid(cluster: PgCluster, dbname: str) -> int | None:
    """The pid (from its application name) of the process holding the writer lock."""
    out = cluster.sql(
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        f"WHERE l.locktype = 'advisory' AND l.granted AND l.classid = {WRITER_LOCK[0]} AND "
        f"l.objid = {WRITER_LOCK[1]} AND l.database = (SELECT oid FROM pg_database WHERE "
        f"datname = '{dbname}')", dbname).strip()
    return int(out.split("pid=")[1].split()[0]) if out else None


def wait_for(what: Callable[[], object], timeout: float, why: str) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, why
        time.sleep(0.05)


def _crawl(url: str, store: str, log: Path, *extra: str) -> subprocess.Popen[str]:
    with open(log, "a") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "evidence", "crawl", url, "--store", store, "--workers",
             "4", *extra], stdout=subprocess.PIPE, stderr=stderr, text=True)


@pytest.mark.parametrize(("processes", "restarts"), [("0", 5), ("2", 1)])
def test_a_crawl_rides_through_restarts_each_page_fetched_once(
        own_cluster: PgCluster, tmp_path: Path, processes: str, restarts: int) -> None:
    """Crashes of the server at spaced moments of one crawl (five in one process, one with
    worker processes): each time the crawl pauses (its log says since when the database
    is unreachable), reconnects with backoff and goes on. It completes, each page done
    once and requested once, and verify --full finds the store sound."""
    url = own_cluster.create_database(f"crawl{processes}")
    log = tmp_path / "crawl.log"
    pages = 25 * (restarts + 1)
    with TestSite(SiteConfig(pages=pages, slow={f"/p/{i}": 0.02 for i in range(pages)})
                  ) as site:
        proc = _crawl(site.url, url, log, "--artifacts", str(tmp_path / "art"),
                      "--processes", processes)
        done_restarts = 0
        for at in range(15, 25 * restarts, 25):
            wait_for(lambda at=at: len(site.requests) >= at or proc.poll() is not None, 60,
                     log.read_text())
            if proc.poll() is not None:
                break
            restart(own_cluster)
            done_restarts += 1
        proc.communicate(timeout=120)
        counts = site.request_counts()
        reachable = site.reachable_pages()
    text = log.read_text()
    assert proc.returncode == 0, text
    assert done_restarts == restarts, "the crawl ended before the last restart: make it longer"
    assert "database unreachable since" in text and "retrying" in text
    assert "Traceback" not in text
    done = done_pages(url)  # type: ignore[arg-type]
    assert set(done) == reachable
    assert all(n == 1 for n in done.values()), "each page is done exactly once"
    again = sum(n - 1 for p, n in counts.items() if p in reachable and n > 1)
    assert again == 0, f"{again} pages requested twice: a batch cut by a restart is " \
                       "written again, its pages are not fetched again"
    with Store.open(url) as store:
        report = verify(store, full=True)
        assert report.ok, report.findings
        with store.snapshot() as conn:
            assert conn.execute("SELECT count(*), min(outcome) FROM crawl_session"
                                ).fetchall()[0] == (1, "completed")


def test_past_the_outage_deadline_the_crawl_fails_clearly_and_resumes_later(
        own_cluster: PgCluster, tmp_path: Path) -> None:
    """The server stays down longer than --db-outage-deadline: the crawl fails with an
    Error/Try message naming the deadline (no traceback). Started again once the server is
    back, the session resumes and completes; nothing acknowledged was lost."""
    url = own_cluster.create_database("deadline")
    log = tmp_path / "crawl.log"
    with TestSite(SiteConfig(pages=40, slow={f"/p/{i}": 0.02 for i in range(40)})) as site:
        proc = _crawl(site.url, url, log, "--artifacts", str(tmp_path / "art"),
                      "--db-outage-deadline", "1.5")
        wait_for(lambda: len(site.requests) >= 15, 60, log.read_text())
        own_cluster.stop_server("immediate")
        started = time.monotonic()
        proc.communicate(timeout=60)
        took = time.monotonic() - started
        own_cluster.start_server()
        text = log.read_text()
        assert proc.returncode == 2, text
        error = text[text.index("Error:"):]
        assert "outage deadline of 1.5 s" in error and "the session stays open" in error
        assert "Try: once the server is back, resume: evidence crawl --store" in error
        assert "Traceback" not in text, text
        assert took < 30
        again = _crawl(site.url, url, log)  # resumes the open session
        again.communicate(timeout=120)
        assert again.returncode == 0, log.read_text()
        reachable = site.reachable_pages()
    done = done_pages(url)  # type: ignore[arg-type]
    assert set(done) == reachable and all(n == 1 for n in done.values())
    with Store.open(url) as store:
        assert verify(store, full=True).ok


def _stop(proc: subprocess.Popen[str] | None) -> None:
    if proc is None:
        return
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()


async def test_a_terminated_active_service_takes_its_lock_again_the_standby_stays_standby(
        own_cluster: PgCluster, tmp_path: Path) -> None:
    """The active service's server session is terminated while it is idle: it connects
    again and takes its writer lock again within a second or two, so a second service
    started then waits as a standby. Then the server restarts while nothing is connected
    to the first: it takes its lock back, the standby reconnects and stays a standby, and
    the next client's handshake is answered (the store's id is known without the server)
    and its messages commit. When the first stops, the standby takes over: it was alive
    all along."""
    from evidence.client import AsyncClient

    url = own_cluster.create_database("svc")
    with Store.create(url, artifacts=str(tmp_path / "art")) as store:
        make = Factory(store)
        messages = [make.session(), make.run()] + [
            make.attempt(f"http://example.com/{i}", body=make.body(b"page %d" % i))
            for i in range(4)]
    first = _serve(url, tmp_path / "a.sock", tmp_path / "a.log")
    second = None
    try:
        _Ready(first).wait(30)
        own_cluster.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                        f"application_name LIKE 'evidence pid={first.pid} %'", "svc")
        wait_for(lambda: lock_holder_pid(own_cluster, "svc") == first.pid, 10,
                 "the service did not take its lock again: " + (tmp_path / "a.log").read_text())
        second = _serve(url, tmp_path / "b.sock", tmp_path / "b.log")
        takeover = _Ready(second)
        wait_for(lambda: "standby" in (tmp_path / "b.log").read_text(), 30,
                 (tmp_path / "b.log").read_text())
        async with AsyncClient(tmp_path / "a.sock") as client:
            acks = await client.submit_group(messages[:3])
        assert [a.status for a in acks] == ["committed"] * 3

        await anyio.to_thread.run_sync(restart, own_cluster)
        wait_for(lambda: lock_holder_pid(own_cluster, "svc") == first.pid, 15,
                 (tmp_path / "a.log").read_text())
        async with AsyncClient(tmp_path / "a.sock") as client:
            acks = await client.submit_group(messages[3:])
        assert [a.status for a in acks] == ["committed"] * 3
        b_log = (tmp_path / "b.log").read_text()
        assert second.poll() is None and not takeover.event, b_log
        assert "connecting again" in b_log
        assert lock_holder_pid(own_cluster, "svc") == first.pid

        first.terminate()
        assert first.wait(30) == 0, (tmp_path / "a.log").read_text()
        assert takeover.wait(20)["socket"] == str(tmp_path / "b.sock")  # a live standby
        second.terminate()
        assert second.wait(30) == 0
    finally:
        _stop(first)
        _stop(second)
    with Store.open(url) as store:
        with store.snapshot() as conn:
            assert conn.execute("SELECT count(*) FROM ingest_ledger").fetchall()[0][0] == 6
        assert verify(store).ok


def test_a_service_whose_lock_was_taken_while_it_was_disconnected_stops(
        own_cluster: PgCluster, tmp_path: Path) -> None:
    """The active service's session is terminated, and in the same statement another
    session queues for the writer lock, so it has the lock before the service can connect
    again: the service finds its lock taken and stops (Error/Try, no traceback) instead of
    writing without it."""
    import psycopg

    url = own_cluster.create_database("lost")
    with Store.create(url, artifacts=str(tmp_path / "art")):
        pass
    service = _serve(url, tmp_path / "w.sock", tmp_path / "w.log")
    try:
        _Ready(service).wait(30)
        with psycopg.connect(url, autocommit=True) as other:
            other.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                f"application_name LIKE 'evidence pid={service.pid} %'")
            other.execute(f"SELECT pg_advisory_lock({WRITER_LOCK[0]}, {WRITER_LOCK[1]})")
            status = service.wait(30)
        text = (tmp_path / "w.log").read_text()
        assert status == 2, text
        assert "Error:" in text and "this writer stops and writes nothing more" in text, text
        assert "Traceback" not in text, text
    finally:
        _stop(service)
