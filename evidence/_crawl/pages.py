"""One claimed page, from request to evidence: every outcome a crawled URL can have.

    result = await pages.request(order)          # the request; payloads stored
    settlement = await pages.settle(order, result)
    effects = await pages.record(settlement, claimed=[next_url])

The scheduler decides *whether* a URL is requested (claims, politeness, robots.txt, an
incremental session's baseline); a ``PageWorker`` builds what the page's outcome records,
whichever it is, as a ``Settlement``: the page's attempt, links and settlement, which
``record`` submits as one group through ``submit``, so a page is never done without its
links:

- ``request`` and ``settle``: fetched (payloads durable before the attempt that names
  them), links extracted in a thread, judged by the session's rules, settled done, or
  ``retry``;
- ``refused_by_robots``: an attempt never requested, settled skipped; likewise a page
  whose connection the network policy refused (``_crawl.netpolicy``);
- ``not_due`` and ``unchanged`` (a 304): the baseline document stands; its recorded
  links are recorded for this run and followed;
- ``rendered``: a page's render, the browser's requests and the rendered DOM's links.

The page worker hands each outcome back and never calls into the crawl that runs it: the
crawl engine decides, between ``settle`` and ``record``, whether the next URL of the page's
worker task rides the page's group (``Settlement.open``: one commit per page) and whether
the writer should commit without lingering (``last``). A worker process or host runs
``page``: the same steps, telling its channel when the request is over.

Where a reference leads is decided in one place, ``follow``: the URL as the page wrote
it, via its edge kind, one level deeper for a link or an embed, at the page's depth for a
redirect or a sitemap entry. ``submit`` is the writer in a single-process crawl, or the
writer service's client in a worker process (``evidence crawl --processes N``): the same
code either way.

What the scheduler must learn back (a retry to queue, a host backoff, whether new links
were queued) returns as ``PageEffects``, a plain struct that crosses a process boundary as
msgpack. A 304 on a baseline document is handed back unsettled (``PageEffects.unchanged``):
the engine owns the baseline, and settles it with ``unchanged``.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import anyio
import msgspec

from .._errors import EvidenceError, URLError
from .._model.acks import Ack
from .._model.messages import (
    Discovery,
    FetchAttempt,
    FrontierUpdate,
    HostUpdate,
    Message,
    ObservedRef,
    QueuedUrl,
    SettledUrl,
    new_id,
    utc_now,
)
from .._model.text import Sniffed, charset_param
from .._model.urls import key_and_host, normalize_url, resolve_reference, url_host
from .._store.backend import ArtifactBackend
from .fetch import FetchResult, fetch, parse_retry_after
from .frontier import CrawlConfig, Scope
from .http import Client
from .links import REQUISITE_KINDS, extract_links
from .loginrecipe import LoginRecipe, logged_out_reason
from .renderscope import RenderScope
from .rules import evaluate_page
from .rulesfile import RuleSet
from .secrets import RequestOptions, new_challenge, set_cookies

if TYPE_CHECKING:  # what a render hands back: loaded by a crawl that renders
    from .render import Rendered, SourceCapture

__all__ = ["PageEffects", "PageOrder", "PageWorker", "Settlement"]

log = logging.getLogger("evidence.crawl")

Submit = Callable[[Sequence[Message]], Awaitable[list[Ack]]]


class PageOrder(msgspec.Struct, frozen=True, kw_only=True):
    """A claimed URL a worker may request now."""

    url: str
    depth: int
    attempts: int  # claims before this one: the request is attempt ``attempts + 1``
    via: str
    headers: dict[str, str] = {}  # conditional request headers from the baseline
    baseline: bool = False  # the URL has a baseline document: a 304 goes back unsettled
    # The URL's fetch key and host, as the frontier holds them: a page job carries them
    # so that nothing computes them again (issue 15, one pass per page).
    key: str = ""
    host: str = ""
    # For a worker process (``--processes``): the request options' values among
    # ``headers`` that are secret, sealed in the stored request (``_crawl.secrets``);
    # whether the crawl's request options want the answer's head back (its
    # ``Set-Cookie``, a digest challenge: the jar and the challenges live in the crawl's
    # process, which decides each order's fields); and with digest credentials for the
    # host, the nonce the crawl answers there ("" none yet): a 401 with another is retried.
    secrets: list[str] = []
    jar: bool = False
    digest: str | None = None

    def __repr__(self) -> str:  # a debug line never shows a header's value
        return f"PageOrder({self.url!r}, attempts={self.attempts})"


class PageEffects(msgspec.Struct, frozen=True, kw_only=True):
    """What the scheduler learns from a page its worker settled."""

    requested: int = 0  # HTTP requests made
    retry_in: float | None = None  # requeued: claim it again after this many seconds
    backoff: float | None = None  # the host backs off for this many seconds
    queued_links: bool = False  # URLs were queued that the scheduler has not read yet
    sitemaps: list[str] = []  # fetch keys of sitemaps a sitemap index listed
    unchanged: FetchAttempt | None = None  # a 304 on a baseline document, not committed
    problem: str | None = None  # a failed fetch or a backoff, in words, for the operator
    # A page to render (``_crawl.renderscope``): committed, links and all, but left in
    # flight; the crawl process renders it and settles it with the render.
    render: FetchAttempt | None = None
    # A worker process's page, for the crawl's request options (``PageOrder.jar``): the
    # answer's head, when it sets a cookie or is a 401.
    head: bytes | None = None


@dataclass(frozen=True)
class Settlement:
    """A page's outcome, built and not yet committed: the group that records it, and what
    the scheduler learns from it. ``open``: the group ends with the page's own frontier
    update, in which the URLs its worker requests next may be claimed (``with_claims``)."""

    messages: list[Message]
    effects: PageEffects
    open: bool = False

    def with_claims(self, claimed: Sequence[str]) -> list[Message]:
        """The group, with ``claimed`` in its last update (applied after the URLs it
        queues, before its settlement: a different URL either way)."""
        if not claimed:
            return self.messages
        if not self.open:
            raise ValueError("a claim rides only a page's own frontier update")
        update = self.messages[-1]
        assert isinstance(update, FrontierUpdate)
        return [*self.messages[:-1], msgspec.structs.replace(update, claimed=list(claimed))]

    def replace(self, **effects: object) -> Settlement:
        return Settlement(self.messages, msgspec.structs.replace(self.effects, **effects),
                          self.open)


class PageWorker:
    """Fetches and settles pages of one run of one session; shared by concurrent tasks.
    It builds each page's outcome (a ``Settlement``) and commits it when told
    (``record``); it never calls back into the crawl that runs it."""

    def __init__(self, *, config: CrawlConfig, session_id: str, run_id: str,
                 artifacts: ArtifactBackend, client: Client, submit: Submit,
                 deadline: float | None = None, url_keys: dict[str, str] | None = None,
                 submit_last: Submit | None = None,
                 request: RequestOptions | None = None) -> None:
        self.config = config
        # Headers, cookies and credentials added to requests, and the session's cookie jar
        # (``_crawl.secrets``, ``_crawl.cookies``); None: requests carry none.
        self.request_options = request
        # Log in again after a page showed the crawl logged out (``_crawl.login``): the
        # crawl's, which says what to put in the page's retry (None: no login left).
        self.relogin: Callable[[LoginRecipe, str, dt.datetime],
                               Awaitable[str | None]] | None = None
        self.scope = Scope(config)
        self.rules = RuleSet.from_record(config.rules) if config.rules else None
        self.render_scope = RenderScope(config)
        self.session_id = session_id
        self.run_id = run_id
        self.artifacts = artifacts
        self.client = client
        self.deadline = deadline  # seconds one fetch may take in all (connect, head, body)
        self._submit = submit
        # URL -> fetch key: the writer's memo when it runs in this process (its submit
        # then finds every key this worker computed), else this worker's own.
        self.url_keys = url_keys if url_keys is not None else {}
        self._hosts: dict[str, str] = {}  # fetch key -> host
        # Fetch keys this worker has seen committed into the session's frontier for good:
        # queued, or skipped for a reason no other depth would change. Queuing one again
        # changes nothing (the frontier keeps a URL's state), so ``follow`` leaves it out
        # of its FrontierUpdate; its edge is still recorded with the page's Discovery.
        self._in_frontier: set[str] = set()
        # A crawl with its own Writer: the submit for a group that commits without
        # lingering for more (``flush``), used when the crawl says no other page is on its
        # way (``commit(..., last=True)``).
        self.submit_last = submit_last
        self.committing = 0  # groups submitted, not yet committed

    # --- shared with the scheduler -----------------------------------------------------

    async def commit(self, messages: Sequence[Message], *, last: bool = False) -> None:
        """Submit a page's messages as one group and wait for them to commit. ``last``: no
        other page is on its way, so the writer is told not to linger for more
        (``submit_last``: ``Writer.submit_group`` with ``flush``), if it can be."""
        submit = self._submit
        if last and self.submit_last is not None:
            submit = self.submit_last
        self.committing += 1
        try:
            acks = await submit(messages)
        finally:
            self.committing -= 1
        bad = [a for a in acks if a.status not in ("committed", "duplicate")]
        if bad:
            raise EvidenceError(f"the store refused crawl state: {bad[0].reason}",
                                message_id=bad[0].message_id)
        self._remember_queued(messages)

    def _remember_queued(self, messages: Sequence[Message]) -> None:
        """The committed frontier entries whose state no later queuing changes: the URL
        queued, or skipped at a depth the scope allows (a depth skip is queued again when
        the URL turns up shallower, so it is not remembered)."""
        known = self._in_frontier
        if len(known) > _URL_KEYS_LIMIT:
            known.clear()
        max_depth = self.scope.max_depth
        for message in messages:
            if type(message) is FrontierUpdate:
                for q in message.queued:
                    if q.skip is None or max_depth is None or q.depth <= max_depth:
                        key = self.url_keys.get(q.url)
                        if key is not None:
                            known.add(key)

    def update(self, **changes: list) -> FrontierUpdate:
        return FrontierUpdate(message_id=new_id("m-"), session_id=self.session_id,
                              run_id=self.run_id, at=utc_now(), **changes)

    def skip(self, url: str, depth: int) -> str | None:
        try:
            return self.scope.reason_to_skip(url, depth)
        except URLError as exc:
            return f"invalid URL: {exc}"

    def key(self, url: str) -> tuple[str, str] | None:
        """(fetch key, host) of ``url``, computed once per crawl (links repeat from page to
        page) and remembered for the writer; None if it has none."""
        key = self.url_keys.get(url)
        host = self._hosts.get(key) if key is not None else None
        if key is None or host is None:
            try:
                key, host = key_and_host(url)
            except URLError:
                return None
            if len(self.url_keys) > _URL_KEYS_LIMIT:
                self.url_keys.clear()
            if len(self._hosts) > _URL_KEYS_LIMIT:
                self._hosts.clear()
            self.url_keys[url] = key
            self._hosts[key] = host
        return key, host

    def follow(self, refs: Sequence[ObservedRef], depth: int, source_attempt_id: str
               ) -> list[QueuedUrl]:
        """Where a page's references lead: the frontier entries they make, the first of
        each fetch key only, with the scope's verdict. Each URL as the page wrote it
        (resolved, never normalized: it is requested as given; keyed once per crawl).
        One level deeper than the page for a link or an embed, at the page's own depth for
        a redirect (the same document, moved) or a sitemap entry (listed, not linked).
        Page requisites keep the page's depth and are queued, ``via`` embed, only when the
        crawl follows them (``CrawlConfig.requisites``); otherwise their edges are the
        record. A URL this worker saw committed to the frontier for good is left out
        (``_remember_queued``): queuing it again would change nothing. Every page outcome
        that queues URLs comes through here: a fetched page, an unchanged one, a rendered
        one."""
        queued: list[QueuedUrl] = []
        seen: set[str] = set()
        in_frontier = self._in_frontier
        for ref in refs:
            kind = ref.edge_kind
            if kind in REQUISITE_KINDS:
                if not self.config.requisites:
                    continue
                via, at = "embed", depth
            elif kind == "sitemap":
                via, at = "sitemap", depth
            elif kind == "redirect":
                via, at = "redirect", depth
            else:
                via, at = ("embed" if kind == "embed" else "link"), depth + 1
            known = self.key(ref.url)
            if known is None or known[0] in seen or known[0] in in_frontier:
                continue
            seen.add(known[0])
            queued.append(QueuedUrl(url=ref.url, depth=at, via=via,  # type: ignore[arg-type]
                                    source_attempt_id=source_attempt_id,
                                    skip=self.scope.reason_to_skip_key(*known, at)))
        return queued

    async def fetch(self, url: str, sequence: int, headers: dict[str, str] | None = None,
                    keep_content: int | None = None, secrets: Sequence[str] = ()
                    ) -> FetchResult:
        """Request ``url`` with this crawl's caps; ``keep_content``: ``FetchResult.body``
        holds a content of at most this many bytes (None: any, e.g. a robots.txt);
        ``secrets``: values among ``headers`` sealed in the stored request."""
        config = self.config
        secrets = list(secrets)
        if self.request_options is not None:
            added = self.request_options.for_url(url)
            headers, secrets = {**added.headers, **(headers or {})}, added.secrets
        result = await fetch(self.client, self.artifacts, url=url, run_id=self.run_id,
                             sequence=sequence, user_agent=config.user_agent,
                             max_body_bytes=config.max_body_bytes,
                             max_content_bytes=config.max_content_bytes,
                             keep_content=keep_content,
                             extra_headers=headers or None, secrets=secrets,
                             parse=functools.partial(_page_links, url,
                                                     max_bytes=config.max_parse_bytes,
                                                     max_links=config.max_links),
                             deadline=self.deadline)
        if self.request_options is not None and result.headers is not None:
            self.request_options.update(url, result.head)
        attempt = result.attempt
        log.debug("%s: %s%s", url, attempt.outcome,
                  f", HTTP {attempt.http_status}" if attempt.http_status else "",
                  extra={"event": "fetch.done", "url": url, "attempt_id": attempt.attempt_id})
        return result

    # --- one page ----------------------------------------------------------------------

    async def request(self, order: PageOrder) -> FetchResult:
        """Request the page once (its payloads stored when this returns)."""
        # Once stored, a page's content is kept only for rules to read (never one larger
        # than they read): what the page derived is not held while it commits.
        keep = self.config.max_parse_bytes if self.rules or self._reads_for_login(
            order.url) else 0
        return await self.fetch(order.url, order.attempts + 1, order.headers or None, keep,
                                order.secrets)

    async def record(self, settlement: Settlement, *, claimed: Sequence[str] = (),
                     last: bool = False) -> PageEffects:
        """Commit a page's outcome as one group (with ``claimed``, the URLs its worker
        requests next, when the settlement is ``open`` to them; ``last`` as ``commit``),
        and hand back what the scheduler learns from it."""
        if settlement.messages:
            await self.commit(settlement.with_claims(claimed), last=last)
        return settlement.effects

    async def page(self, order: PageOrder,
                   fetched: Callable[[], Awaitable[None]] | None = None) -> PageEffects:
        """Request the page, settle it and commit it (or hand back a baseline 304): how a
        worker process or a worker host runs an order, ``fetched`` telling its channel
        that the request is over (its fetch slot free) before the page commits."""
        result = await self.request(order)
        if fetched is not None:
            await fetched()
        effects = await self.record(await self.settle(order, result))
        if order.jar and result.headers is not None and (
                result.status == 401 or set_cookies(result.head)):
            return msgspec.structs.replace(effects, head=result.head)
        return effects

    async def settle(self, order: PageOrder, result: FetchResult) -> Settlement:
        """What the page's request comes to, built and not yet committed (``record``): a
        page done, a retry, a skip; a 304 on a baseline document goes back unsettled."""
        if result.status == 304 and order.baseline:
            return Settlement([], PageEffects(requested=1, unchanged=result.attempt))
        settlement = await self._settle(order, result)
        return settlement.replace(requested=1)

    async def _settle(self, order: PageOrder, result: FetchResult) -> Settlement:
        attempt, status = result.attempt, result.status
        if attempt.outcome == "skipped":  # the network policy refused it: never requested
            reason = attempt.error or "skipped"
            return Settlement([attempt, self.update(
                settled=[SettledUrl(url=order.url, state="skipped", reason=reason)])],
                PageEffects(problem=_problem(order.url, reason, None)))
        messages: list[Message] = [attempt]
        if self.rules is not None and attempt.response_headers is not None:
            document = attempt.content or attempt.body  # the content: what rules read
            # A document over the cap is not read, and was not kept (fetch's keep_content).
            handed = document is not None and document.size <= self.config.max_parse_bytes
            messages += await anyio.to_thread.run_sync(functools.partial(
                evaluate_page, self.rules.response, url=attempt.url,
                attempt_id=attempt.attempt_id, run_id=self.run_id, headers_bytes=result.head,
                body_bytes=result.body if handed else None,
                headers_ref=attempt.response_headers, body_ref=document,
                elapsed_ms=attempt.elapsed_ms,
                body_truncated=attempt.body_truncated or attempt.content_truncated,
                decoded=True, content_coding=attempt.content_coding,
                max_bytes=self.config.max_parse_bytes))
        # A timeout or a broken connection is transient even after the head came (the body
        # is incomplete): retried like a 5xx, never settled as done on a partial body.
        transient = attempt.outcome in ("timeout", "network_error")
        relogged = await self._logged_out(order.url, result)
        if relogged is not None:
            return self.retry(order, messages, relogged, backoff=None, wait=0.0)
        if status == 401 and self._challenged(order, result.head):
            return self.retry(order, messages, "HTTP 401: a digest challenge, answered by "
                              "the next attempt", backoff=None, wait=0.0)
        if transient or status is None or status in (429, 503) or status >= 500:
            retry_after = None
            if status in (429, 503) and result.headers is not None:
                retry_after = parse_retry_after(result.headers.get("retry-after"), utc_now())
            what = (f"{attempt.outcome.replace('_', ' ')} ({(attempt.error or '')[:300]})"
                    if transient else f"HTTP {status}")
            return self.retry(order, messages, what, backoff=retry_after)
        refs: list[ObservedRef] = []
        sitemaps: list[str] = []
        truncated = False
        source = attempt.content or attempt.body  # links are found in the content
        headers = result.headers
        if 300 <= status < 400 and headers is not None and headers.get("location"):
            location = headers["location"]
            source = attempt.response_headers
            try:
                target = resolve_reference(order.url, location)
                refs.append(ObservedRef(observed=location, url=target, position=0,
                                        tag="http", attr="location", edge_kind="redirect"))
            except URLError as exc:
                log.info("redirect from %s to an unusable location: %s", order.url, exc,
                         extra={"event": "fetch.redirect_unusable"})
        elif 200 <= status < 300 and result.parsed is not None:
            # Parsed by fetch, in the thread that stored the payloads (CPU work stays off
            # the event loop, so a page that is slow to parse never stalls the others).
            refs, truncated, sitemaps = result.parsed
            truncated = truncated or attempt.body_truncated or attempt.content_truncated
        queued = self.follow(refs, order.depth, attempt.attempt_id)
        if refs and source is not None:
            messages.append(Discovery(message_id=new_id("m-"), run_id=self.run_id,
                                      source_attempt_id=attempt.attempt_id,
                                      source_artifact=source, refs=refs, truncated=truncated))
        render = attempt if self.render_scope.wants(attempt) else None
        settled = [] if render is not None else [SettledUrl(  # settled with its render
            url=order.url, state="done", reason=f"HTTP {status}")]
        messages.append(self.update(queued=queued, settled=settled))
        # The URL this worker requests next may be claimed in the same update (``record``),
        # unless the page is rendered first (a render is another request to the host).
        return Settlement(messages, PageEffects(
            queued_links=any(q.skip is None for q in queued), sitemaps=sitemaps,
            render=render), open=render is None)

    # --- outcomes without a request -------------------------------------------------

    def refused_by_robots(self, order: PageOrder, reason: str) -> Settlement:
        """robots.txt disallows the URL: an attempt that was never requested, which says
        why, and the URL settled skipped with the same reason."""
        attempt = self._unrequested(order, "refused_by_robots", reason)
        return Settlement([attempt, self.update(
            settled=[SettledUrl(url=order.url, state="skipped", reason=reason)])],
            PageEffects())

    def not_due(self, order: PageOrder, reason: str,
                baseline: Sequence[Discovery]) -> Settlement:
        """An incremental session's baseline document that is not due yet: not requested
        (a ``skipped`` attempt says why), and it leads on as recorded (``unchanged``)."""
        return self.unchanged(order, self._unrequested(order, "skipped", reason),
                              baseline, reason)

    def unchanged(self, order: PageOrder, attempt: FetchAttempt,
                  baseline: Sequence[Discovery], reason: str) -> Settlement:
        """A baseline document that stands (a 304, or not due): ``attempt`` is this run's
        (the 304, or the skipped one), ``baseline`` the discoveries recorded from the
        baseline's capture. Each is recorded again for this run, from the artifact its
        references were found in, and they are followed as when they were found: the
        page is settled done with its links, as a fetched page is."""
        messages: list[Message] = [attempt]
        refs: list[ObservedRef] = []
        for found in baseline:
            messages.append(Discovery(
                message_id=new_id("m-"), run_id=self.run_id,
                source_attempt_id=attempt.attempt_id, source_artifact=found.source_artifact,
                refs=found.refs, truncated=found.truncated))
            refs += found.refs
        queued = self.follow(refs, order.depth, attempt.attempt_id)
        messages.append(self.update(queued=queued, settled=[
            SettledUrl(url=order.url, state="done", reason=reason)]))
        sitemaps = [normalize_url(r.url) for r in refs
                    if r.edge_kind == "sitemap" and r.tag == "sitemap"]
        return Settlement(messages, PageEffects(
            queued_links=any(q.skip is None for q in queued), sitemaps=sitemaps))

    def _unrequested(self, order: PageOrder, outcome: Literal["refused_by_robots", "skipped"],
                     reason: str) -> FetchAttempt:
        return FetchAttempt(
            message_id=new_id("m-"), attempt_id=new_id("a-"), run_id=self.run_id,
            url=order.url, sequence=order.attempts + 1, started_at=utc_now(),
            elapsed_ms=0.0, outcome=outcome, error=reason)

    def _challenged(self, order: PageOrder, head: bytes) -> bool:
        """Whether a 401 brought a digest challenge the page's next attempt answers: the
        request options' (kept for the host), or, in a worker process, one the crawl's
        process will answer (a nonce other than the order's; it reads the head back)."""
        if self.request_options is not None:
            return self.request_options.challenged(order.url, head)
        return order.digest is not None and new_challenge(head, order.digest) is not None

    # --- logins ---------------------------------------------------------------------

    def _reads_for_login(self, url: str) -> bool:
        """Whether a page's content is kept to look for a login's ``logged_out`` pattern."""
        if self.request_options is None or self.relogin is None:
            return False
        recipe = self.request_options.login_for(url)
        return recipe is not None and recipe.logged_out is not None

    async def _logged_out(self, url: str, result: FetchResult) -> str | None:
        """If the page shows the crawl logged out and a login ran again: the retry's
        reason (``_crawl.login``)."""
        if self.request_options is None or self.relogin is None or result.headers is None:
            return None
        recipe = self.request_options.login_for(url)
        if recipe is None:
            return None
        why = logged_out_reason(recipe, url, result.status, result.headers.get("location"),
                                result.body)
        if why is None:
            return None
        done = await self.relogin(recipe, why, result.attempt.started_at)
        return None if done is None else f"logged out ({why}): {done}"

    # --- a render --------------------------------------------------------------------

    async def rendered(self, order: PageOrder, attempt: FetchAttempt, source: SourceCapture,
                       rendered: Rendered) -> Settlement:
        """Settle a page with its render (``_crawl.renderscope``): the render and the
        browser's requests, the verdicts of rules that read the rendered DOM, the DOM's
        links and where they lead, and the page done; or, if the render failed, a retry.
        ``attempt`` is the capture rendered, of this run or an earlier one."""
        render = rendered.render
        messages: list[Message] = [render, *rendered.attempts]
        if render.outcome != "rendered":
            return self.retry(order, messages, f"render {render.outcome}: {render.error}",
                              backoff=None)
        rules = self.rules.rendered if self.rules is not None else ()
        if rules and rendered.dom is not None and render.dom is not None:
            assert attempt.response_headers is not None
            messages += await anyio.to_thread.run_sync(functools.partial(
                evaluate_page, rules, url=attempt.url,
                attempt_id=attempt.attempt_id if attempt.run_id == self.run_id else None,
                run_id=self.run_id, headers_bytes=source.head, body_bytes=rendered.dom,
                headers_ref=attempt.response_headers, body_ref=render.dom,
                elapsed_ms=attempt.elapsed_ms, decoded=True, rendered=True,
                max_bytes=self.config.max_parse_bytes))
        queued: list[QueuedUrl] = []
        if rendered.refs and render.dom is not None:
            messages.append(Discovery(
                message_id=new_id("m-"), run_id=self.run_id,
                source_attempt_id=attempt.attempt_id, source_artifact=render.dom,
                refs=rendered.refs, truncated=rendered.refs_truncated,
                render_id=render.render_id))
            queued = self.follow(rendered.refs, order.depth, attempt.attempt_id)
        messages.append(self.update(queued=queued, settled=[SettledUrl(
            url=order.url, state="done",
            reason=f"HTTP {attempt.http_status}, rendered ({render.settle})")]))
        return Settlement(messages, PageEffects(queued_links=any(q.skip is None
                                                                for q in queued)))

    # --- a transient failure ---------------------------------------------------------

    def retry(self, order: PageOrder, messages: list[Message], what: str, *,
              backoff: float | None, wait: float | None = None) -> Settlement:
        """A transient failure: requeue with a delay, or fail once attempts are used up."""
        attempts = order.attempts + 1
        now = utc_now()
        if backoff is not None:
            messages = [*messages, HostUpdate(
                message_id=new_id("m-"), run_id=self.run_id,
                host=order.host or url_host(order.url),
                backoff_until=now + dt.timedelta(seconds=backoff),
                reason=f"{what}: back off {backoff:g} s")]
        if attempts >= self.config.max_attempts:
            settled = SettledUrl(url=order.url, state="failed",
                                 reason=f"{what} on attempt {attempts} of "
                                 f"{self.config.max_attempts}: attempts exhausted")
            return Settlement([*messages, self.update(settled=[settled])], PageEffects(
                backoff=backoff, problem=_problem(order.url, f"{settled.reason}; failed",
                                                  backoff, order.host)))
        if wait is None:
            wait = backoff if backoff is not None else min(60.0, 0.5 * 2 ** attempts)
        settled = SettledUrl(url=order.url, state="queued", reason=f"{what}: retry "
                             f"{attempts + 1} of {self.config.max_attempts}",
                             not_before=now + dt.timedelta(seconds=wait))
        return Settlement([*messages, self.update(settled=[settled])], PageEffects(
            backoff=backoff, retry_in=wait, problem=_problem(
                order.url, f"{what}: retry {attempts + 1} of {self.config.max_attempts} "
                f"in {wait:g} s", backoff, order.host)))


def _problem(url: str, what: str, backoff: float | None, host: str = "") -> str:
    """A failed fetch in words, e.g. for the crawl's log and progress line."""
    text = f"{url}: {what}"
    if backoff is not None:
        text += f"; host {host or url_host(url)} backs off {backoff:g} s"
    return text


_DEFAULTS = CrawlConfig(seeds=[])


def _page_links(url: str, content_type: str, body: bytes, sniffed: Sniffed | None = None,
                *, max_bytes: int = _DEFAULTS.max_parse_bytes,
                max_links: int = _DEFAULTS.max_links
                ) -> tuple[list[ObservedRef], bool, list[str]]:
    """The page's references (bounded), whether they were cut, and sitemap fetch keys. An
    HTML page is parsed up to ``max_bytes`` of its content and ``max_links`` references;
    past either the rest is not read, and the discovery is recorded as truncated."""
    content_type = content_type.lower()
    sitemaps: list[str] = []
    if "xml" in content_type and _SITEMAP_ROOT.search(body[:4096]):
        refs, truncated = _sitemap_refs(url, body)
        # Sitemaps listed by a sitemap index are sitemaps too: always fetched.
        sitemaps = [normalize_url(r.url) for r in refs if r.tag == "sitemap"]
    elif "html" in content_type:
        extraction = extract_links(body, url, encoding=charset_param(content_type),
                                   sniffed=sniffed, max_bytes=max_bytes, max_links=max_links)
        refs, truncated = extraction.refs, extraction.truncated
    else:
        return [], False, []
    refs, truncated = _bounded(refs, truncated)
    return refs, truncated, sitemaps


_SITEMAP_ROOT = re.compile(rb"<(urlset|sitemapindex)[\s>]", re.IGNORECASE)
_SITEMAP_URL = re.compile(rb"<(url|sitemap)>(.{0,20000}?)</\1>", re.IGNORECASE | re.DOTALL)
_SITEMAP_FIELD = re.compile(rb"<(loc|lastmod|changefreq)>\s*([^<]{1,8192}?)\s*</\1>",
                            re.IGNORECASE)
_SITEMAP_MAX = 50_000  # the sitemaps.org limit of URLs per file


def _sitemap_refs(url: str, body: bytes) -> tuple[list[ObservedRef], bool]:
    """<url> entries of a sitemap (or <sitemap> entries of an index, tag "sitemap"): the
    location, with lastmod and changefreq kept in ``rel`` (the recrawl eligibility of
    incremental sessions reads them from there)."""
    refs: list[ObservedRef] = []
    entries = _SITEMAP_URL.findall(body[:50 * 1024 * 1024])
    for position, (kind, entry) in enumerate(entries[:_SITEMAP_MAX]):
        fields = {k.lower().decode(): v.decode("utf-8", "replace").strip()
                  for k, v in _SITEMAP_FIELD.findall(entry)}
        if "loc" not in fields:
            continue
        try:
            target = resolve_reference(url, fields["loc"])
        except URLError:
            continue
        rel = " ".join(f"{k}={fields[k]}" for k in ("lastmod", "changefreq")
                       if k in fields and " " not in fields[k])
        refs.append(ObservedRef(observed=fields["loc"], url=target, position=position,
                                tag=kind.decode().lower(), attr="loc", rel=rel,
                                edge_kind="sitemap"))
    return refs, len(entries) > _SITEMAP_MAX


# A page's links travel in one Discovery and one FrontierUpdate, each under the writer's
# 4 MiB message limit: past this many bytes of references the rest are dropped and the
# discovery is recorded as truncated (never a failed page).
_MAX_REF_BYTES = 1536 * 1024


def _bounded(refs: list[ObservedRef], truncated: bool) -> tuple[list[ObservedRef], bool]:
    size = 0
    for i, ref in enumerate(refs):
        size += len(ref.observed) + len(ref.url) + len(ref.rel) + len(ref.tag) + 64
        if size > _MAX_REF_BYTES:
            return refs[:i], True
    return refs, truncated


_URL_KEYS_LIMIT = 20_000  # as the writer's memo: URLs whose fetch keys are remembered
