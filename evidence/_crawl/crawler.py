"""The crawler: sessions and runs, a scheduler, workers, and exact resume after a crash.

    result = await Crawler(store, config, options).run()

One run of a session. The scheduler reads queued URLs from the durable frontier (short
read-only queries), picks what per-host politeness allows, *claims* them through the writer
(durable before any request), and hands them to ``options.workers`` worker tasks sharing
one HTTP client (``_crawl.http``). A worker checks robots.txt, fetches, stores the payloads, and
submits the page's attempt, links and settlement as one writer group, so a page is never
done without its links. Because a claim is durable before the fetch, a crash leaves the
URL in flight; the next run requeues it, or fails it once it has been claimed
``max_attempts`` times (a page that kills the crawler cannot loop across restarts).

Nothing a server does can hold a run: each fetch has a total deadline
(``options.deadline``), and ``request_stop`` gives in-flight fetches ``options.grace``
seconds before the run's one cancel scope around them is cancelled (``cancel`` does it at
once); cancelled URLs stay claimed, so the next run requeues them as after a crash.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import datetime as dt
import errno
import functools
import logging
import os
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import anyio
import msgspec

from .._errors import EvidenceError, StoreError, only_evidence_error
from .._model.acks import WriterStatistics
from .._model.logs import add_log_context, log_context
from .._model.messages import (
    Discovery,
    FetchAttempt,
    FrontierUpdate,
    HostUpdate,
    Message,
    QueuedUrl,
    RunEnded,
    RunStarted,
    SessionDocuments,
    SessionEnded,
    SessionStarted,
    SettledUrl,
    format_time,
    new_id,
    parse_time_text,
    utc_now,
)
from .._model.urls import normalize_url, resolve_reference, url_host
from .._net import acquire
from .._store.db import Store
from .._store.postgresql import OutageTooLong
from .._write.service import Service
from .._write.tls import TLSFiles
from .._write.writer import Writer, WriterLimits
from . import frontier
from .fetch import FetchResult
from .frontier import CrawlConfig, FrontierCounts
from .hostauth import CrossCheck
from .http import crawl_client
from .incremental import Baseline, BaselineDoc, DueRule, session_records, sitemap_hint
from .netpolicy import NetworkPolicy, Resolver
from .pages import PageEffects, PageOrder, PageWorker
from .render import Renderer, RenderOptions
from .renderscope import source_capture, unrendered_capture
from .robots import ROBOTS_TTL, Robots
from .rules import check_rules
from .workers import Setup, WorkerLost, WorkerPool

__all__ = ["CrawlOptions", "CrawlProgress", "CrawlResult", "Crawler"]

log = logging.getLogger("evidence.crawl")

LIVE_STATS = "live-stats.json"
# Per --workers fetch: URLs claimed ahead (the one it requests and its next), and pages on
# their way (claimed, fetching, or committing: in this process, or in a worker process
# where a page also waits for its worker).
_CLAIMED_PER_FETCH = 2
_PAGES_PER_FETCH = 2
_PAGES_PER_FETCH_IN_WORKERS = 4

Outcome = Literal["completed", "stopped", "capped", "failed"]


@dataclass(frozen=True, kw_only=True)
class CrawlOptions:
    """How one run goes about it. Unlike ``CrawlConfig`` these may change between runs."""

    workers: int = 8
    per_host: int | None = None  # requests in flight per host; None: as many as ``workers``
    delay: float = 0.0  # seconds between request starts per host (robots Crawl-delay wins)
    timeout: float = 30.0  # seconds one read may wait (connecting, the head, a body chunk)
    deadline: float = 120.0  # seconds one fetch may take in all: connect, head and body
    grace: float = 10.0  # after a stop request, seconds in-flight fetches get to finish
    max_documents: int | None = None  # pages requested by this run; the session goes on
    writer_limits: WriterLimits | None = None
    clean: bool = False  # abandon an open session and start a new one
    full: bool = False  # a new session is a full crawl even when a completed one exists
    progress: Callable[[CrawlProgress], None] | None = None
    progress_interval: float = 1.0
    # Worker processes that fetch and parse (the writer runs as a service in this one);
    # 0: everything in this process. Concurrency stays ``workers`` in all.
    processes: int = 0
    # How pages are rendered when the session renders (``CrawlConfig.render``): the
    # browser, timeouts, tabs, MHTML. Rendering always happens in this process.
    render: RenderOptions | None = None
    # Worker hosts (``evidence worker --connect``): the writer service also listens here
    # ("HOST:PORT"; beyond loopback only with ``tls``), every client presenting ``token``.
    # The payloads must be in an object store the hosts reach (``--artifacts s3://``).
    listen: str | None = None
    tls: TLSFiles | None = None
    token: str | None = None
    heartbeat: float = 2.0  # seconds between beats on a worker host's channel (at most)
    lease_timeout: float = 15.0  # a worker host silent this long loses its leases
    # Accountable worker hosts (``_crawl/hostauth.py``): name -> SHA-256 of each host's own
    # token (``--hosts-file``); and how long the run goes on with no host left once one has
    # served it (None: it waits for hosts to come back; ``--fail-when-no-hosts``).
    hosts: dict[str, bytes] | None = None
    no_hosts_timeout: float | None = None
    cross_check: float = 0.0  # the share of hosts' pages fetched again here (CrossCheck)
    # How host names become addresses for the network policy (``_crawl.netpolicy``): the
    # system's resolver by default; a test gives its own answers. In this process only.
    resolver: Resolver | None = None
    # Prometheus metrics at http://HOST:PORT/metrics while the run goes (``_crawl.metrics``):
    # a loopback address, or any with ``metrics_public``.
    metrics: str | None = None
    metrics_public: bool = False


class CrawlProgress(msgspec.Struct, frozen=True, kw_only=True):
    session_id: str
    run_id: str
    counts: FrontierCounts
    requested: int  # requests made by this run, robots.txt included
    in_flight: int
    pages_per_second: float
    elapsed: float
    writer: WriterStatistics
    worker_pids: list[int] = []  # the worker processes, with --processes
    seeds: list[str] = []
    workers: int = 0  # the concurrency allowed (``in_flight`` is at most this)
    errors: int = 0  # fetches of this run that failed (network, timeout, 5xx, 429)
    last_error: str | None = None  # the latest, as logged
    limited_by: list[str] = []  # why fewer than ``workers`` fetches are in flight, if so
    worker_hosts: list[str] = []  # the worker hosts serving the run, with --listen
    hosts_fenced: dict[str, int] = {}  # worker hosts fenced at fault (_crawl/hostauth.py)
    # While the database server is out of reach (a PostgreSQL restart): since when (UTC,
    # as now_text spells it). The run waits meanwhile, up to the store's outage deadline.
    database_unreachable_since: str | None = None


class CrawlResult(msgspec.Struct, frozen=True, kw_only=True):
    session_id: str
    run_id: str
    outcome: Outcome
    reason: str
    resumed: bool
    session_completed: bool
    documents: int  # pages requested by this run (robots.txt not counted)
    counts: FrontierCounts


@dataclass
class _Job:
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
class _Slot:
    """A worker's page on its host: whether it holds a host slot (and gave it back), and
    the job claimed with it (``Crawler._claim_next``)."""

    host: _Host
    held: bool = False
    freed: bool = False
    next: _Job | None = None
    settling: bool = False  # its request is over in a worker process; it commits there


# The page a worker task is on (each task has its own context): how the page worker's
# ``claim_next`` callback finds it.
_SLOT: contextvars.ContextVar[_Slot] = contextvars.ContextVar("evidence_crawl_slot")


@dataclass
class _Host:
    jobs: collections.deque[_Job] = field(default_factory=collections.deque)
    active: int = 0  # claimed and not finished (fetching, or waiting for a worker)
    next_start: float = 0.0  # monotonic: when the scheduler may claim for it again
    next_request: float = 0.0  # monotonic: when a worker may send its next request
    slots: anyio.Semaphore | None = None  # per-host concurrency, taken by workers
    backoff_until: float = 0.0  # monotonic: the host backs off (429/503, robots.txt down)


def _disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) says the disk is full: SQLite's SQLITE_FULL, or
    ENOSPC/EDQUOT from the artifact store."""
    while exc is not None:
        code = getattr(exc, "sqlite_code", None)
        if isinstance(code, int) and code & 0xFF == 13:  # SQLITE_FULL
            return True
        if getattr(exc, "errno", None) in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
            return True
        exc = exc.__cause__
    return False


def _outage_too_long(exc: BaseException | None) -> OutageTooLong | None:
    """The database outage past its deadline that ``exc`` comes from, if it does."""
    while exc is not None:
        if isinstance(exc, OutageTooLong):
            return exc
        exc = exc.__cause__
    return None


def robots_backoff(failures: int) -> float:
    """How long a host waits after its robots.txt could not be had ``failures`` times in a
    row: 2 s, 6 s, 18 s, 54 s, then a minute. A seed whose host cannot be reached fails
    within seconds (three attempts: 2 + 6 s of waiting), while a host whose robots.txt
    stays down is asked at most once a minute."""
    return min(ROBOTS_BACKOFF_MAX, ROBOTS_BACKOFF_FIRST * 3 ** max(0, failures - 1))


ROBOTS_BACKOFF_FIRST = 2.0
ROBOTS_BACKOFF_MAX = 60.0


class Crawler:
    """One run of the crawl configured by ``config`` over ``store``."""

    def __init__(self, store: Store, config: CrawlConfig,
                 options: CrawlOptions | None = None) -> None:
        self.store = store
        self.config = config
        self.options = options or CrawlOptions()
        self._stop = anyio.Event()  # the scheduler is done: no more claims
        self._halt = anyio.Event()  # a stop was requested: start no more requests
        self._stop_reason = ""
        self._fetching: anyio.CancelScope | None = None  # in-flight work, while the run goes
        self._cancelled = ""  # why in-flight fetches were cancelled, once they were
        self._wake = anyio.Event()
        self._hosts: dict[str, _Host] = {}
        self._pending = 0
        self._in_flight = 0
        self._riding = 0  # of those, claimed with a page still committing (_claim_next)
        self._settling = 0  # of those, requested in a worker process and committing there
        self._requests = 0  # requests in flight: pages holding a host slot
        self._cursor = 0
        self._db_exhausted = False
        self._documents = 0
        self._requested = 0
        self._robots: dict[str, Robots] = {}
        self._robots_locks: dict[str, anyio.Lock] = collections.defaultdict(anyio.Lock)
        self._robots_sequence: collections.Counter[str] = collections.Counter()
        self._capped = False
        self._released: list[_Job] = []  # claimed ahead but not started when the run stopped
        self._per_host = self.options.per_host or self.options.workers
        self._errors = 0
        self._last_error: str | None = None
        self._robots_problem: dict[str, str] = {}  # host -> why its robots.txt is unavailable
        self._robots_failures: collections.Counter[str] = collections.Counter()  # in a row
        self._live_stats_failed = False
        self._host_records: dict[str, tuple] = {}
        self._pool: WorkerPool | None = None  # with options.processes, while the run goes
        self._service: Service
        self._progress: CrawlProgress | None = None  # the last progress report
        self.metrics_address: tuple[str, int] | None = None  # with options.metrics
        self.session_id = ""
        self.run_id = new_id("run-")
        self._baseline: Baseline | None = None
        # The configured sitemaps (and those their indexes list): never skipped as not due.
        self._sitemap_keys: set[str] = set()
        if config.sitemap:
            self._sitemap_keys = {normalize_url(resolve_reference(s, "/sitemap.xml"))
                                  for s in config.seeds}
        self._due_rules = [DueRule.parse(k, v) for k, v in config.recrawl.items()]

    def request_stop(self, reason: str = "stop requested") -> None:
        """End the run gracefully: no new claims and no new requests; in-flight fetches get
        ``options.grace`` seconds to finish and commit, then are cancelled (``cancel``)."""
        if self._halt.is_set():
            return
        self._stop_reason = reason
        self._halt.set()
        self._stop.set()
        self._wake.set()
        if self._fetching is not None:
            self._fetching.deadline = min(self._fetching.deadline,
                                          anyio.current_time() + self.options.grace)

    @property
    def stopping(self) -> bool:
        """Whether a stop was requested (``request_stop``)."""
        return self._halt.is_set()

    def cancel(self, reason: str = "cancelled") -> None:
        """Cancel in-flight fetches now (a second Ctrl-C). Their URLs stay claimed: the next
        run requeues them, as after a crash. What was already handed to the writer commits."""
        self.request_stop(reason)
        self._cancelled = self._cancelled or reason
        if self._fetching is not None:
            self._fetching.cancel()

    # --- the run -----------------------------------------------------------------------

    async def run(self) -> CrawlResult:
        with log_context(run_id=self.run_id):  # on every line logged inside the run
            return await self._run()

    async def _run(self) -> CrawlResult:
        async with contextlib.AsyncExitStack() as stack:
            await self._open(stack)
            self._reader = reader = stack.enter_context(self.store.reader())
            resumed = await self._begin()
            add_log_context(session_id=self.session_id)
            started = time.monotonic()
            outcome: Outcome = "failed"
            reason = ""
            self._fetching = anyio.CancelScope()
            if self._halt.is_set():  # a stop came while the run was starting
                self._fetching.deadline = anyio.current_time() + self.options.grace
            if self._cancelled:
                self._fetching.cancel()
            try:
                with self._fetching:
                    async with self._worker_processes(), anyio.create_task_group() as tg:
                        tg.start_soon(self._report_progress, started)
                        send, receive = anyio.create_memory_object_stream[_Job](0)
                        async with receive:
                            for _ in range(self._tasks()):
                                tg.start_soon(self._worker, receive.clone())
                        outcome, reason = await self._schedule(send)
                        self._stop.set()
            except Exception as raised:
                exc = only_evidence_error(raised) or raised
                outcome, reason = "failed", f"{type(exc).__name__}: {exc}"
                if isinstance(exc, EvidenceError):  # said once, by whoever reports it
                    log.error("run %s failed: %s", self.run_id, exc, extra={"event": "run.failed"})
                else:
                    log.exception("run %s failed", self.run_id, extra={"event": "run.failed"})
                with contextlib.suppress(EvidenceError):  # a full disk may refuse this too
                    await self._end(outcome, reason, complete=False)
                too_long = _outage_too_long(exc)
                if too_long is not None:
                    raise StoreError(
                        f"{too_long}; the run stopped (everything committed before is kept, "
                        "and the session stays open)",
                        hint=f"once the server is back, resume: evidence crawl --store "
                        f"{self.store.location} (--db-outage-deadline SECONDS waits longer)",
                        path=self.store.location) from exc
                if _disk_full(exc):
                    raise StoreError(
                        f"{self.store.location}: the disk is full; the run stopped "
                        "(everything committed before is kept, and the session stays open)",
                        hint=f"free disk space, then resume: evidence crawl --store "
                        f"{self.store.location}", path=self.store.location) from exc
                raise
            if self._fetching.cancelled_caught:
                self._cancelled = self._cancelled or (
                    f"the grace period of {self.options.grace:g} s ended")
                outcome, reason = "stopped", (
                    f"{self._stop_reason}; in-flight fetches cancelled ({self._cancelled}): "
                    "their URLs are requeued by the next run")
            elif outcome == "stopped":
                reason = self._stop_reason
            if self._released:
                await self._commit([self._update(settled=[SettledUrl(
                    url=j.url, state="queued", reason="released: claimed, but the run "
                    "stopped before it was requested") for j in self._released])])
            counts = frontier.counts(reader, self.session_id)
            complete = outcome == "completed" or (
                outcome == "capped" and counts.queued + counts.in_flight == 0)
            if complete:
                outcome, reason = "completed", "the frontier is exhausted"
                unfetched = self._no_seed_fetched()
                if unfetched is not None:
                    outcome, reason = "failed", unfetched
            await self._end(outcome, reason, complete=complete)
            counts = frontier.counts(reader, self.session_id)
        return CrawlResult(session_id=self.session_id, run_id=self.run_id, outcome=outcome,
                           reason=reason, resumed=resumed, session_completed=complete,
                           documents=self._documents, counts=counts)

    def _no_seed_fetched(self) -> str | None:
        """Why the session got nothing, when not one seed was fetched; else None.

        Its frontier is exhausted, so the session completes (a new crawl starts afresh), but
        the run fails: a crawl of an unreachable site must not look like a success.
        """
        seeds = frontier.seeds(self._reader, self.session_id)
        if not seeds or any(state == "done" for _url, state, _reason in seeds):
            return None
        if frontier.counts(self._reader, self.session_id).done:
            return None  # a seed was skipped, and a sitemap's pages were fetched
        why = "; ".join(f"{url}: {state}: {reason}" for url, state, reason in seeds[:3])
        more = f"; and {len(seeds) - 3} more" if len(seeds) > 3 else ""
        return f"no seed could be fetched ({why}{more})"

    async def _open(self, stack: contextlib.AsyncExitStack) -> None:
        """The HTTP client, and the writer: in process, or as a service for worker
        processes (on a Unix socket in a private temporary directory)."""
        limits = self.options.writer_limits or WriterLimits(max_batch_delay=0.002)
        connections = self.options.workers * 2
        policy = NetworkPolicy(allow=self.config.allow_network, seeds=self.config.seeds,
                               resolver=self.options.resolver)
        client = await stack.enter_async_context(crawl_client(
            connections=connections, timeout=self.options.timeout, policy=policy))
        in_process = not (self.options.processes > 0 or self.options.listen)
        if not in_process:
            if self.options.listen and not getattr(self.store.artifacts, "url", ""):
                raise EvidenceError(
                    "worker hosts put payloads into the store's object store, and this "
                    "store keeps them in a local directory",
                    hint="crawl into a new store with --artifacts s3://BUCKET/PREFIX")
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="evidence-"))
            self._service = await stack.enter_async_context(Service(
                self.store, socket_path=Path(directory) / "writer.sock",
                listen=self.options.listen, tls=self.options.tls, token=self.options.token,
                writer_limits=limits, hosts=self.options.hosts))
            self._writer = self._service.writer
            if self._service.tcp_address is not None:
                log.info("worker hosts may connect to %s:%d (%s)",
                         *self._service.tcp_address,
                         "TLS" if self.options.tls else "no TLS: loopback only",
                         extra={"event": "crawl.listening"})
        else:
            self._writer = await stack.enter_async_context(Writer(self.store, limits=limits))
        if self.options.metrics is not None:
            from .metrics import crawl_metrics

            self.metrics_address = await stack.enter_async_context(crawl_metrics(
                self, self.options.metrics, public=self.options.metrics_public))
        # Its session_id is set by _begin, once the store says which session this run is of.
        self._pages = PageWorker(config=self.config, session_id="", run_id=self.run_id,
                                 artifacts=self.store.artifacts, client=client,
                                 submit=self._writer.submit_group,
                                 deadline=self.options.deadline,
                                 url_keys=self._writer.url_keys)
        self._pages.claim_next = self._claim_next
        if in_process:  # every page commits here: this crawl knows what reaches its writer
            self._pages.nothing_else_coming = self._nothing_else_coming
            self._pages.submit_last = functools.partial(self._writer.submit_group, flush=True)
        self._renderer = None
        if self._pages.rules is not None and self._pages.rules.rendered and not (
                self._pages.render_scope.enabled):
            rule = self._pages.rules.rendered[0]
            raise EvidenceError(f"rule {rule.id!r} reads the rendered DOM, and this crawl "
                                "does not render", hint="add --render (or --render-only), "
                                "or give the rule input = 'response'")
        if self._pages.render_scope.enabled:  # the browser starts with the first render
            self._renderer = await stack.enter_async_context(Renderer(
                artifacts=self.store.artifacts, client=client, run_id=self.run_id,
                user_agent=self.config.user_agent, max_body_bytes=self.config.max_body_bytes,
                options=self.options.render, unsafe_refusal=None
                if self.config.render_unsafe_anywhere else self._pages.scope.reason_out_of))

    @contextlib.asynccontextmanager
    async def _worker_processes(self) -> AsyncIterator[None]:
        if self.options.processes <= 0 and not self.options.listen:
            yield
            return
        assert self._service.socket_path is not None
        setup = Setup(store=self.store.location, socket=str(self._service.socket_path),
                      artifacts=str(self.store.artifacts.root),  # a directory or s3:// URL
                      config=self.config.as_record(), session_id=self.session_id,
                      run_id=self.run_id, connections=self.options.workers * 2,
                      timeout=self.options.timeout, deadline=self.options.deadline)
        # At least three beats per lease, so one late beat never expires a live host.
        heartbeat = min(self.options.heartbeat, self.options.lease_timeout / 3)
        async with WorkerPool(self.options.processes, setup, heartbeat=heartbeat,
                              lease_timeout=self.options.lease_timeout,
                              no_hosts_timeout=self.options.no_hosts_timeout) as pool:
            self._pool = pool
            self._service.worker_handler = pool.serve_remote
            # What a worker host submits is checked against its leases (_crawl/hostauth.py).
            pool.fence_client, pool.fence_host = self._service.fence, self._service.fence_host
            pool.out_of_scope = self._pages.scope.reason_to_skip
            self._service.submission_guard = pool.check_submission
            if self.options.cross_check > 0:
                pool.spot_check = CrossCheck(
                    self.options.cross_check, run_id=self.run_id, read=lambda: self._reader,
                    fetch=lambda url, seq: self._pages.fetch(url, seq, keep_content=0),
                    submit=self._writer.submit_group)
            try:
                yield
            finally:
                self._service.worker_handler = None
                self._service.submission_guard = None
                self._pool = None

    async def _begin(self) -> bool:
        """Start or resume the session, start the run, requeue what a crash left in flight."""
        now = utc_now()
        last = frontier.last_session(self._reader)
        messages: list[Message] = []
        if last is not None and last.outcome is None and self.options.clean:
            messages += self._close_runs(last.open_runs, "abandoned by --clean", now)
            messages.append(SessionEnded(message_id=new_id("m-"), session_id=last.session_id,
                                         ended_at=now, outcome="abandoned"))
            last = None
        resumed = last is not None and last.outcome is None
        run = lambda session_id: RunStarted(  # noqa: E731
            message_id=new_id("m-"), run_id=self.run_id, session_id=session_id,
            started_at=now, program="evidence crawl", host=socket.gethostname(),
            pid=os.getpid())
        if resumed:
            assert last is not None
            differ = self.config.differences(last.config)
            if differ:
                raise EvidenceError(
                    f"session {last.session_id} is open with a different configuration; "
                    f"these keys differ: {', '.join(differ)}",
                    hint="start with the same configuration to resume it, or add --clean "
                    "to abandon it and start a new session", keys=differ)
            self.session_id = self._pages.session_id = last.session_id
            baseline_id = last.baseline_session_id  # a resumed run keeps its session's mode
            messages += self._close_runs(last.open_runs, f"no end recorded (killed or "
                                         f"crashed); found by run {self.run_id}", now)
            messages.append(run(self.session_id))
            settled = []
            for url, attempts in frontier.in_flight(self._reader, self.session_id):
                if attempts >= self.config.max_attempts:
                    settled.append(SettledUrl(url=url, state="failed", reason=(
                        f"attempts exhausted: claimed {attempts} times without a result "
                        "(the crawler stopped or crashed while fetching it)")))
                else:
                    settled.append(SettledUrl(url=url, state="queued", reason=(
                        f"requeued: in flight when an earlier run ended "
                        f"(attempt {attempts} of {self.config.max_attempts})")))
            if settled:
                messages.append(self._update(settled=settled))
        else:
            self.session_id = self._pages.session_id = new_id("session-")
            baseline_id = None
            if not (self.options.clean or self.options.full):
                baseline_id = frontier.last_completed_session(self._reader)
            messages.append(SessionStarted(
                message_id=new_id("m-"), session_id=self.session_id, started_at=now,
                mode="full" if baseline_id is None else "incremental",
                config=self.config.as_record(), baseline_session_id=baseline_id))
            messages.append(run(self.session_id))
            seeds = [QueuedUrl(url=s, depth=0, via="seed", skip=self._skip(s, 0))
                     for s in self.config.seeds]
            if self.config.sitemap:  # first, so their recrawl hints are known early
                sitemaps = dict.fromkeys(resolve_reference(s, "/sitemap.xml")
                                         for s in self.config.seeds)
                seeds = [QueuedUrl(url=u, depth=0, via="sitemap") for u in sitemaps] + seeds
            messages.append(self._update(queued=seeds))
        await self._commit(messages)
        if self._pages.rules is not None:
            check_rules(self._reader, self._pages.rules.rules)
        if baseline_id is not None:
            self._baseline = Baseline(self._reader, self.store.artifacts, baseline_id,
                                      self._due_rules)
        now_mono, now_utc = time.monotonic(), utc_now()
        for host, record in frontier.host_states(self._reader).items():
            self._host_records[host] = record
            backoff = parse_time_text(record[3])
            if backoff is not None and backoff > now_utc:
                until = now_mono + (backoff - now_utc).total_seconds()
                self._host(host).next_start = self._host(host).next_request = until
        log.info("session %s run %s %s (%s)", self.session_id, self.run_id,
                 "resumed" if resumed else "started",
                 "full" if baseline_id is None else f"incremental against {baseline_id}",
                 extra={"event": "run.started", "session_id": self.session_id})
        return resumed

    def _close_runs(self, run_ids: list[str], reason: str, now: dt.datetime) -> list[Message]:
        return [RunEnded(message_id=new_id("m-"), run_id=r, ended_at=now, outcome="failed",
                         reason=reason) for r in run_ids]

    async def _end(self, outcome: Outcome, reason: str, *, complete: bool) -> None:
        if complete:
            await self._record_documents()
        now = utc_now()
        messages: list[Message] = [RunEnded(message_id=new_id("m-"), run_id=self.run_id,
                                            ended_at=now, outcome=outcome, reason=reason)]
        if complete:
            messages.append(SessionEnded(message_id=new_id("m-"), session_id=self.session_id,
                                         ended_at=now, outcome="completed"))
        with anyio.CancelScope(shield=True):
            await self._commit(messages)
        log.info("run %s ended: %s (%s)", self.run_id, outcome, reason,
                 extra={"event": "run.ended"})

    async def _record_documents(self) -> None:
        """The completed session's record of every document, in chunks, before its end.

        Only a session whose frontier is exhausted gets here, so orphans are never inferred
        from a run that stopped early. Rows are keyed by (session, url): a run that crashed
        halfway through writing them rewrites the rest and duplicates nothing.
        """
        baseline = self._baseline.session_id if self._baseline else None
        records = session_records(self._reader, self.session_id, baseline)
        chunk: list = []
        for record in records:
            chunk.append(record)
            if len(chunk) == 2000:
                await self._commit([self._documents_message(chunk)])
                chunk = []
        if chunk:
            await self._commit([self._documents_message(chunk)])

    def _documents_message(self, chunk: list) -> SessionDocuments:
        return SessionDocuments(message_id=new_id("m-"), session_id=self.session_id,
                                run_id=self.run_id, documents=list(chunk))

    async def _commit(self, messages: list[Message]) -> None:
        await self._pages.commit(messages)

    def _update(self, **changes: list) -> FrontierUpdate:
        return self._pages.update(**changes)

    def _skip(self, url: str, depth: int) -> str | None:
        return self._pages.skip(url, depth)

    # --- scheduling ----------------------------------------------------------------------

    def _host(self, host: str) -> _Host:
        if host not in self._hosts:
            self._hosts[host] = _Host()
        return self._hosts[host]

    def _add(self, job: _Job) -> None:
        self._host(job.host).jobs.append(job)
        self._pending += 1

    async def _refill(self) -> None:
        low = self.options.workers * 8
        if self._pending >= low or self._db_exhausted:
            return
        if self.store.backend.local:
            rows = frontier.queued_after(self._reader, self.session_id, self._cursor, 1000)
        else:  # a server: the read may wait out a restart, which must not stall the loop
            rows = await anyio.to_thread.run_sync(
                frontier.queued_after, self._reader, self.session_id, self._cursor, 1000)
        for row in rows:
            self._cursor = row.frontier_id
            not_before = parse_time_text(row.not_before)
            wait = 0.0 if not_before is None else (not_before - utc_now()).total_seconds()
            self._pages.url_keys[row.url] = row.key  # the claim's key, for the writer
            self._add(_Job(row.url, row.depth, row.attempts, row.via, row.key,
                           url_host(row.key), time.monotonic() + max(0.0, wait)))
        self._db_exhausted = len(rows) < 1000

    def _pick(self, free: int) -> tuple[list[_Job], float]:
        """Jobs politeness allows now, and the monotonic time the next one could start."""
        now = time.monotonic()
        picked: list[_Job] = []
        wakeup = now + 1.0
        for name, host in self._hosts.items():
            limit = self._per_host * _CLAIMED_PER_FETCH
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
                self._pending -= 1
                host.active += 1
                host.next_start = now + self._delay(name)
                picked.append(job)
        return picked, wakeup

    def _delay(self, host: str) -> float:
        robots = self._robots.get(host)
        crawl_delay = robots.crawl_delay(self.config.user_agent) if robots else None
        return max(self.options.delay, crawl_delay or 0.0)

    async def _schedule(self, send: anyio.abc.ObjectSendStream[_Job]) -> tuple[Outcome, str]:
        cap = self.options.max_documents
        # Claims commit concurrently (each hands its jobs to the workers once durable):
        # slots that free while one claim commits need not wait for it.
        async with send, anyio.create_task_group() as claims:
            while True:
                if self._stop.is_set():
                    return "stopped", "stop requested"
                if cap is not None and self._documents >= cap:
                    self._capped = True  # what was claimed is fetched: it counts
                    return "capped", f"reached --max-documents {cap}"
                await self._refill()
                # Claims ahead of the workers are bounded: a URL claimed but never requested
                # when the crawler is killed counts as an attempt that crashed it. Each
                # fetch slot has one URL claimed ahead, and pages on their way are bounded
                # by the worker tasks; in one process a busy worker's next URL also rides
                # its page's commit, which takes no task of its own. A page whose request
                # is over no longer fetches: its slot is free while it is parsed and
                # commits.
                free = min(self.options.workers * _CLAIMED_PER_FETCH - self._fetching_now(),
                           self._tasks() - (self._in_flight - self._riding))
                if cap is not None:
                    free = min(free, cap - self._documents)
                jobs, wakeup = self._pick(free) if free > 0 else ([], time.monotonic() + 1)
                if jobs:
                    # Counted before the claim commits: meanwhile a busy worker may claim
                    # its next URL (_claim_next), and the cap holds for both.
                    self._documents += len(jobs)
                    self._in_flight += len(jobs)
                    claims.start_soon(self._claim, jobs, send)
                    continue
                if self._in_flight == 0 and self._pending == 0:
                    if self._db_exhausted and self._cursor > 0:
                        self._cursor, self._db_exhausted = 0, False  # one full re-read
                        continue
                    if self._db_exhausted:
                        return "completed", "the frontier is exhausted"
                with anyio.move_on_after(max(0.0, wakeup - time.monotonic())):
                    await self._wake.wait()
                self._wake = anyio.Event()
        raise AssertionError("the scheduler ends by returning")  # a task group may swallow

    async def _claim(self, jobs: list[_Job], send: anyio.abc.ObjectSendStream[_Job]) -> None:
        await self._commit([self._update(claimed=[j.url for j in jobs])])
        for job in jobs:
            await send.send(job)

    # --- workers -----------------------------------------------------------------------

    async def _worker(self, jobs: anyio.abc.ObjectReceiveStream[_Job]) -> None:
        async with jobs:
            claimed: _Job | None = None  # claimed with this worker's last page, in its group
            while True:
                if claimed is None:
                    try:
                        job = await jobs.receive()
                    except anyio.EndOfStream:
                        return
                else:
                    job, claimed = claimed, None
                    self._riding -= 1
                with log_context(url=job.url):
                    claimed = await self._work(job)

    async def _work(self, job: _Job) -> _Job | None:
        """Request and settle one claimed page; the next job if one was claimed with it."""
        name = job.host
        host = self._host(name)
        requested = False
        slot = _Slot(host)
        token = _SLOT.set(slot)
        try:
            if self._halt.is_set():
                self._released.append(job)  # claimed ahead, never started
                return None
            if host.slots is None:
                host.slots = anyio.Semaphore(self._per_host)
            await acquire(host.slots)
            slot.held = True
            self._requests += 1
            if not await self._polite(host, name):
                self._released.append(job)  # the run stopped while it waited
                return None
            requested = True
            await self._process(job)
        except anyio.get_cancelled_exc_class():
            if not requested:
                self._released.append(job)
            if slot.next is not None:
                self._released.append(slot.next)  # its claim may have committed
                self._in_flight -= 1
                self._riding -= 1
            raise  # a job cancelled mid-fetch stays claimed: the next run requeues it
        finally:
            _SLOT.reset(token)
            self._in_flight -= 1
            if slot.settling:
                self._settling -= 1
            self._free_slot(slot)
            self._wake.set()
        return slot.next

    def _tasks(self) -> int:
        """Worker tasks, each taking one page from claim to commit. More pages than
        fetches are on their way: a fetch slot is free once its request is over
        (``_settled_elsewhere``), so the next page is requested while the last one is
        parsed and commits, and a slot's next URL is claimed while it fetches. In one
        process a busy worker's next page also rides its commit (``_claim_next``); worker
        processes commit their pages themselves, where a next claim cannot ride."""
        return self.options.workers * (_PAGES_PER_FETCH if self._pool is None
                                       else _PAGES_PER_FETCH_IN_WORKERS)

    def _fetching_now(self) -> int:
        """Claimed pages whose request is not over (or not started)."""
        return self._in_flight - self._riding - self._settling

    def _settled_elsewhere(self, slot: _Slot | None) -> None:
        """The request for this page is over, and the page is parsed and commits (in
        this process, or in its worker process): its host slot and fetch slot are free for
        the scheduler's next claim. Not when pages render here (a render is another
        request to the host)."""
        if slot is None or slot.settling or self._renderer is not None:
            return
        slot.settling = True
        self._settling += 1
        self._free_slot(slot)
        self._wake.set()

    def _free_slot(self, slot: _Slot) -> None:
        """The page no longer takes one of its host's requests in flight (once)."""
        if slot.freed:
            return
        slot.freed = True
        slot.host.active -= 1
        if slot.held:
            slot.held = False
            self._requests -= 1
            assert slot.host.slots is not None
            slot.host.slots.release()

    def _nothing_else_coming(self) -> bool:
        """Whether the page about to commit is the only one of this process not yet
        submitted or riding a commit: then the writer need not linger for more pages."""
        return self._in_flight - self._riding - self._pages.committing <= 1

    def _claim_next(self) -> list[str]:
        """Called when a page fetched by this process is about to commit: its request is
        over, so its host slot is free; the URL this worker will request next is claimed
        in the same group (one commit per page instead of a claim commit before it and a
        page commit after). Nothing when the run is stopping or capped, or renders (a
        render after the fetch is another request to the host)."""
        slot = _SLOT.get(None)
        cap = self.options.max_documents
        if (slot is None or slot.next is not None or self._renderer is not None
                or self._halt.is_set() or self._stop.is_set()
                or (cap is not None and self._documents >= cap)):
            return []
        self._free_slot(slot)
        jobs, _ = self._pick(1)
        if not jobs:
            return []
        slot.next = jobs[0]
        self._documents += 1
        self._in_flight += 1
        self._riding += 1
        return [slot.next.url]

    async def _polite(self, host: _Host, name: str) -> bool:
        """Space request starts on a host by its delay (and any backoff), exactly; False if
        the run was asked to stop meanwhile (the request is not made)."""
        now = time.monotonic()
        start = max(now, host.next_request)
        host.next_request = start + self._delay(name)  # reserved before sleeping
        if start > now:
            with anyio.move_on_after(start - now):
                await self._halt.wait()
        return not self._halt.is_set()

    async def _process(self, job: _Job) -> None:
        if self._renderer is not None:  # a capture an earlier run fetched but did not render
            stored = unrendered_capture(self._reader, self._pages.render_scope,
                                        self.session_id, job.url, job.key)
            if stored is not None:
                self._documents -= 1  # never requested again
                await self._render(job, stored)
                return
        host = job.host
        doc = (self._baseline.lookup(job.url, job.key) if self._baseline is not None
               else None)
        if doc is not None and self._baseline is not None and job.key not in self._sitemap_keys:
            hint = sitemap_hint(self._reader, self.session_id, job.url, job.key)
            reason = self._baseline.not_due(job.url, doc, hint, utc_now(), job.key)
            if reason is not None:
                self._documents -= 1  # never requested
                self._apply(job, await self._pages.not_due(
                    self._order(job), reason, self._baseline_found(doc)))
                return
        if self.config.obey_robots:
            robots = await self._robots_for(job.url, host)
            if robots is None:  # robots.txt unavailable: the host is in backoff
                why = self._robots_problem.get(host, "")
                self._apply(job, await self._pages.retry(
                    self._order(job), [], f"robots.txt unavailable ({why})" if why
                    else "robots.txt unavailable",
                    backoff=robots_backoff(self._robots_failures[host])))
                return
            if not robots.allowed(job.url, self.config.user_agent):
                self._documents -= 1  # never requested
                self._apply(job, await self._pages.refused_by_robots(
                    self._order(job), robots.refusal(self.config.user_agent)))
                return
        conditional = {}
        if doc is not None and doc.http_status == 200:
            if doc.etag:
                conditional["If-None-Match"] = doc.etag
            if doc.last_modified:
                conditional["If-Modified-Since"] = doc.last_modified
        effects = await self._execute(self._order(job, conditional, baseline=doc is not None))
        self._apply(job, effects)
        if effects.render is not None:
            await self._render(job, effects.render)
        if effects.unchanged is not None:
            assert doc is not None
            self._apply(job, await self._pages.unchanged(
                self._order(job), effects.unchanged, self._baseline_found(doc),
                "HTTP 304 (unchanged)"))

    def _order(self, job: _Job, headers: dict[str, str] | None = None, *,
               baseline: bool = False) -> PageOrder:
        return PageOrder(url=job.url, depth=job.depth, attempts=job.attempts, via=job.via,
                         headers=headers or {}, baseline=baseline, key=job.key,
                         host=job.host)

    async def _execute(self, order: PageOrder) -> PageEffects:
        """Request and settle the page: in this process, or in a worker process."""
        slot = _SLOT.get(None)
        if self._pool is None:
            async def fetched() -> None:
                self._settled_elsewhere(slot)

            return await self._pages.page(order, fetched)
        try:
            return await self._pool.page(order, lambda: self._settled_elsewhere(slot))
        except WorkerLost as lost:
            return await self._lost(order, lost)

    async def _lost(self, order: PageOrder, lost: WorkerLost) -> PageEffects:
        """Settle a page whose worker process died, from what the store holds of it.

        Once the service has dropped the dead worker's connection, everything it sent has
        committed: a page it settled stays settled (a retry it queued is claimed again);
        a page still in flight is requeued, or failed once claimed ``max_attempts`` times.
        """
        if lost.remote:  # nothing it sends from now on is written: then read the store
            await self._service.fence(lost.name)
        else:
            await self._service.wait_gone(lost.name)
        state, attempts, not_before = frontier.claim_state(
            self._reader, self.session_id, order.url, order.key or None)
        what = f"its worker process ({lost.name}) {lost.how}"
        if state == "queued":
            due = parse_time_text(not_before)
            wait = 0.0 if due is None else (due - utc_now()).total_seconds()
            return PageEffects(requested=1, retry_in=max(0.0, wait))
        if state != "in_flight":
            return PageEffects(requested=1, queued_links=True)
        if attempts >= self.config.max_attempts:
            await self._commit([self._update(settled=[SettledUrl(
                url=order.url, state="failed", reason=f"attempts exhausted: claimed "
                f"{attempts} times without a result ({what})")])])
            return PageEffects(requested=1)
        await self._commit([self._update(settled=[SettledUrl(
            url=order.url, state="queued", reason=f"requeued: {what} while fetching it "
            f"(attempt {attempts} of {self.config.max_attempts})")])])
        return PageEffects(requested=1, retry_in=0.0)

    async def _render(self, job: _Job, attempt: FetchAttempt) -> None:
        """Render a committed capture; ``PageWorker.rendered`` settles its page with it."""
        assert self._renderer is not None
        source = await anyio.to_thread.run_sync(source_capture, self.store.artifacts, attempt)
        rendered = await self._renderer.render(source)
        self._apply(job, await self._pages.rendered(self._order(job), attempt, source,
                                                    rendered))

    def _baseline_found(self, doc: BaselineDoc) -> list[Discovery]:
        """The discoveries recorded from the baseline's capture of a document."""
        assert self._baseline is not None
        return self._baseline.discoveries_of(doc.attempt_id) if doc.attempt_id else []

    async def _fetch(self, url: str, sequence: int,
                     headers: dict[str, str] | None = None) -> FetchResult:
        self._requested += 1
        return await self._pages.fetch(url, sequence, headers)

    def _apply(self, job: _Job, effects: PageEffects) -> None:
        """What a settled page tells the scheduler: a retry, a backoff, new links; and the
        operator, as it happens: a failed fetch or a backoff is logged at once."""
        self._requested += effects.requested
        now = time.monotonic()
        if effects.problem is not None:
            self._errors += 1
            self._last_error = effects.problem
            log.warning("%s", effects.problem, extra={"event": "fetch.failed"})
        if effects.backoff is not None:
            host = self._host(job.host)
            host.next_start = max(host.next_start, now + effects.backoff)
            host.next_request = max(host.next_request, now + effects.backoff)
            host.backoff_until = max(host.backoff_until, now + effects.backoff)
        if effects.retry_in is not None:
            self._add(dataclasses.replace(job, attempts=job.attempts + 1,
                                          not_before=now + effects.retry_in))
        if effects.queued_links:
            self._db_exhausted = False
        self._sitemap_keys.update(effects.sitemaps)

    # --- robots.txt ----------------------------------------------------------------------

    async def _robots_for(self, url: str, host: str) -> Robots | None:
        # Nearly every page finds its host's rules cached: that answer needs no lock (taking
        # and releasing an anyio Lock is four cancel scopes, per page).
        cached = self._fresh_robots(host)
        if cached is not None:
            return cached
        async with self._robots_locks[host]:  # one fetch of robots.txt per host at a time
            cached = self._fresh_robots(host)  # another page's fetch may have got it
            if cached is not None:
                return cached
            robots = self._stored_robots(host, utc_now()) or await self._fetch_robots(url, host)
            if robots is not None:
                self._robots[host] = robots
            return robots

    def _fresh_robots(self, host: str) -> Robots | None:
        """The host's robots.txt rules held in memory, if not expired."""
        cached = self._robots.get(host)
        return cached if cached is not None and cached.expires_at > utc_now() else None

    def _stored_robots(self, host: str, now: dt.datetime) -> Robots | None:
        """robots.txt recorded by an earlier run and not yet expired: no new request."""
        record = self._host_records.get(host)
        if record is None or record[0] is None:
            return None
        expires = parse_time_text(record[1])
        if expires is None or expires <= now:
            return None
        body = frontier.attempt_body(self._reader, record[0])
        if body is None:
            return Robots.allow_all(attempt_id=record[0], expires_at=expires, status=None)
        from .._model.refs import ArtifactRef

        data = self.store.artifacts.read(ArtifactRef(namespace=body[0], digest=body[1],
                                                     size=body[2]))
        return Robots.parse(data, attempt_id=record[0], expires_at=expires, status=200)

    async def _fetch_robots(self, url: str, host: str) -> Robots | None:
        target = resolve_reference(url, "/robots.txt")
        for _hop in range(6):  # RFC 9309 2.3.1.2: follow at least five redirects
            self._robots_sequence[target] += 1
            result = await self._fetch(target, self._robots_sequence[target])
            status = result.status
            expires = utc_now() + ROBOTS_TTL
            location = result.headers.get("location") if result.headers is not None else None
            if status is not None and 300 <= status < 400 and location:
                await self._commit([result.attempt])
                target = resolve_reference(target, location)
                continue
            if result.attempt.outcome == "skipped":
                # The network policy refused it: robots.txt counts as absent (no rules, as
                # for a 4xx), for this run only; the page's own request is decided alike.
                await self._commit([result.attempt])
                return Robots.allow_all(attempt_id=result.attempt.attempt_id,
                                        expires_at=expires, status=None)
            if status is None or status >= 500:
                await self._commit([result.attempt])
                self._robots_problem[host] = (f"HTTP {status}" if status is not None
                                              else result.attempt.error or "no answer")
                self._robots_failures[host] += 1
                return None
            self._robots_failures.pop(host, None)
            if 200 <= status < 300:
                robots = Robots.parse(result.body, attempt_id=result.attempt.attempt_id,
                                      expires_at=expires, status=status)
            else:
                robots = Robots.allow_all(attempt_id=result.attempt.attempt_id,
                                          expires_at=expires, status=status)
            await self._commit([result.attempt, HostUpdate(
                message_id=new_id("m-"), run_id=self.run_id, host=host,
                robots_attempt_id=result.attempt.attempt_id, robots_expires_at=expires,
                crawl_delay=robots.crawl_delay(self.config.user_agent),
                reason=f"robots.txt HTTP {status}")])
            return robots
        return None

    # --- progress --------------------------------------------------------------------

    async def _report_progress(self, started: float) -> None:
        """Each interval: call the progress callback, and write ``STORE/live-stats.json``.

        The file is how ``evidence status`` (another process) shows a live crawl's writer
        metrics; it is a convenience, replaced atomically, not evidence.
        """
        # A PostgreSQL store has no directory to put it in: status names the writer instead.
        path = None if self.store.path is None else self.store.path / LIVE_STATS
        counts = FrontierCounts()
        with self.store.reader() as own:  # counting a large frontier takes a while:
            while not self._stop.is_set():  # its own connection, off the event loop
                with anyio.move_on_after(self.options.progress_interval):
                    await self._stop.wait()
                if self._unreachable_since() is None:  # else the last counts, and since when
                    counts = await anyio.to_thread.run_sync(frontier.counts, own,
                                                            self.session_id)
                self._report(started, counts, path)

    def _unreachable_since(self) -> str | None:
        """Since when the database server is out of reach, while it is (a restart)."""
        since = getattr(getattr(self.store.backend, "outage", None), "since", None)
        return None if since is None else format_time(dt.datetime.fromtimestamp(since, dt.UTC))

    def _report(self, started: float, counts: FrontierCounts, path: Path | None) -> None:
        elapsed = time.monotonic() - started
        progress = CrawlProgress(
            session_id=self.session_id, run_id=self.run_id, counts=counts,
            requested=self._requested, in_flight=self._requests,
            pages_per_second=self._requested / elapsed if elapsed > 0 else 0.0,
            elapsed=elapsed, writer=self._writer.statistics(),
            worker_pids=self._pool.pids if self._pool is not None else [],
            worker_hosts=self._pool.hosts if self._pool is not None else [],
            hosts_fenced=dict(self._pool.fenced) if self._pool is not None else {},
            seeds=self.config.seeds, workers=self.options.workers, errors=self._errors,
            last_error=self._last_error, limited_by=self._limited_by(),
            database_unreachable_since=self._unreachable_since())
        self._progress = progress  # the frontier's counts, for statistics()
        try:
            if path is not None:
                tmp = path.with_suffix(".tmp")
                tmp.write_bytes(msgspec.json.encode(progress))
                os.replace(tmp, path)
        except OSError as exc:  # a convenience for 'evidence status', never worth a run
            if not self._live_stats_failed:
                log.warning("cannot write %s (%s); 'evidence status' will not show this "
                            "run's progress", path, exc.strerror,
                            extra={"event": "crawl.live_stats_failed"})
            self._live_stats_failed = True
        if self.options.progress is not None:
            self.options.progress(progress)

    def statistics(self) -> CrawlProgress:
        """The run's figures now (its metrics read them at each scrape); the frontier's
        counts are those of the last progress report (counting is a query, not a lookup)."""
        last = self._progress
        return CrawlProgress(
            session_id=self.session_id, run_id=self.run_id,
            counts=last.counts if last is not None else FrontierCounts(),
            requested=self._requested, in_flight=self._requests,
            pages_per_second=last.pages_per_second if last is not None else 0.0,
            elapsed=last.elapsed if last is not None else 0.0,
            writer=self._writer.statistics(),
            worker_pids=self._pool.pids if self._pool is not None else [],
            worker_hosts=self._pool.hosts if self._pool is not None else [],
            hosts_fenced=dict(self._pool.fenced) if self._pool is not None else {},
            seeds=self.config.seeds, workers=self.options.workers, errors=self._errors,
            last_error=self._last_error)

    def _limited_by(self) -> list[str]:
        """Why fewer than ``workers`` fetches are in flight, when URLs wait (else [])."""
        if self._requests >= self.options.workers or self._halt.is_set():
            return []
        now = time.monotonic()
        reasons: list[str] = []
        for name, host in self._hosts.items():
            if not host.jobs:
                continue
            if host.backoff_until > now:
                reasons.append(f"{name} backs off for {host.backoff_until - now:.0f} s")
            elif host.active >= self._per_host * _CLAIMED_PER_FETCH:
                reasons.append(f"--per-host {self._per_host} on {name}")
            elif host.next_start > now:
                reasons.append(f"{self._delay(name):g} s between requests to {name}")
            elif all(job.not_before > now for job in host.jobs):
                reasons.append(f"retries on {name} are not due yet")
        return reasons[:3]
