"""The scheduler: which queued URLs this run claims next, and the pages it has claimed.

The frontier (in the store) is read in short queries into per-host queues (``refill``);
``claim`` takes what per-host politeness allows from them (``--per-host``, ``--delay``,
robots.txt ``Crawl-delay``, a host's backoff, a retry's due time) and counts each URL
claimed. The engine (``_crawl.crawler``) commits the claims, hands the jobs to its worker
tasks, and tells the scheduler where each page is on its way: ``take`` (a worker task
starts it), ``committing`` (its request is over: its fetch slot is free while the page is
parsed and commits), ``ride`` (a worker's next URL claimed in its page's group),
``finish`` (the worker goes on with that next URL, if one rode).

The counters and how they relate (``check`` asserts it at every change, and the docs say
it in docs/design.md, "The crawler"):

    claimed  = ahead + riding + working    URLs this run claimed and did not finish
    ahead   >= 0                           claimed by the scheduler, no worker task yet
    riding  <= settling <= working          a next claim rides a page that commits
    ahead + working <= tasks                pages on their way, with those claimed ahead
    claimed <= 2 * tasks                    (follows: what a kill leaves claimed)
    pending  = the jobs in the host queues  read from the frontier, not claimed
    active   = claimed - settling           per host, summed: claims not yet requested
                                            or still requesting
    documents <= max_documents              pages this run counts toward its cap

``tasks`` is the engine's number of worker tasks: 2 x ``--workers`` in one process,
4 x ``--workers`` with worker processes (whose pages never carry a next claim).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import apsw

from .._model.messages import parse_time_text, utc_now
from .._model.urls import url_host
from .._store.db import Store
from . import frontier

__all__ = ["CLAIMED_PER_FETCH", "PAGES_PER_FETCH", "PAGES_PER_FETCH_IN_WORKERS",
           "CountsBroken", "Host", "Job", "Scheduler"]

# Per --workers fetch: URLs claimed ahead (the one it requests and its next), and pages on
# their way (claimed, fetching, or committing: in this process, or in a worker process
# where a page also waits for its worker).
CLAIMED_PER_FETCH = 2
PAGES_PER_FETCH = 2
PAGES_PER_FETCH_IN_WORKERS = 4

_READ = 1000  # frontier rows per refill query


@dataclass
class Job:
    """A claimed URL on its way through the scheduler and a worker. It carries its fetch
    key (read with it from the frontier) and host, so no stage computes them again."""

    url: str
    depth: int
    attempts: int  # claims before this one
    via: str
    key: str
    host: str
    not_before: float = 0.0  # monotonic


@dataclass
class Host:
    jobs: collections.deque[Job] = field(default_factory=collections.deque)
    active: int = 0  # claimed and not finished (fetching, or waiting for a worker)
    next_start: float = 0.0  # monotonic: when the scheduler may claim for it again
    next_request: float = 0.0  # monotonic: when a worker may send its next request
    slots: anyio.Semaphore | None = None  # per-host concurrency, taken by workers
    requests: int = 0  # of its slots, those held by a page requesting (``_crawl.slots``)
    backoff_until: float = 0.0  # monotonic: the host backs off (429/503, robots.txt down)


class CountsBroken(AssertionError):
    """The scheduler's counters left the relation its docstring states (a bug)."""


class Scheduler:
    """Per-host queues of queued URLs, the claims made from them, and the pages claimed.

    ``delay(host)`` is the politeness delay between request starts on a host;
    ``crawl_delay`` gives robots.txt's Crawl-delay for a host, if it has one.
    """

    # Check the sums over every host too, not just the totals (O(hosts) per change): the
    # test suite turns this on (tests/conftest.py).
    thorough = False

    def __init__(self, *, workers: int, per_host: int | None = None, delay: float = 0.0,
                 tasks: int, max_documents: int | None = None,
                 crawl_delay: Callable[[str], float | None] = lambda host: None) -> None:
        self.workers = workers
        self.per_host = per_host or workers
        self.min_delay = delay
        self.tasks = tasks
        self.cap = max_documents
        self.crawl_delay = crawl_delay
        self.hosts: dict[str, Host] = {}
        self.pending = 0  # read from the frontier, waiting in a host queue
        self.claimed = 0  # claimed by this run and not finished (the frontier's in flight)
        self.riding = 0  # of those, claimed with a page still committing (``ride``)
        self.working = 0  # of those, held by a worker task (fetching or committing)
        self.settling = 0  # of those, whose request is over: parsed and committing
        self.documents = 0  # pages this run counts toward --max-documents
        self.cursor = 0
        self.exhausted = False  # the last read of the frontier found no more rows

    # --- what is queued ---------------------------------------------------------------

    def host(self, name: str) -> Host:
        if name not in self.hosts:
            self.hosts[name] = Host()
        return self.hosts[name]

    def add(self, job: Job) -> None:
        self.host(job.host).jobs.append(job)
        self.pending += 1
        self.check()

    async def refill(self, store: Store, reader: apsw.Connection, session_id: str,
                     url_keys: dict[str, str]) -> None:
        """Read queued URLs after the cursor into the host queues, when they run low."""
        if self.pending >= self.workers * 8 or self.exhausted:
            return
        if store.backend.local:
            rows = frontier.queued_after(reader, session_id, self.cursor, _READ)
        else:  # a server: the read may wait out a restart, which must not stall the loop
            rows = await anyio.to_thread.run_sync(
                frontier.queued_after, reader, session_id, self.cursor, _READ)
        for row in rows:
            self.cursor = row.frontier_id
            not_before = parse_time_text(row.not_before)
            wait = 0.0 if not_before is None else (not_before - utc_now()).total_seconds()
            url_keys[row.url] = row.key  # the claim's key, for the writer
            self.add(Job(row.url, row.depth, row.attempts, row.via, row.key,
                         url_host(row.key), time.monotonic() + max(0.0, wait)))
        self.exhausted = len(rows) < _READ

    def reread(self) -> bool:
        """Whether the frontier is worth one more read from its start (retries queued
        behind the cursor): once, when nothing is pending or claimed."""
        if self.exhausted and self.cursor > 0:
            self.cursor, self.exhausted = 0, False
            return True
        return False

    @property
    def idle(self) -> bool:
        """Nothing claimed and nothing read waits: the run may be over."""
        return self.claimed == 0 and self.pending == 0

    # --- claims -----------------------------------------------------------------------

    @property
    def ahead(self) -> int:
        """Claimed, and not yet taken by a worker task (nor riding a page's commit)."""
        return self.claimed - self.riding - self.working

    def fetching(self) -> int:
        """Claimed pages whose request is not over (or not started)."""
        return self.claimed - self.riding - self.settling

    def claimable(self) -> int:
        """How many URLs may be claimed now. Claims ahead of the workers are bounded: a
        URL claimed but never requested when the crawler is killed counts as an attempt
        that crashed it. Each fetch slot has one URL claimed ahead, and pages on their way
        are bounded by the worker tasks; in one process a busy worker's next URL also
        rides its page's commit, which takes no task of its own. A page whose request is
        over no longer fetches: its slot is free while it is parsed and commits."""
        free = min(self.workers * CLAIMED_PER_FETCH - self.fetching(),
                   self.tasks - (self.ahead + self.working))
        if self.cap is not None:
            free = min(free, self.cap - self.documents)
        return free

    @property
    def capped(self) -> bool:
        return self.cap is not None and self.documents >= self.cap

    def claim(self, free: int) -> tuple[list[Job], float]:
        """Jobs politeness allows now (at most ``free``), counted as claimed; and the
        monotonic time the next one could start."""
        picked, wakeup = self._pick(free)
        # Counted before the claim commits: meanwhile a busy worker may claim its next URL
        # (``ride``), and the cap holds for both.
        self.claimed += len(picked)
        self.documents += len(picked)
        self.check()
        return picked, wakeup

    def _pick(self, free: int) -> tuple[list[Job], float]:
        now = time.monotonic()
        picked: list[Job] = []
        wakeup = now + 1.0
        limit = self.per_host * CLAIMED_PER_FETCH
        for name, host in self.hosts.items():
            while host.jobs and len(picked) < free and host.active < limit:
                if host.next_start > now:
                    wakeup = min(wakeup, host.next_start)
                    break
                job = host.jobs[0]
                if job.not_before > now:
                    host.jobs.rotate(-1)  # look past a retry that is not due yet
                    wakeup = min(wakeup, job.not_before)
                    if all(j.not_before > now for j in host.jobs):
                        break
                    continue
                host.jobs.popleft()
                self.pending -= 1
                host.active += 1
                host.next_start = now + self.delay(name)
                picked.append(job)
        return picked, wakeup

    def delay(self, host: str) -> float:
        return max(self.min_delay, self.crawl_delay(host) or 0.0)

    def back_off(self, name: str, seconds: float) -> None:
        """The host waits ``seconds`` before its next claim and its next request."""
        until = time.monotonic() + seconds
        host = self.host(name)
        host.next_start = max(host.next_start, until)
        host.next_request = max(host.next_request, until)
        host.backoff_until = max(host.backoff_until, until)

    def retry(self, job: Job, seconds: float) -> None:
        """Queue a settled page's retry (its next attempt) after ``seconds``."""
        self.add(Job(job.url, job.depth, job.attempts + 1, job.via, job.key, job.host,
                     time.monotonic() + seconds))

    # --- a page on its way ------------------------------------------------------------

    def take(self) -> None:
        """A worker task starts a page the scheduler claimed ahead."""
        self.working += 1
        self.check()

    def committing(self, job: Job) -> None:
        """The page's request is over and it is parsed and commits: its fetch slot is
        free, and so is its claim on the host."""
        self.settling += 1
        self.host(job.host).active -= 1
        self.check()

    def ride(self) -> Job | None:
        """The next URL for a worker whose page (``committing``) is about to commit,
        claimed in the same group (one commit per page, not a claim commit and a page
        commit); None when nothing may be claimed now."""
        if self.capped:
            return None
        jobs, _ = self._pick(1)
        if not jobs:
            return None
        self.claimed += 1
        self.documents += 1
        self.riding += 1
        self.check()
        return jobs[0]

    def unrequested(self) -> None:
        """A claimed page was settled without a request: it does not count toward the
        cap (robots.txt refused it, it was not due, a stored capture was rendered)."""
        self.documents -= 1
        self.check()

    def finish(self, job: Job, *, settling: bool, then: Job | None = None) -> None:
        """A worker task is done with its page ``job`` (settled, released, or cancelled;
        ``settling``: it was ``committing``), and goes on with ``then``, the next URL that
        rode its commit, if one did."""
        self.working -= 1
        self.claimed -= 1
        if settling:
            self.settling -= 1
        else:
            self.host(job.host).active -= 1
        if then is not None:
            self.riding -= 1
            self.working += 1
        self.check()

    def drop_riding(self, job: Job) -> None:
        """A next claim that rode a page's commit will not be requested (the run was
        cancelled): the engine releases it (requeues it) as the run ends."""
        self.riding -= 1
        self.claimed -= 1
        self.host(job.host).active -= 1
        self.check()

    # --- the relation ---------------------------------------------------------------

    def check(self) -> None:
        """Fail (``CountsBroken``) if the counters leave the relation in the module's
        docstring. The totals are compared at every change; with ``thorough`` the
        per-host figures are summed and compared too."""
        if not __debug__:
            return
        broken = self.broken()
        if broken:
            raise CountsBroken(f"{broken}: {self.counts()}")

    def broken(self) -> str:
        """Which part of the relation does not hold ('' if it all does)."""
        if min(self.pending, self.riding, self.settling, self.ahead, self.documents) < 0:
            return "a counter below zero"
        if not self.riding <= self.settling <= self.working:
            return "riding <= settling <= working"
        if self.ahead + self.working > self.tasks:
            return "ahead + working <= tasks"
        if self.claimed > 2 * self.tasks:
            return "claimed <= 2 * tasks"
        if self.cap is not None and self.documents > self.cap:
            return "documents <= max_documents"
        if self.thorough:
            if self.pending != sum(len(h.jobs) for h in self.hosts.values()):
                return "pending = the jobs in the host queues"
            if sum(h.active for h in self.hosts.values()) != self.claimed - self.settling:
                return "active = claimed - settling"
        return ""

    def counts(self) -> dict[str, int]:
        return {"pending": self.pending, "claimed": self.claimed, "ahead": self.ahead,
                "riding": self.riding, "working": self.working, "settling": self.settling,
                "documents": self.documents, "tasks": self.tasks,
                "active": sum(h.active for h in self.hosts.values())}

    # --- why fewer fetches -----------------------------------------------------------

    def limited_by(self) -> list[str]:
        """Why URLs wait although fetch slots are free: each host's reason, at most 3."""
        now = time.monotonic()
        reasons: list[str] = []
        for name, host in self.hosts.items():
            if not host.jobs:
                continue
            if host.backoff_until > now:
                reasons.append(f"{name} backs off for {host.backoff_until - now:.0f} s")
            elif host.active >= self.per_host * CLAIMED_PER_FETCH:
                reasons.append(f"--per-host {self.per_host} on {name}")
            elif host.next_start > now:
                reasons.append(f"{self.delay(name):g} s between requests to {name}")
            elif all(job.not_before > now for job in host.jobs):
                reasons.append(f"retries on {name} are not due yet")
        return reasons[:3]
