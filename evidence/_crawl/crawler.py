"""The crawl engine: sessions and runs, driving a scheduler, fetch slots and page workers.

    result = await Crawler(store, config, options).run()

One run of a session. The engine composes the crawl's parts, each in its own module:

- the scheduler (``_crawl.scheduler``) reads queued URLs from the durable frontier
  (short read-only queries), picks what per-host politeness allows, and counts what is
  claimed and where each claimed page is on its way;
- the engine *claims* those URLs through the writer (durable before any request) and
  hands them to worker tasks (2 x ``options.workers``, sharing one HTTP client,
  ``_crawl.http``);
- a worker task takes a fetch slot on the page's host (``_crawl.slots``), asks the host's
  robots.txt (``_crawl.hostrules``), and has the page requested and settled by the page
  worker (``_crawl.pages``, in this process, or in a worker process: ``_crawl.workers``),
  which stores the payloads and submits the page's attempt, links and settlement as one
  writer group, so a page is never done without its links. The page worker hands its
  outcome back (``PageEffects``); the engine applies it to the scheduler.

Because a claim is durable before the fetch, a crash leaves the URL in flight; the next
run requeues it, or fails it once it has been claimed ``max_attempts`` times (a page that
kills the crawler cannot loop across restarts).

Nothing a server does can hold a run: each fetch has a total deadline
(``options.deadline``), and ``request_stop`` gives in-flight fetches ``options.grace``
seconds before the run's one cancel scope around them is cancelled (``cancel`` does it at
once); cancelled URLs stay claimed, so the next run requeues them as after a crash.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import msgspec

from .._errors import EvidenceError, only_evidence_error
from .._model.logs import add_log_context, log_context
from .._model.messages import (
    Discovery,
    FetchAttempt,
    FrontierUpdate,
    Message,
    SettledUrl,
    new_id,
    parse_time_text,
    utc_now,
)
from .._model.urls import normalize_url, resolve_reference
from .._store.db import Store
from .._write.limits import WriterLimits
from .._write.service import Service
from .._write.writer import Writer
from . import frontier
from .fetch import FetchResult
from .frontier import CrawlConfig, FrontierCounts
from .hostauth import CrossCheck
from .hostrules import HostRules, robots_backoff
from .http import crawl_client
from .incremental import Baseline, BaselineDoc, DueRule, sitemap_hint
from .netpolicy import NetworkPolicy
from .options import CrawlOptions, CrawlResult, per_seed
from .pages import PageEffects, PageOrder, PageWorker, Settlement
from .progress import LIVE_STATS, CrawlProgress, LiveStats, unreachable_since
from .proxy import crawl_routes
from .renderscope import source_capture, unrendered_capture
from .rules import check_rules
from .scheduler import PAGES_PER_FETCH, PAGES_PER_FETCH_IN_WORKERS, Job, Scheduler
from .session import (
    Outcome,
    documents,
    no_seed_fetched,
    open_session,
    run_ended,
    stopped_by_the_store,
)
from .slots import FetchSlots, Slot
from .workerchannel import Setup
from .workers import WorkerLost, WorkerPool

if TYPE_CHECKING:  # a crawl that renders or logs in loads them (``_open``)
    from .runlogins import RunLogins

__all__ = ["LIVE_STATS", "CrawlProgress", "Crawler", "robots_backoff"]

log = logging.getLogger("evidence.crawl")



class Crawler:
    """One run of the crawl configured by ``config`` over ``store``."""

    def __init__(self, store: Store, config: CrawlConfig,
                 options: CrawlOptions | None = None) -> None:
        self.store = store
        self.config = config
        self.options = options = options or CrawlOptions()
        self._stop = anyio.Event()  # the scheduler is done: no more claims
        self._halt = anyio.Event()  # a stop was requested: start no more requests
        self._stop_reason = ""
        self._fetching: anyio.CancelScope | None = None  # in-flight work, while the run goes
        self._cancelled = ""  # why in-flight fetches were cancelled, once they were
        self._wake = anyio.Event()
        self.run_id = new_id("run-")
        self.session_id = ""
        # The run's logins (``_crawl/runlogins.py``), once the run opens: only when the
        # secrets file gives a login (a crawl that never logs in loads no browser code).
        self._logins: RunLogins | None = None
        self._hostrules = HostRules(run_id=self.run_id, user_agent=config.user_agent,
                                    artifacts=store.artifacts, fetch=self._fetch,
                                    commit=self._commit)
        self._scheduler = Scheduler(
            workers=options.workers, per_host=options.per_host, delay=options.delay,
            tasks=self._tasks(), max_documents=options.max_documents,
            crawl_delay=self._hostrules.crawl_delay)
        self._slots = FetchSlots(self._scheduler)
        self._requested = 0
        self._capped = False
        self._released: list[Job] = []  # claimed ahead but not started when the run stopped
        self._errors = 0
        self._last_error: str | None = None
        self._pool: WorkerPool | None = None  # with options.processes, while the run goes
        self._service: Service
        self._progress: CrawlProgress | None = None  # the last progress report
        self.metrics_address: tuple[str, int] | None = None  # with options.metrics
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
                    if self._logins is not None:
                        await self._logins.first(self.options.request)
                    async with self._worker_processes(), anyio.create_task_group() as tg:
                        tg.start_soon(self._report_progress, started)
                        send, receive = anyio.create_memory_object_stream[Job](0)
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
                store_error = stopped_by_the_store(exc, self.store.location)
                if store_error is not None:
                    raise store_error from exc
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
                unfetched = no_seed_fetched(reader, self.session_id)
                if unfetched is not None:
                    outcome, reason = "failed", unfetched
            await self._end(outcome, reason, complete=complete)
            counts = frontier.counts(reader, self.session_id)
        return CrawlResult(session_id=self.session_id, run_id=self.run_id, outcome=outcome,
                           reason=reason, resumed=resumed, session_completed=complete,
                           documents=self._scheduler.documents,
                           counts=counts)

    async def _open(self, stack: contextlib.AsyncExitStack) -> None:
        """The HTTP client, and the writer: in process, or as a service for worker
        processes (on a Unix socket in a private temporary directory)."""
        limits = self.options.writer_limits or WriterLimits(max_batch_delay=0.002)
        connections = self.options.workers * 2
        proxies = crawl_routes(self.config.proxy, self.config.proxies,
                               remote_dns=self.config.proxy_remote_dns,
                               credentials=self.options.proxy_credentials)
        policy = NetworkPolicy(allow=self.config.allow_network,
                               seeds=[*self.config.seeds, *proxies.urls()],
                               resolver=self.options.resolver)
        client = await stack.enter_async_context(crawl_client(
            connections=connections, timeout=self.options.timeout, policy=policy,
            proxies=proxies, http1_only=self.config.http1_only))
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
        # In one process every page commits here: this crawl knows what reaches its writer,
        # and says when nothing else is coming (``_nothing_else_coming``).
        last = functools.partial(self._writer.submit_group, flush=True) if in_process else None
        self.options = per_seed(self.config, self.options)
        self._pages = PageWorker(config=self.config, session_id="", run_id=self.run_id,
                                 artifacts=self.store.artifacts, client=client,
                                 submit=self._writer.submit_group,
                                 deadline=self.options.deadline,
                                 url_keys=self._writer.url_keys, submit_last=last,
                                 request=self.options.request)
        self._renderer = None
        if self._pages.rules is not None and self._pages.rules.rendered and not (
                self._pages.render_scope.enabled):
            rule = self._pages.rules.rendered[0]
            raise EvidenceError(f"rule {rule.id!r} reads the rendered DOM, and this crawl "
                                "does not render", hint="add --render (or --render-only), "
                                "or give the rule input = 'response'")
        if self._pages.render_scope.enabled:  # the browser starts with the first render
            from .render import Renderer  # here: a crawl that does not render loads no browser

            self._renderer = await stack.enter_async_context(Renderer(
                artifacts=self.store.artifacts, client=client, run_id=self.run_id,
                user_agent=self.config.user_agent, max_body_bytes=self.config.max_body_bytes,
                options=self.options.render, unsafe_refusal=None
                if self.config.render_unsafe_anywhere else self._pages.scope.reason_out_of,
                request=self.options.request))
        request = self.options.request
        if request is not None and request.logins:
            from .render import Renderer
            from .runlogins import RunLogins

            self._logins = RunLogins(artifacts=self.store.artifacts, fetch=self._fetch,
                                     commit=self._commit)
            self._logins.renderer = self._renderer
            if self._logins.renderer is None:  # logins run in Chromium whether pages render
                self._logins.renderer = await stack.enter_async_context(Renderer(
                    artifacts=self.store.artifacts, client=client, run_id=self.run_id,
                    user_agent=self.config.user_agent,
                    max_body_bytes=self.config.max_body_bytes,
                    options=self.options.render, unsafe_refusal=None
                    if self.config.render_unsafe_anywhere
                    else self._pages.scope.reason_out_of, request=request))
            self._pages.relogin = self._logins.relogin

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
                      timeout=self.options.timeout, deadline=self.options.deadline,
                      proxy_credentials=self.options.proxy_credentials)
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
        """Start or resume the session and the run (``_crawl.session``), then read what
        the store says of the session's hosts (robots.txt, backoffs)."""
        opening = open_session(self._reader, self.config, self.run_id,
                               clean=self.options.clean, full=self.options.full,
                               skip=self._skip)
        self.session_id = self._pages.session_id = opening.session_id
        await self._commit(opening.messages)
        if opening.resumed and self.options.request is not None:
            heads = self.options.request.restore(self._reader, self.store.artifacts,
                                                 self.session_id)
            log.info("cookie jar of session %s rebuilt from %d recorded response heads",
                     self.session_id, heads, extra={"event": "crawl.cookies_restored"})
        if self._pages.rules is not None:
            check_rules(self._reader, self._pages.rules.rules)
        baseline_id = opening.baseline_id
        if baseline_id is not None:
            self._baseline = Baseline(self._reader, self.store.artifacts, baseline_id,
                                      self._due_rules)
        now_mono, now_utc = time.monotonic(), utc_now()
        self._hostrules.reader = self._reader
        for host, record in frontier.host_states(self._reader).items():
            self._hostrules.records[host] = record
            backoff = parse_time_text(record[3])
            if backoff is not None and backoff > now_utc:
                until = now_mono + (backoff - now_utc).total_seconds()
                state = self._scheduler.host(host)
                state.next_start = state.next_request = until
        log.info("session %s run %s %s (%s)", self.session_id, self.run_id,
                 "resumed" if opening.resumed else "started",
                 "full" if baseline_id is None else f"incremental against {baseline_id}",
                 extra={"event": "run.started", "session_id": self.session_id})
        return opening.resumed

    async def _end(self, outcome: Outcome, reason: str, *, complete: bool) -> None:
        if complete:
            baseline = self._baseline.session_id if self._baseline else None
            for chunk in documents(self._reader, self.session_id, self.run_id, baseline):
                await self._commit([chunk])
        with anyio.CancelScope(shield=True):
            await self._commit(run_ended(self.run_id, self.session_id, outcome, reason,
                                         complete=complete))
        log.info("run %s ended: %s (%s)", self.run_id, outcome, reason,
                 extra={"event": "run.ended"})

    async def _commit(self, messages: Sequence[Message]) -> None:
        await self._pages.commit(messages, last=self._nothing_else_coming())

    async def _record(self, settlement: Settlement, slot: Slot | None = None) -> PageEffects:
        """Commit a page's outcome, with its worker's next claim riding it if it may."""
        claimed = self._claim_next(slot) if slot is not None and settlement.open else []
        return await self._pages.record(settlement, claimed=claimed,
                                        last=self._nothing_else_coming())

    def _update(self, **changes: list) -> FrontierUpdate:
        return self._pages.update(**changes)

    def _skip(self, url: str, depth: int) -> str | None:
        return self._pages.skip(url, depth)

    # --- scheduling ----------------------------------------------------------------------

    async def _schedule(self, send: anyio.abc.ObjectSendStream[Job]) -> tuple[Outcome, str]:
        scheduler = self._scheduler
        # Claims commit concurrently (each hands its jobs to the workers once durable):
        # slots that free while one claim commits need not wait for it.
        async with send, anyio.create_task_group() as claims:
            while True:
                if self._stop.is_set():
                    return "stopped", "stop requested"
                if scheduler.capped:
                    self._capped = True  # what was claimed is fetched: it counts
                    return "capped", f"reached --max-documents {scheduler.cap}"
                await scheduler.refill(self.store, self._reader, self.session_id,
                                       self._pages.url_keys)
                free = scheduler.claimable()
                jobs, wakeup = (scheduler.claim(free) if free > 0
                                else ([], time.monotonic() + 1))
                if jobs:
                    claims.start_soon(self._claim, jobs, send)
                    continue
                if scheduler.idle:
                    if scheduler.reread():  # one full re-read
                        continue
                    if scheduler.exhausted:
                        return "completed", "the frontier is exhausted"
                with anyio.move_on_after(max(0.0, wakeup - time.monotonic())):
                    await self._wake.wait()
                self._wake = anyio.Event()
        raise AssertionError("the scheduler ends by returning")  # a task group may swallow

    async def _claim(self, jobs: list[Job], send: anyio.abc.ObjectSendStream[Job]) -> None:
        await self._commit([self._update(claimed=[j.url for j in jobs])])
        for job in jobs:
            await send.send(job)

    def _tasks(self) -> int:
        """Worker tasks, each taking one page from claim to commit. More pages than
        fetches are on their way: a fetch slot is free once its request is over
        (``_request_over``), so the next page is requested while the last one is parsed
        and commits, and a slot's next URL is claimed while it fetches. In one process a
        busy worker's next page also rides its commit (``_claim_next``); worker processes
        commit their pages themselves, where a next claim cannot ride."""
        in_workers = self.options.processes > 0 or bool(self.options.listen)
        return self.options.workers * (PAGES_PER_FETCH_IN_WORKERS if in_workers
                                       else PAGES_PER_FETCH)

    # --- worker tasks ------------------------------------------------------------------

    async def _worker(self, jobs: anyio.abc.ObjectReceiveStream[Job]) -> None:
        async with jobs:
            job: Job | None = None  # claimed with this worker's last page, in its group
            while True:
                if job is None:
                    try:
                        job = await jobs.receive()
                    except anyio.EndOfStream:
                        return
                    self._scheduler.take()
                with log_context(url=job.url):
                    job = await self._work(job)

    async def _work(self, job: Job) -> Job | None:
        """Request and settle one claimed page; the next job if one was claimed with it
        (the worker task has then taken it: ``FetchSlots.finish``)."""
        requested = False
        slot = self._slots.slot(job)
        try:
            if self._halt.is_set():
                self._released.append(job)  # claimed ahead, never started
                return None
            await self._slots.take(slot)
            if not await self._slots.polite(slot, self._halt):
                self._released.append(job)  # the run stopped while it waited
                return None
            requested = True
            await self._process(job, slot)
        except anyio.get_cancelled_exc_class():
            if not requested:
                self._released.append(job)
            if slot.next is not None:
                self._released.append(slot.next)  # its claim may have committed
                self._scheduler.drop_riding(slot.next)
                slot.next = None
            raise  # a job cancelled mid-fetch stays claimed: the next run requeues it
        finally:
            self._slots.finish(slot)
            self._wake.set()
        return slot.next

    def _request_over(self, slot: Slot) -> None:
        """The request for this page is over, and the page is parsed and commits (in
        this process, or in its worker process): its host slot and fetch slot are free for
        the scheduler's next claim. Not when pages render here (a render is another
        request to the host)."""
        if self._renderer is not None:
            return
        self._slots.committing(slot)
        self._wake.set()

    def _nothing_else_coming(self) -> bool:
        """Whether the page about to commit is the only one of this process not yet
        submitted or riding a commit: then the writer need not linger for more pages."""
        scheduler = self._scheduler
        return scheduler.claimed - scheduler.riding - self._pages.committing <= 1

    def _claim_next(self, slot: Slot) -> list[str]:
        """When a page fetched by this process is about to commit: its request is over, so
        its host slot is free; the URL this worker will request next is claimed in the
        same group (one commit per page instead of a claim commit before it and a page
        commit after). Nothing when the run is stopping or capped, or renders (a render
        after the fetch is another request to the host)."""
        if (slot.next is not None or self._renderer is not None
                or self._halt.is_set() or self._stop.is_set()):
            return []
        self._slots.committing(slot)
        slot.next = self._scheduler.ride()
        return [] if slot.next is None else [slot.next.url]

    async def _process(self, job: Job, slot: Slot) -> None:
        if self._renderer is not None:  # a capture an earlier run fetched but did not render
            stored = unrendered_capture(self._reader, self._pages.render_scope,
                                        self.session_id, job.url, job.key)
            if stored is not None:
                self._scheduler.unrequested()  # never requested again
                await self._render(job, stored)
                return
        host = job.host
        doc = (self._baseline.lookup(job.url, job.key) if self._baseline is not None
               else None)
        if doc is not None and self._baseline is not None and job.key not in self._sitemap_keys:
            hint = sitemap_hint(self._reader, self.session_id, job.url, job.key)
            reason = self._baseline.not_due(job.url, doc, hint, utc_now(), job.key)
            if reason is not None:
                self._scheduler.unrequested()  # never requested
                self._slots.unrequested(slot)
                self._apply(job, await self._record(self._pages.not_due(
                    self._order(job), reason, self._baseline_found(doc))))
                return
        if self.config.obey_robots:
            robots = await self._hostrules.for_url(job.url, host)
            if robots is None:  # robots.txt unavailable: the host is in backoff
                self._slots.unrequested(slot)
                self._apply(job, await self._record(self._pages.retry(
                    self._order(job), [], self._hostrules.unavailable(host),
                    backoff=robots_backoff(self._hostrules.failures[host]))))
                return
            if not robots.allowed(job.url, self.config.user_agent):
                self._scheduler.unrequested()  # never requested
                self._slots.unrequested(slot)
                self._apply(job, await self._record(self._pages.refused_by_robots(
                    self._order(job), robots.refusal(self.config.user_agent))))
                return
        conditional = {}
        if doc is not None and doc.http_status == 200:
            if doc.etag:
                conditional["If-None-Match"] = doc.etag
            if doc.last_modified:
                conditional["If-Modified-Since"] = doc.last_modified
        effects = await self._execute(self._order(job, conditional, baseline=doc is not None),
                                      slot)
        self._apply(job, effects)
        if effects.render is not None:
            await self._render(job, effects.render)
        if effects.unchanged is not None:
            assert doc is not None
            self._apply(job, await self._record(self._pages.unchanged(
                self._order(job), effects.unchanged, self._baseline_found(doc),
                "HTTP 304 (unchanged)")))

    def _order(self, job: Job, headers: dict[str, str] | None = None, *,
               baseline: bool = False) -> PageOrder:
        return PageOrder(url=job.url, depth=job.depth, attempts=job.attempts, via=job.via,
                         headers=headers or {}, baseline=baseline, key=job.key,
                         host=job.host)

    async def _execute(self, order: PageOrder, slot: Slot) -> PageEffects:
        """Request and settle the page: in this process, or in a worker process."""
        if self._pool is None:
            result = await self._pages.request(order)
            self._request_over(slot)
            return await self._record(await self._pages.settle(order, result), slot)
        request = self.options.request
        if request is not None:  # the jar is here: this process decides the Cookie
            headers, secrets = request.order_headers(order.url, order.headers)
            order = msgspec.structs.replace(order, headers=headers, secrets=secrets, jar=True,
                                            digest=request.digest_nonce(order.url))
        try:
            async with self._pool.hand(order) as handed:
                if await handed.request_over():  # its worker process says it is over
                    self._request_over(slot)
                effects = await handed.outcome()
        except WorkerLost as lost:
            return await self._lost(order, lost)
        if request is not None and effects.head is not None:  # its Set-Cookie, a challenge
            request.update(order.url, effects.head)
            request.challenged(order.url, effects.head)
        return effects

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

    async def _render(self, job: Job, attempt: FetchAttempt) -> None:
        """Render a committed capture; ``PageWorker.rendered`` settles its page with it."""
        assert self._renderer is not None
        source = await anyio.to_thread.run_sync(source_capture, self.store.artifacts, attempt)
        rendered = await self._renderer.render(source)
        self._apply(job, await self._record(await self._pages.rendered(
            self._order(job), attempt, source, rendered)))

    def _baseline_found(self, doc: BaselineDoc) -> list[Discovery]:
        """The discoveries recorded from the baseline's capture of a document."""
        assert self._baseline is not None
        return self._baseline.discoveries_of(doc.attempt_id) if doc.attempt_id else []

    async def _fetch(self, url: str, sequence: int,
                     headers: dict[str, str] | None = None) -> FetchResult:
        self._requested += 1
        return await self._pages.fetch(url, sequence, headers)

    def _apply(self, job: Job, effects: PageEffects) -> None:
        """What a settled page tells the scheduler: a retry, a backoff, new links; and the
        operator, as it happens: a failed fetch or a backoff is logged at once."""
        self._requested += effects.requested
        if effects.problem is not None:
            self._errors += 1
            self._last_error = effects.problem
            log.warning("%s", effects.problem, extra={"event": "fetch.failed"})
        if effects.backoff is not None:
            self._scheduler.back_off(job.host, effects.backoff)
        if effects.retry_in is not None:
            self._scheduler.retry(job, effects.retry_in)
        if effects.queued_links:
            self._scheduler.exhausted = False
        self._sitemap_keys.update(effects.sitemaps)

    # --- progress --------------------------------------------------------------------

    async def _report_progress(self, started: float) -> None:
        """Each interval: call the progress callback, and write ``STORE/live-stats.json``
        (``_crawl.progress``)."""
        live = LiveStats(self.store)
        counts = FrontierCounts()
        with self.store.reader() as own:  # counting a large frontier takes a while:
            while not self._stop.is_set():  # its own connection, off the event loop
                with anyio.move_on_after(self.options.progress_interval):
                    await self._stop.wait()
                if unreachable_since(self.store) is None:  # else the last counts, and since
                    counts = await anyio.to_thread.run_sync(frontier.counts, own,
                                                            self.session_id)
                elapsed = time.monotonic() - started
                progress = self._figures(
                    counts, elapsed, self._requested / elapsed if elapsed > 0 else 0.0,
                    limited_by=self._limited_by(),
                    database_unreachable_since=unreachable_since(self.store))
                self._progress = progress  # the frontier's counts, for statistics()
                live.write(progress)
                if self.options.progress is not None:
                    self.options.progress(progress)

    def statistics(self) -> CrawlProgress:
        """The run's figures now (its metrics read them at each scrape); the frontier's
        counts are those of the last progress report (counting is a query, not a lookup)."""
        last = self._progress
        if last is None:
            return self._figures(FrontierCounts(), 0.0, 0.0)
        return self._figures(last.counts, last.elapsed, last.pages_per_second)

    def _figures(self, counts: FrontierCounts, elapsed: float, pages_per_second: float,
                 **more: object) -> CrawlProgress:
        return CrawlProgress(
            session_id=self.session_id, run_id=self.run_id, counts=counts,
            requested=self._requested, in_flight=self._slots.requests,
            pages_per_second=pages_per_second, elapsed=elapsed,
            writer=self._writer.statistics(),
            worker_pids=self._pool.pids if self._pool is not None else [],
            worker_hosts=self._pool.hosts if self._pool is not None else [],
            hosts_fenced=dict(self._pool.fenced) if self._pool is not None else {},
            seeds=self.config.seeds, workers=self.options.workers, errors=self._errors,
            last_error=self._last_error, **more)  # type: ignore[arg-type]

    def _limited_by(self) -> list[str]:
        """Why fewer than ``workers`` fetches are in flight, when URLs wait (else [])."""
        if self._slots.requests >= self.options.workers or self._halt.is_set():
            return []
        return self._scheduler.limited_by()

