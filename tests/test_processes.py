"""``evidence crawl --processes N``: worker processes behind the writer service.

Real worker processes, killed with real signals; the test site's request log is the truth.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path

import pytest

from evidence import CrawlConfig, Store, check_log, decode_message
from evidence._demo.site import SiteConfig, TestSite

from .heldsite import HOLD_LIMIT, HeldSite
from .test_crawl import (
    _crawl_process,
    _stderr,
    assert_links_recorded,
    crawl,
    done_pages,
    frontier_states,
    path_of,
    reap_crawl_processes,  # noqa: F401 (an autouse fixture)
)


def _live(store: Path) -> dict:
    try:
        return json.loads((store / "live-stats.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _wait_for(what: str, check, proc, store: Path, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert proc.poll() is None, f"the crawl ended before {what}:\n{_stderr(store)}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _settlements(store: Path, text: str) -> list[str]:
    """Paths settled by a frontier message of the ledger whose reason contains ``text``
    (the frontier row itself keeps only its latest reason)."""
    with Store.open(store) as s:
        payloads = [p for (p,) in s.connection.execute(
            "SELECT payload FROM ingest_ledger WHERE kind = 'frontier'")]
    return [path_of(settled.url) for payload in payloads
            for settled in decode_message(payload).settled if text in settled.reason]


def _new_workers(store: Path, old: set[int]) -> set[int] | None:
    """The crawl's two worker processes once neither is one of ``old``."""
    pids = set(_live(store).get("worker_pids", [])) - old
    return pids if len(pids) == 2 else None


def _open_files(pid: int) -> list[str]:
    """What the process has open (targets of /proc/PID/fd)."""
    out = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            out.append(os.readlink(fd))
        except OSError:
            continue
    return out


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for a reaper (it runs no code either way)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_crawl_in_worker_processes_records_every_page_once(tmp_path: Path) -> None:
    with TestSite(SiteConfig(pages=80)) as site:
        result = crawl(tmp_path / "s", CrawlConfig(seeds=[site.url]), workers=6, processes=2)
        counts = site.request_counts()
        reachable = site.reachable_pages()
        disallowed = site.disallowed_paths()
    assert result.outcome == "completed" and result.session_completed
    done = done_pages(tmp_path / "s")
    assert set(done) == reachable
    assert all(n == 1 for n in done.values())
    assert all(counts[p] == 1 for p in reachable), "no page requested twice"
    assert all(counts[p] == 0 for p in disallowed)
    assert counts["/robots.txt"] == 1, "robots.txt is the parent's, fetched once"
    assert_links_recorded(tmp_path / "s", site)
    with Store.open(tmp_path / "s") as store:
        assert check_log(store.connection)[2] == []


@pytest.mark.slow
def test_a_killed_worker_process_loses_only_its_in_flight_pages(tmp_path: Path) -> None:
    store = tmp_path / "s"
    # Every worker always has pages in flight, and a page spends far longer being fetched
    # (0.2 s) than being committed: a kill finds the victim mid-fetch, not between its
    # commit and its answer (with 0.05 s pages it sometimes did, on a loaded machine).
    slow = {f"/p/{i}": 0.2 for i in range(150)}
    with TestSite(SiteConfig(pages=150, slow=slow)) as site:
        proc = _crawl_process(site.url, store, "--processes", "2")
        pids = _wait_for("two worker processes and 30 pages", lambda: (
            _live(store).get("counts", {}).get("done", 0) >= 30
            and len(_live(store).get("worker_pids", [])) == 2
            and _live(store)["worker_pids"]), proc, store)
        _wait_for("four fetches in progress", lambda: sum(
            1 for r in site.requests if r.status is None) >= 4, proc, store)
        victim = pids[0]
        os.kill(victim, signal.SIGKILL)
        proc.communicate(timeout=120)
        assert proc.returncode == 0, _stderr(store)
        counts = site.request_counts()
        reachable = site.reachable_pages()
    log = _stderr(store)
    assert f"pid {victim} was killed by signal 9" in log
    assert log.count("worker process 0 started") + log.count("worker process 1 started") == 3
    done = done_pages(store)
    assert set(done) == reachable
    assert all(n == 1 for n in done.values()), "no page recorded twice"
    assert_links_recorded(store, site)
    requeued = _settlements(store, f"pid {victim}) was killed")
    assert requeued, "the dead worker's in-flight pages were requeued"
    twice = [p for p in reachable if counts[p] > 1]
    assert set(twice) <= set(requeued), "only the dead worker's pages are requested again"
    assert len(twice) <= 16, "at most the pages on their way (4 x --workers 4) again"
    with Store.open(store) as s:
        assert check_log(s.connection)[2] == []
        assert s.connection.execute(
            "SELECT outcome FROM crawl_session").fetchall() == [("completed",)]


def _in_flight(store: Path) -> int:
    """URLs the store shows claimed and not settled (a read that never blocks the crawl)."""
    with Store.open(store, read_only=True) as s:
        return s.connection.execute(
            "SELECT count(*) FROM frontier WHERE state = 'in_flight'").fetchall()[0][0]


def _a_request_can_follow(store: Path, site: TestSite) -> bool:
    """Whether, with every commit held, the one fetch slot has a URL to request: one the
    store shows claimed (in flight) that the site has not been asked for, and that
    robots.txt allows. A URL robots.txt refuses is claimed like any other, then settled
    without a request: with only such a URL claimed, nothing can be requested until a
    commit claims the next one (the slot itself is free: the refusal gives it back before
    it commits)."""
    with Store.open(store, read_only=True) as s:
        in_flight = {"/" + url.split("/", 3)[3] for (url,) in s.connection.execute(
            "SELECT url FROM frontier WHERE state = 'in_flight'").fetchall()}
    return bool(in_flight - {r.path for r in site.requests} - site.disallowed_paths())


def _crawl_holding_the_write_lock(
        store: Path, hold: Callable[[subprocess.Popen, Callable[[], int]], None],
        *args: str, free_url: bool = False) -> tuple[list, Counter[str], frozenset[str]]:
    """Crawl an 80-page slow site at one fetch slot (``args`` added) and, 10 pages in,
    hold the database's write lock while ``hold(crawl_process, requested)`` runs
    (``requested()``: how many requests the site has had since the lock was taken):
    every commit of the crawl waits meanwhile. Returns the requests made while it was
    held, and, once the crawl has completed, the site's request counts and its reachable
    pages."""
    slow = {f"/p/{i}": 0.05 for i in range(80)}
    with TestSite(SiteConfig(pages=80, slow=slow)) as site:
        proc = _crawl_process(site.url, store, *args, "--workers", "1")
        try:
            return _hold_the_lock(store, site, proc, hold, free_url)
        finally:  # a failed wait leaves no crawl running into the next test's teardown
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


def _hold_the_lock(store: Path, site: TestSite, proc: subprocess.Popen,
                   hold: Callable[[subprocess.Popen, Callable[[], int]], None],
                   free_url: bool) -> tuple[list, Counter[str], frozenset[str]]:
    """The body of ``_crawl_holding_the_write_lock`` once the crawl runs."""
    import apsw

    _wait_for("10 pages", lambda: _live(store).get("counts", {}).get("done", 0) >= 10,
              proc, store)
    # The lock is taken while a page is being answered (each takes 0.05 s), half-way:
    # by then its slot's next URL has been claimed (one quick commit). Taken at any
    # moment, it could catch that claim's own commit, and then no URL would be free
    # to request while it is held.
    started = len(site.requests)
    _wait_for("a request", lambda: len(site.requests) > started, proc, store)
    # Taken once the store shows the next URL claimed too (two in flight), not after a
    # fixed sleep: on a loaded machine 25 ms could pass before that claim committed.
    _wait_for("the next URL claimed", lambda: _in_flight(store) >= 2, proc, store)
    lock = apsw.Connection(str(store / "evidence.db"))
    try:
        lock.set_busy_timeout(10_000)  # the crawl's writer may be mid-commit: wait for it
        lock.execute("BEGIN IMMEDIATE")  # every commit of the crawl waits from here
        # ``free_url``: the lock must catch a URL claimed and not yet requested (the claim
        # committed) that robots.txt allows: with none, no request can follow whatever the
        # crawl does, so a loaded machine that moved on between the wait above and the
        # lock, or a lock that caught /private/a claimed, tries again.
        for _ in range(50):
            # Counted from before the check: a claimed URL the check saw not yet requested
            # may be requested before the count is read (the site logs a request as it
            # begins); counted after, that request was missed and none could follow it.
            before = len(site.requests)
            if not free_url or _a_request_can_follow(store, site):
                break
            lock.execute("COMMIT")
            _wait_for("another request", functools.partial(
                lambda n: len(site.requests) > n, len(site.requests)), proc, store)
            lock.execute("BEGIN IMMEDIATE")
        else:
            raise AssertionError("the lock never caught a moment a request could follow")
        hold(proc, lambda: len(site.requests) - before)
        after = len(site.requests)
        lock.execute("COMMIT")
    finally:
        lock.close()
    proc.communicate(timeout=120)
    assert proc.returncode == 0, _stderr(store)
    # Read once the crawl is over: a request made while the lock was held may still
    # have been in its slow answer when the lock was let go (its status not chosen yet).
    held = site.requests[before:after]
    return held, site.request_counts(), site.reachable_pages()


def test_a_worker_process_requests_its_next_page_while_the_last_one_commits(
        tmp_path: Path) -> None:
    """A page committing in a worker process no longer holds its fetch slot, and the slot's
    next URL is claimed while it fetches: with every commit held up (the test holds the
    database's write lock), the next pages are still requested, one at a time. Before,
    a worker's slot stayed taken until its page had committed: nothing was requested.
    The lock is taken only where a request can follow (``_a_request_can_follow``: not
    where the one URL claimed is one robots.txt refuses); a refused page behind which a
    URL waits gives its slot back before it commits (the test below)."""
    store = tmp_path / "s"

    def hold(proc: subprocess.Popen, requested: Callable[[], int]) -> None:
        # Waits for the first request on state (a fixed sleep saw none on a loaded
        # machine), then gives more requests a second to show: the bound below says they
        # stay one at a time. A slow machine can only make that second see fewer.
        _wait_for("a request while the lock is held", requested, proc, store)
        time.sleep(1.0)

    held, counts, reachable = _crawl_holding_the_write_lock(
        store, hold, "--processes", "1", free_url=True)
    assert 1 <= len(held) <= 3, f"requested while no page could commit: {held}"
    # Answered, whatever the answer: a redirect (/moved) or a 404 (/missing/a) may be next.
    assert all(r.status is not None for r in held), "each answered while the commits waited"
    assert set(done_pages(store)) == reachable
    assert all(counts[p] == 1 for p in reachable), "no page requested twice"


def test_one_process_goes_on_while_its_writer_waits_for_the_write_lock(
        tmp_path: Path) -> None:
    """In one process the writer applies batches on the event loop's thread; one that
    would wait for the database's write lock (held here by the test, as by an operator's
    command) waits on the writer's thread instead: the crawl's event loop goes on (its
    progress file is rewritten each second), requests at most the pages already claimed
    (two per fetch slot, docs/crawling.md), and the crawl completes once the lock is
    free. Before, the loop stood still for the busy timeout (5 s per try)."""
    store = tmp_path / "s"
    reports: list[bool] = []

    def hold(proc: subprocess.Popen, _requested: Callable[[], int]) -> None:
        first = _wait_for("a progress report", lambda: _live(store).get("elapsed"),
                          proc, store)
        reports.append(_wait_for("another progress report while the lock is held",
                                 lambda: (_live(store).get("elapsed") or 0) > first + 0.5,
                                 proc, store, timeout=4.0))

    held, counts, reachable = _crawl_holding_the_write_lock(store, hold)
    assert reports == [True]
    assert len(held) <= 2 + 1, f"requested while no page could commit: {held}"
    assert set(done_pages(store)) == reachable
    assert all(counts[p] == 1 for p in reachable), "no page requested twice"


class _GatedSite(TestSite):
    """A ``TestSite`` that holds each request for one of ``gated`` until ``open(path)``
    (or ``HOLD_LIMIT`` seconds, so a failing test never hangs)."""

    __test__ = False

    def __init__(self, config: SiteConfig, gated: Iterable[str]) -> None:
        super().__init__(config)
        self._gates = {path: threading.Event() for path in gated}

    def open(self, path: str) -> None:
        self._gates[path].set()

    def stop(self) -> None:
        for gate in self._gates.values():
            gate.set()
        super().stop()

    def _respond(self, method: str, path: str, headers: Mapping[str, str]):  # type: ignore[no-untyped-def]
        gate = self._gates.get(path)
        if gate is not None:
            gate.wait(HOLD_LIMIT)
        return super()._respond(method, path, headers)


@pytest.mark.parametrize("processes", [0, 1])
def test_a_page_robots_txt_refuses_gives_its_fetch_slot_back_before_it_commits(
        tmp_path: Path, processes: int) -> None:
    """A page settled without a request (robots.txt refuses it) no longer holds its
    host's fetch slot while its settlement commits: the URL claimed behind it is
    requested although every commit waits (the test holds the database's write lock).
    Before, the refusal kept the slot until it had committed, and the claimed URL behind
    it waited for as long as the lock was held: the state in which
    ``test_a_worker_process_requests_its_next_page_while_the_last_one_commits`` now and
    then saw no request at all.

    Every step waits on state: two fetch slots on one host, both held by a request the
    site holds (/p/1, /p/2), the refused URL (/private/a) and the next one (/p/3) claimed
    behind them, in that order (a freed slot goes to the first that waits). The lock is
    taken, /p/1 is answered: its slot goes to /private/a, refused, whose settlement
    waits for the lock; /p/3 must still be requested while the lock is held."""
    import anyio
    import apsw

    from evidence import Crawler, CrawlOptions

    store_path = tmp_path / "s"
    with _GatedSite(SiteConfig(pages=4), gated=["/p/1", "/p/2"]) as site:
        config = CrawlConfig(seeds=[site.url + p for p in ("p/1", "p/2", "private/a", "p/3")],
                             max_depth=0)

        def requested() -> set[str]:
            return {r.path for r in site.requests}

        async def until(check: Callable[[], bool], timeout: float = 60.0) -> None:
            with anyio.fail_after(timeout):
                while not check():
                    await anyio.sleep(0.01)

        def claimed() -> set[str]:
            with Store.open(store_path, read_only=True) as s:
                return {path_of(u) for (u,) in s.connection.execute(
                    "SELECT url FROM frontier WHERE state = 'in_flight'")}

        async def hold_the_lock() -> set[str]:
            await until(lambda: requested() >= {"/p/1", "/p/2"})
            assert claimed() == {"/p/1", "/p/2", "/private/a", "/p/3"}
            lock = apsw.Connection(str(store_path / "evidence.db"))
            try:
                lock.set_busy_timeout(10_000)  # the crawl's writer may be mid-commit
                await anyio.to_thread.run_sync(lock.execute, "BEGIN IMMEDIATE")
                site.open("/p/1")
                try:  # well inside the crawl's own patience with the lock (6 x 60 s)
                    await until(lambda: "/p/3" in requested(), 30.0)
                except TimeoutError:
                    raise AssertionError("/p/3 was not requested while the lock was held: "
                                         "the refused page kept the fetch slot") from None
                held = requested()
                lock.execute("COMMIT")
            finally:
                lock.close()
                site.open("/p/2")
            return held

        async def main() -> tuple[object, set[str]]:
            with Store.create(store_path, busy_timeout_ms=60_000) as store:
                # The held /p/2 must not time out meanwhile (its slot would free): a
                # read may wait longer than this test waits for /p/3.
                crawler = Crawler(store, config, CrawlOptions(
                    workers=2, processes=processes, timeout=HOLD_LIMIT, deadline=HOLD_LIMIT))
                outcome: list[object] = []
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_into, outcome, crawler.run())
                    held = await hold_the_lock()
                return outcome[0], held

        result, held = anyio.run(main)
        counts = site.request_counts()
    assert held == {"/robots.txt", "/p/1", "/p/2", "/p/3"}
    assert result.outcome == "completed", result.reason  # type: ignore[attr-defined]
    assert set(done_pages(store_path)) == {"/p/1", "/p/2", "/p/3"}
    assert counts["/private/a"] == 0
    assert frontier_states(store_path)["/private/a"][0] == "skipped"


async def _into(out: list[object], work: Awaitable[object]) -> None:
    out.append(await work)


@pytest.mark.slow
def test_killing_the_crawl_ends_its_workers_and_a_restart_resumes(tmp_path: Path) -> None:
    store = tmp_path / "s"
    # 60 pages of 0.1 s at 4 workers: at least 1.5 s, so the kill lands mid-crawl (with
    # 0.03 s the crawl could end before the progress file said 20 pages were done).
    slow = {f"/p/{i}": 0.1 for i in range(0, 120, 2)}
    with TestSite(SiteConfig(pages=120, slow=slow)) as site:
        proc = _crawl_process(site.url, store, "--processes", "2")
        pids = _wait_for("worker processes at work", lambda: (
            _live(store).get("counts", {}).get("done", 0) >= 20
            and _live(store).get("worker_pids")), proc, store)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        deadline = time.monotonic() + 10
        while not all(_dead(pid) for pid in pids):
            assert time.monotonic() < deadline, "worker processes outlived their crawl"
            time.sleep(0.02)
        assert "Traceback" not in _stderr(store), "a worker's end is not an error"
        requested = set(site.request_counts())
        claimed = {p for p, (state, _r) in frontier_states(store).items()
                   if state == "in_flight"}
        # Claims ahead are bounded: at most one URL per fetch slot waits claimed (two when
        # a slot's request just ended), so a kill leaves at most 2 x --workers 4 of them.
        assert len(claimed - requested) <= 8, sorted(claimed - requested)
        proc = _crawl_process(site.url, store, "--processes", "2")
        proc.communicate(timeout=120)
        assert proc.returncode == 0, _stderr(store)
        counts = site.request_counts()
        reachable = site.reachable_pages()
    done = done_pages(store)
    assert set(done) == reachable
    assert all(n == 1 for n in done.values())
    # Requested again: what was on its way, fetched but not committed (with worker
    # processes up to 4 pages per fetch slot: claimed, fetching or committing).
    assert sum(n - 1 for p, n in counts.items() if p in reachable) <= 16
    assert_links_recorded(store, site)


_STARTING_PARENT = """
import os, socket, subprocess, sys, time
import msgspec
from evidence._crawl.frontier import CrawlConfig
from evidence._crawl.workerchannel import Setup
from evidence._crawl.workers import worker_command
from evidence._write.wire import encode_frame
ours, theirs = socket.socketpair()
child = subprocess.Popen(worker_command(theirs.fileno()), pass_fds=[theirs.fileno()],
                         env={**os.environ, "PYTHONPATH": sys.argv[3]})
theirs.close()
config = msgspec.to_builtins(CrawlConfig(seeds=["http://127.0.0.1:9/"]))
ours.sendall(encode_frame(Setup(store=sys.argv[1], socket=sys.argv[2], config=config,
                                session_id="s", run_id="r", connections=1, timeout=5.0)))
print(child.pid, flush=True)
time.sleep(600)
"""


def test_a_worker_process_still_starting_ends_with_its_killed_crawl(tmp_path: Path) -> None:
    """A worker process still starting (here: connecting to a writer service that never
    answers, which it retries for a minute) reads no channel that would tell it its crawl
    is gone. Killed then, the crawl left it running for that minute, holding the crawl's
    output pipe (a restart test waited on it under load). The kernel now ends it with its
    crawl. The crawl here is a stand-in that starts the worker as the crawl does
    (``worker_command``) and sends it its setup."""
    store = tmp_path / "s"
    Store.create(store).close()
    root = str(Path(__file__).resolve().parent.parent)
    with socket.socket(socket.AF_UNIX) as service, subprocess.Popen(
            [sys.executable, "-c", _STARTING_PARENT, str(store),
             str(tmp_path / "writer.sock"), root], stdout=subprocess.PIPE, text=True) as parent:
        service.bind(str(tmp_path / "writer.sock"))
        service.listen()
        service.settimeout(120)
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        connection, _ = service.accept()  # the worker is connecting: it has its setup
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 20
        while not _dead(worker):
            assert time.monotonic() < deadline, "the worker process outlived its crawl"
            time.sleep(0.05)
        connection.close()


@pytest.mark.slow
def test_a_page_that_kills_its_worker_every_time_ends_failed(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with TestSite(SiteConfig(pages=10, kill_paths={"/p/5"}, hold_seconds=30)) as site:
        proc = _crawl_process(site.url, store, "--processes", "2")
        killed: set[int] = set()
        for claim in range(1, 4):  # default --max-attempts 3
            _wait_for(f"request {claim} of /p/5",
                      lambda c=claim: site.request_counts()["/p/5"] >= c, proc, store)
            pids = _wait_for("two new worker processes", functools.partial(
                _new_workers, store, set(killed)), proc, store)
            for pid in pids:  # whichever holds /p/5 dies with it
                os.kill(pid, signal.SIGKILL)
            killed |= pids
        proc.communicate(timeout=60)
        assert proc.returncode == 0, _stderr(store)
        assert site.request_counts()["/p/5"] == 3, "never requested a fourth time"
    state, reason = frontier_states(store)["/p/5"]
    assert state == "failed"
    assert reason.startswith("attempts exhausted: claimed 3 times without a result")
    assert "was killed by signal 9" in reason


def test_status_shows_the_workers_and_stop_ends_them_gracefully(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with HeldSite(SiteConfig(pages=40)) as site:  # still crawling when stop gets there
        proc = _crawl_process(site.url, store, "--processes", "2", "--json")
        try:
            site.wait_for_request("/p/0", timeout=60)
            # Both started: with one, status (run next) could list the other too.
            pids = _wait_for("the two worker processes", lambda: (
                len(_live(store).get("worker_pids", [])) == 2
                and _live(store)["worker_pids"]), proc, store)
            opened = {pid: _open_files(pid) for pid in pids}
            shown = subprocess.run([sys.executable, "-m", "evidence", "status", str(store)],
                                   capture_output=True, text=True, timeout=60)
            stopper = subprocess.run([sys.executable, "-m", "evidence", "stop", str(store)],
                                     capture_output=True, text=True, timeout=60)
        finally:
            site.release()  # the in-flight fetches finish within the grace period
        out, _err = proc.communicate(timeout=60)
    assert stopper.returncode == 0, stopper.stderr
    assert proc.returncode == 0, _stderr(store)
    assert '"outcome":"stopped"' in out
    assert "worker processes, pids " + ", ".join(map(str, pids)) in shown.stdout
    for pid, files in opened.items():  # claims and results go through the service
        assert files, f"could not list worker {pid}'s open files"
        assert not [f for f in files if "evidence.db" in f], f"worker {pid} opened the database"
    assert all(_dead(pid) for pid in pids), "the workers end with their crawl"
    states = frontier_states(store)
    assert not any(s == "in_flight" for s, _r in states.values()), \
        "the workers finished their pages and the crawl committed them"


def test_a_worker_process_that_cannot_start_fails_the_pool_without_a_hang(
        tmp_path: Path) -> None:
    """The children start in the background; one that dies before it is ready (here: the
    store it is given does not exist) makes ``page`` raise, never wait forever."""
    import anyio

    from evidence._crawl.pages import PageOrder
    from evidence._crawl.workerchannel import Setup
    from evidence._crawl.workers import WorkerPool
    from evidence._errors import EvidenceError

    setup = Setup(store=str(tmp_path / "missing"), socket=str(tmp_path / "no-service.sock"),
                  config=CrawlConfig(seeds=["http://127.0.0.1:9/"]).as_record(),
                  session_id="s", run_id="r", connections=2, timeout=5.0)
    order = PageOrder(url="http://127.0.0.1:9/", depth=0, attempts=0, via="seed")

    async def main() -> tuple[list[int], str]:
        pool = WorkerPool(2, setup)
        with anyio.fail_after(60):
            with pytest.raises(EvidenceError) as raised:
                async with pool:
                    pids = pool.pids  # entering did not wait for the children
                    await pool.page(order)
        return pids, str(raised.value)

    pids, message = anyio.run(main)
    assert pids == []
    assert "did not start" in message


def test_a_worker_process_that_cannot_open_its_store_says_why_without_a_traceback(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """What a child that cannot start prints (on the crawl's stderr, which it shares): one
    error line naming the cause, never a traceback. Seen in a full run: a worker process
    still opening an object store that had just gone down printed the S3 error's whole
    chain of tracebacks into a crawl whose own error was one clean line."""
    import anyio

    from evidence._crawl.pages import PageOrder
    from evidence._crawl.workerchannel import Setup
    from evidence._crawl.workers import WorkerPool
    from evidence._errors import EvidenceError

    setup = Setup(store=str(tmp_path / "missing"), socket=str(tmp_path / "no-service.sock"),
                  config=CrawlConfig(seeds=["http://127.0.0.1:9/"]).as_record(),
                  session_id="s", run_id="r", connections=2, timeout=5.0)
    order = PageOrder(url="http://127.0.0.1:9/", depth=0, attempts=0, via="seed")

    async def main() -> None:
        with anyio.fail_after(60), pytest.raises(EvidenceError, match="did not start"):
            async with WorkerPool(1, setup) as pool:
                await pool.page(order)

    anyio.run(main)
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    said = [line for line in err.splitlines() if "[worker pid" in line]
    assert len(said) == 1 and " ERROR " in said[0] and "could not go on" in said[0], err
    assert str(tmp_path / "missing") in said[0], err


def test_a_child_still_starting_when_the_pool_closes_is_no_failure(tmp_path: Path) -> None:
    """A run can end before its worker processes are ready (nothing left to fetch after a
    resume; a new interpreter takes about half a second): a child that then never gets
    ready was stopped by the end of the run, and leaving the pool does not fail."""
    import anyio

    from evidence._crawl.workerchannel import Setup
    from evidence._crawl.workers import WorkerPool

    setup = Setup(store=str(tmp_path / "missing"), socket=str(tmp_path / "no-service.sock"),
                  config=CrawlConfig(seeds=["http://127.0.0.1:9/"]).as_record(),
                  session_id="s", run_id="r", connections=2, timeout=5.0)

    async def main() -> int:
        with anyio.fail_after(60):
            async with WorkerPool(2, setup) as pool:
                while len(pool._children) < 2:  # spawned, not ready
                    await anyio.sleep(0.005)
                return len(pool.pids)

    assert anyio.run(main) == 0


def test_a_task_groups_evidence_error_is_reported_as_itself() -> None:
    """What the CLI prints and a failed run records: the error, not its task group."""
    from evidence._errors import EvidenceError, only_evidence_error

    error = EvidenceError("worker process 0 (pid 1) did not start", hint="h")
    assert only_evidence_error(error) is error
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [error])])
    assert only_evidence_error(nested) is error
    assert only_evidence_error(ExceptionGroup("g", [error, ValueError("bug")])) is None
    assert only_evidence_error(ValueError("bug")) is None
