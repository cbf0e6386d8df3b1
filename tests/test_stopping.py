"""Deadlines and stopping (issue 13): a slow server never holds a fetch or a crawl.

A real dripping server on 127.0.0.1 (the test site's ``drip``: the head at once, then one
body byte every half second, for minutes) and real signals to a real ``evidence crawl``
subprocess. Exit times are measured from the signal and compared with generous bounds
(a minute at most, so that the rest of the suite's load beside them cannot break them):
the behaviour they guard against takes minutes.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest

from evidence import ArtifactStore, CrawlConfig, Crawler, CrawlOptions, Store
from evidence._crawl.fetch import fetch
from evidence._crawl.http import crawl_client
from evidence._demo.site import SiteConfig, TestSite

from .test_crawl import frontier_states, path_of

DRIP = {f"/p/{i}": 0.5 for i in range(8)}  # ~400-byte pages: minutes each


def _crawl(url: str, store: Path, *extra: str) -> subprocess.Popen:
    log = open(store.parent / "crawl-stderr.log", "a")  # noqa: SIM115 (the child owns it)
    proc = subprocess.Popen(
        [sys.executable, "-m", "evidence", "crawl", url, "--store", str(store),
         "--workers", "4", "--json", *extra],
        stdout=subprocess.PIPE, stderr=log, text=True)
    log.close()
    return proc


def _stderr(store: Path) -> str:
    return (store.parent / "crawl-stderr.log").read_text()


def _wait_fetching(site: TestSite, proc: subprocess.Popen, store: Path) -> None:
    """Until the crawl is inside a dripping fetch."""
    deadline = time.monotonic() + 60
    while not any(r.path.startswith("/p/") for r in site.requests):
        assert proc.poll() is None, _stderr(store)
        assert time.monotonic() < deadline, "the crawl never reached a dripping page"
        time.sleep(0.02)
    time.sleep(0.3)  # the head came; the body drips


def _exit_after(proc: subprocess.Popen, signals: list[tuple[float, int]],
                timeout: float = 120) -> tuple[float, dict]:
    """Send each (delay, signal) in turn; seconds from the last signal to the exit, and the
    crawl's JSON result. A crawl that outlives ``timeout`` is killed and fails the test."""
    for delay, sig in signals:
        time.sleep(delay)
        proc.send_signal(sig)
    sent = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the crawl was still running {timeout} s after the last signal")
    return time.monotonic() - sent, json.loads(out)


def _in_flight(store: Path) -> set[str]:
    return {p for p, (state, _r) in frontier_states(store).items() if state == "in_flight"}


def test_a_dripping_body_is_cut_at_the_deadline_and_recorded_as_a_timeout(
        tmp_path: Path) -> None:
    with TestSite(SiteConfig(pages=4, drip={"/p/0": 0.2})) as site:
        started = time.monotonic()
        with Store.create(tmp_path / "s") as store:
            result = anyio.run(Crawler(store, CrawlConfig(seeds=[site.url + "p/0"],
                                                          max_attempts=1),
                                       CrawlOptions(workers=1, timeout=5.0,
                                                    deadline=1.5)).run)
        took = time.monotonic() - started
    assert took < 45, "the crawl took as long as the server wanted (88 s)"
    with Store.open(tmp_path / "s") as store:
        [(outcome, status, error, truncated, elapsed, size)] = store.connection.execute(
            "SELECT f.outcome, f.http_status, f.error, f.body_truncated, f.elapsed_ms, "
            "b.size FROM fetch_attempt f JOIN artifact b ON b.artifact_id = f.body_id "
            "WHERE f.url LIKE '%/p/0'").fetchall()
    assert (outcome, status, truncated) == ("timeout", 200, 1)
    assert error == f"deadline: the fetch took longer than 1.5 s; {size} bytes of the body " \
                    "had come"
    assert 0 < size < 50, "what came is kept, and it is what the error says"
    assert 1500 <= elapsed < 45_000
    state, reason = frontier_states(tmp_path / "s")["/p/0"]
    assert state == "failed" and reason.startswith("timeout (deadline:"), \
        "a cut body is a transient failure, never a page done"
    assert result.outcome == "failed" and "no seed could be fetched" in result.reason


def test_a_head_that_never_ends_is_cut_at_the_deadline(tmp_path: Path) -> None:
    """A raw socket server sending the status line one byte at a time, forever."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"x" * 10_000:
                if stop.wait(0.1):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/"

    async def main():
        async with crawl_client(connections=1, timeout=5.0) as client:
            return await fetch(client, ArtifactStore(tmp_path / "a"), url=url, run_id="r",
                               sequence=1, user_agent="t", max_body_bytes=1000,
                               deadline=1.0)

    try:
        started = time.monotonic()
        result = anyio.run(main)
        took = time.monotonic() - started
    finally:
        stop.set()
        listener.close()
    assert result.attempt.outcome == "timeout" and result.status is None
    assert result.attempt.error == ("deadline: the fetch took longer than 1 s; no response "
                                    "head had come")
    assert result.attempt.request_headers is not None, "what was sent is still evidence"
    assert 1.0 <= took < 60, "the server sends its head for 1,000 s"


@pytest.mark.parametrize("processes", ["0", "2"])
def test_a_second_signal_cancels_in_flight_fetches_and_the_crawl_exits_at_once(
        tmp_path: Path, processes: str) -> None:
    store = tmp_path / "s"
    with TestSite(SiteConfig(pages=8, drip=DRIP)) as site:
        proc = _crawl(site.url, store, "--grace", "600", "--processes", processes)
        _wait_fetching(site, proc, store)
        after, result = _exit_after(proc, [(0, signal.SIGINT), (0.5, signal.SIGINT)])
    assert proc.returncode == 0, _stderr(store)
    assert after < 60, f"exited {after:.1f} s after the second Ctrl-C (the grace is 600 s)"
    assert result["outcome"] == "stopped"
    assert result["reason"].startswith("interrupted by Ctrl-C (SIGINT); in-flight fetches "
                                       "cancelled (interrupted by Ctrl-C (SIGINT) again)")
    claimed = _in_flight(store)
    assert claimed and all(p in DRIP for p in claimed), "cancelled fetches stay claimed"
    _requeued_by_the_next_run(store, site.url, claimed)


def test_the_first_signal_stops_within_the_grace_period(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with TestSite(SiteConfig(pages=8, drip=DRIP)) as site:
        proc = _crawl(site.url, store, "--grace", "2")
        _wait_fetching(site, proc, store)
        after, result = _exit_after(proc, [(0, signal.SIGINT)])
    assert proc.returncode == 0, _stderr(store)
    assert 1.5 <= after < 60, f"exited {after:.1f} s after Ctrl-C with --grace 2 (each " \
                              "page drips for minutes)"
    assert result["reason"] == ("interrupted by Ctrl-C (SIGINT); in-flight fetches cancelled "
                                "(the grace period of 2 s ended): their URLs are requeued by "
                                "the next run")
    assert "get 2 s to finish" in _stderr(store)
    assert _in_flight(store)


def test_evidence_stop_ends_a_crawl_held_by_a_slow_server_with_worker_processes(
        tmp_path: Path) -> None:
    store = tmp_path / "s"
    with TestSite(SiteConfig(pages=8, drip=DRIP)) as site:
        proc = _crawl(site.url, store, "--grace", "2", "--processes", "2")
        _wait_fetching(site, proc, store)
        stopper = subprocess.run([sys.executable, "-m", "evidence", "stop", str(store)],
                                 capture_output=True, text=True, timeout=30)
        assert stopper.returncode == 0, stopper.stderr
        after, result = _exit_after(proc, [])
    assert proc.returncode == 0, _stderr(store)
    assert after < 60, f"exited {after:.1f} s after 'evidence stop' with --grace 2 (each " \
                       "page drips for minutes)"
    assert result["reason"].startswith("stopped by SIGTERM ('evidence stop' or kill); "
                                       "in-flight fetches cancelled (the grace period")
    assert _in_flight(store)


def _requeued_by_the_next_run(store: Path, url: str, claimed: set[str]) -> None:
    """The next start requeues what a cancelled run left claimed (as after a crash)."""
    with Store.open(store) as s:
        crawler = Crawler(s, CrawlConfig(seeds=[url]), CrawlOptions(workers=4))
        crawler.request_stop("the test only wants the start")
        anyio.run(crawler.run)
    states = frontier_states(store)
    for path in claimed:
        state, reason = states[path]
        assert state == "queued" and reason.startswith(
            "requeued: in flight when an earlier run ended"), (path, state, reason)
    assert path_of(url) == "/"
