"""Rendering a stored capture in headless Chromium, as evidence.

    async with Renderer(artifacts=..., client=..., run_id=..., options=RenderOptions()) as r:
        rendered = await r.render(source)     # a Rendered: messages and the DOM's links

A render gives the browser the stored response of one attempt (``SourceCapture``) through
a recording proxy of its own (``_crawl.renderproxy``), lets the page run, and records:

- every request the browser made, each a ``FetchAttempt`` with its wire bytes, naming the
  render (``render_id``), with a sequence number unique in the run (``RENDER_SEQUENCE``
  plus the request's ordinal among the run's browser requests). A request not made is an
  attempt too, ``skipped`` with its reason, and the browser gets no answer (a network
  error): one the crawl's network policy refuses (the client's, ``_crawl.netpolicy``),
  and one other than GET or HEAD outside the crawl's scope (``unsafe_refusal``) unless
  the crawl allows it (``--render-unsafe-anywhere``);
- the DOM once it settled (namespace ``dom``, UTF-8), a full-page PNG screenshot
  (``screenshot``), optionally MHTML (``mhtml``), the title and the final URL;
- a ``Render`` message with the outcome: ``rendered``, ``timeout``, ``crashed`` (the
  page's renderer or the browser died) or ``error`` (the browser refused the page).

The settle rule. After the load event, the page is settled once, for ``quiet`` seconds
(0.5), no request has been in flight through the proxy, no image the page asked for is
still loading, and the serialized DOM has not changed (it is sampled every 100 ms); at
the latest ``settle_max`` seconds (10) after the load event (``settle = "deadline"``).
The DOM is serialized then, and the screenshot taken.

One browser serves every render of a crawl (``tabs`` pages at a time, each in a browser
context of its own: no cookies or cache shared). A browser that dies or stops answering is
killed and started again for the next render; the render it was doing is ``crashed`` or
``timeout``. The caller bounds retries (``--max-attempts``, docs/replay.md).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc

from .._errors import BrowserError
from .._model.messages import (
    FetchAttempt,
    ObservedRef,
    Render,
    RenderOutcome,
    RenderSettle,
    new_id,
    utc_now,
)
from .._model.refs import ArtifactRef
from .._store.backend import ArtifactBackend
from .behaviors import BehaviorLog, BehaviorOptions, run_behaviors
from .browser import Browser, Page
from .fetch import FetchResult, fetch
from .http import Client
from .links import extract_links
from .login import LoginLog, recorded_storage, run_login, storage_script
from .loginrecipe import LoginRecipe
from .renderproxy import BrowserRequest, RecordingProxy, SourceCapture
from .secrets import RequestOptions
from .seeds import origin_of

__all__ = ["RENDER_SEQUENCE", "RenderOptions", "Rendered", "Renderer", "SourceCapture"]

#: Browser requests are numbered from here in their run: above any crawler sequence
#: (claims count from 1), so the run's (url, sequence) pairs never collide.
RENDER_SEQUENCE = 1 << 40
DOM_NS = "dom"
SCREENSHOT_NS = "screenshot"
MHTML_NS = "mhtml"
BEHAVIORS_NS = "behaviors"
_SAMPLE = 0.1  # seconds between DOM samples while settling
_SAFE = frozenset({"GET", "HEAD"})  # methods a render may send outside the crawl's scope
# How many digest challenges one browser request answers before its 401 goes to the browser.
_CHALLENGES_ANSWERED = 3
_SERIALIZE = ("(document.doctype ? new XMLSerializer().serializeToString(document.doctype)"
              " + '\\n' : '') + document.documentElement.outerHTML")
# The settle rule's sample: the serialized DOM, and how many images the page asked for that
# are still loading (a ``src`` or ``srcset``, not lazy, not complete). An image's request
# reaches the proxy some time after its ``src`` is set (the browser's network process may
# be slow to send it): without this count, a busy machine let the rule call the page quiet
# before that request was made.
_SETTLE_SAMPLE = ("[" + _SERIALIZE + ", [...document.images].filter((i) => "
                  "(i.getAttribute('src') || i.getAttribute('srcset')) && "
                  "i.loading !== 'lazy' && !i.complete).length]")


@dataclass(frozen=True, kw_only=True)
class RenderOptions:
    """How pages are rendered. Recorded in each ``Render`` message where it matters."""

    executable: str | None = None  # the browser (default: chromium on PATH)
    timeout: float = 30.0  # one render, from navigation to screenshot
    quiet: float = 0.5  # the settle rule's quiet period, seconds
    settle_max: float = 10.0  # the settle rule's deadline after the load event
    viewport: tuple[int, int] = (1280, 800)
    max_screenshot_height: int = 16384  # pixels; a taller page is cut (recorded)
    mhtml: bool = False
    tabs: int = 2  # pages rendered at once
    # What is done to the page between its settling and its capture (_crawl.behaviors):
    # by default the built-in behaviours; BehaviorOptions(enabled=()) for none.
    behaviors: BehaviorOptions = field(default_factory=BehaviorOptions)
    # Per-seed behaviours (``_crawl.seeds``): origin (scheme://host:port) -> the behaviours
    # for rendered pages of that origin, instead of ``behaviors``.
    by_origin: tuple[tuple[str, BehaviorOptions], ...] = ()

    def behaviors_for(self, url: str) -> BehaviorOptions:
        if self.by_origin:
            origin = origin_of(url)
            for known, options in self.by_origin:
                if known == origin:
                    return options
        return self.behaviors


@dataclass
class Rendered:
    """One render's evidence: ``render`` first, then ``attempts``, in one writer group."""

    render: Render
    attempts: list[FetchAttempt]
    dom: bytes | None = None
    refs: list[ObservedRef] = field(default_factory=list)
    refs_truncated: bool = False


class Renderer:
    """Renders stored captures of one run in one shared browser. Use ``async with``."""

    def __init__(self, *, artifacts: ArtifactBackend, client: Client, run_id: str,
                 user_agent: str, max_body_bytes: int,
                 options: RenderOptions | None = None,
                 unsafe_refusal: Callable[[str], str | None] | None = None,
                 request: RequestOptions | None = None) -> None:
        self.artifacts = artifacts
        # The crawl's headers, cookies and credentials: added to the browser's requests as
        # to the crawler's own, and the browser's answers update the same jar.
        self.request = request
        self.client = client
        # Why a request other than GET or HEAD to a URL is not made (the crawl's scope),
        # or None to make it; no function: every such request is made.
        self.unsafe_refusal = unsafe_refusal
        self.run_id = run_id
        self.user_agent = user_agent
        self.max_body_bytes = max_body_bytes
        self.options = options or RenderOptions()
        self._sequence = itertools.count(RENDER_SEQUENCE)
        self._browser: Browser | None = None
        self._browser_lock = anyio.Lock()
        self._body_secrets: dict[str, list[str]] = {}  # a login's render -> its field values
        self._tabs = anyio.Semaphore(self.options.tabs)
        # The browser's HTTPS goes through the proxy too. Imported here: its certificates
        # need cryptography, about 25 ms of every crawl's start, and only renders use it.
        from .rendertls import RenderTLS

        self._tls = RenderTLS.shared()
        self._tg: anyio.abc.TaskGroup
        self.starts = 0  # browsers started or taken kept (a restart after a crash counts)

    async def __aenter__(self) -> Renderer:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        with anyio.CancelScope(shield=True):
            await self._close_browser()
        await self._tg.__aexit__(None, None, None)

    async def _close_browser(self) -> None:
        browser, self._browser = self._browser, None
        if browser is not None:
            await browser.close()

    async def browser(self) -> Browser:
        """The shared browser, started (again) if there is none or it died."""
        async with self._browser_lock:
            if self._browser is not None and self._browser.gone:
                await self._close_browser()
            if self._browser is None:
                browser = Browser(executable=self.options.executable,
                                  user_agent=self.user_agent, timeout=self.options.timeout,
                                  extra_flags=self._tls.browser_flags())
                await browser.start(self._tg)
                self._browser = browser
                self.starts += 1
            return self._browser

    async def render(self, source: SourceCapture) -> Rendered:
        """Render one stored capture; never raises for what the page or browser did (that
        is the outcome), only for a browser that cannot be started at all."""
        async with self._tabs:
            browser = await self.browser()
            return await self._render(browser, source)

    async def login(self, source: SourceCapture, recipe: LoginRecipe, why: str) -> Rendered:
        """Render a login page's capture and log in on it (``_crawl.login``): the render
        is ``rendered`` only if the logged-in check held, else ``error`` saying why. The
        recipe's field values are sealed in every request of the render that carries
        them (``_crawl.secrets``)."""
        async with self._tabs:
            browser = await self.browser()
            return await self._render(browser, source, (recipe, LoginLog(recipe, why)))

    async def _render(self, browser: Browser, source: SourceCapture,
                      login: tuple[LoginRecipe, LoginLog] | None = None) -> Rendered:
        render_id = new_id("r-")
        if login is not None:
            self._body_secrets[render_id] = list(login[0].fields.values())
        elif self._storage_for(source.url) is not None and self.request is not None:
            # values a login's storage may carry: sealed in this render's requests too
            self._body_secrets[render_id] = [v for r in self.request.logins
                                             for v in r.fields.values()]
        started_at, t0 = utc_now(), time.monotonic()
        width, height = self.options.viewport
        proxy = RecordingProxy(source=source, max_body_bytes=self.max_body_bytes,
                               forward=lambda request: self._forward(render_id, request),
                               tls=self._tls)
        captured = _Captured()
        async with anyio.create_task_group() as tg:
            await tg.start(proxy.serve)
            with anyio.move_on_after(self.options.timeout) as deadline:
                try:
                    async with browser.page(proxy=f"http://127.0.0.1:{proxy.port}") as page:
                        await self._capture(page, source, captured, proxy, login)
                except BrowserError as exc:
                    captured.fail("crashed" if exc.gone or browser.gone else "error", str(exc))
            if deadline.cancelled_caught:
                captured.fail("timeout", f"no result within {self.options.timeout:g} s "
                              f"(while {captured.step})")
                await self._check_alive(browser)
            with anyio.move_on_after(max(1.0, self.options.timeout / 2)) as drain:
                await proxy.wait_idle()  # requests made are recorded, not dropped
            if drain.cancelled_caught:
                proxy.not_recorded.append(f"{proxy.in_flight} request(s) still in flight "
                                          "when the render ended were cancelled")
            tg.cancel_scope.cancel()
        self._body_secrets.pop(render_id, None)
        stored = await anyio.to_thread.run_sync(self._store, captured, source.url)
        attempts = [r.attempt for r in proxy.results]
        render = Render(
            message_id=new_id("m-"), render_id=render_id, run_id=self.run_id,
            source_attempt_id=source.attempt_id, url=source.url, started_at=started_at,
            elapsed_ms=round((time.monotonic() - t0) * 1000, 3), outcome=captured.outcome,
            error=captured.error, browser=browser.version, viewport_width=width,
            viewport_height=height, settle=captured.settle, final_url=captured.final_url,
            title=captured.title[:65536], dom=stored.dom, screenshot=stored.screenshot,
            screenshot_truncated=captured.screenshot_truncated, mhtml=stored.mhtml,
            requests=len(attempts), not_recorded=[t[:2000] for t in proxy.not_recorded[:1000]],
            behaviors=stored.behaviors)
        return Rendered(render, attempts, captured.dom, stored.refs, stored.refs_truncated)

    async def _forward(self, render_id: str, request: BrowserRequest) -> list[FetchResult]:
        """Make a browser's request: its attempt, then, while an answer is a 401 with a
        digest challenge this crawl answers (a first nonce, or a stale one: other pages'
        requests may have used the nonce up meanwhile), the request again at once with
        the answer, as a page is retried (``_crawl.digest``), at most
        ``_CHALLENGES_ANSWERED`` times."""
        if request.method not in _SAFE and self.unsafe_refusal is not None:
            why = self.unsafe_refusal(request.url)
            if why is not None:
                return [self._refused(render_id, request, f"render: a {request.method} "
                                      f"outside the crawl's scope is not made ({why})")]
        made = [await self._make(render_id, request)]
        while (self.request is not None and len(made) <= _CHALLENGES_ANSWERED
               and made[-1].status == 401 and made[-1].headers is not None
               and self.request.challenged(request.url, made[-1].head)):
            made.append(await self._make(render_id, request))
        return made

    async def _make(self, render_id: str, request: BrowserRequest) -> FetchResult:
        headers, secrets = request.headers, list[str]()
        if self.request is not None:
            headers, secrets = self.request.merge(request.url, request.headers,
                                                  request.method)
        result = await fetch(self.client, self.artifacts, url=request.url, run_id=self.run_id,
                             sequence=next(self._sequence), user_agent=self.user_agent,
                             max_body_bytes=self.max_body_bytes, extra_headers=headers,
                             method=request.method, content=request.body,
                             render_id=render_id,
                             secrets=[*secrets, *self._body_secrets.get(render_id, ())],
                             body_secrets=self._body_secrets.get(render_id, ()))
        if self.request is not None and result.headers is not None:
            self.request.update(request.url, result.head)
        return result

    def _storage_for(self, url: str) -> tuple[str, dict[str, str]] | None:
        """The localStorage a login left for ``url``'s origin (``_crawl.login``), if any."""
        if self.request is None or not self.request.storage:
            return None
        origin = origin_of(url)
        items = self.request.storage.get(origin)
        return None if not items else (origin, dict(items))

    async def _give_storage(self, page: Page, url: str, out: _Captured) -> None:
        """Put the login's localStorage in place before the page's scripts run, and record
        what was given in the render's log (secret field values as ``[field ...]``)."""
        state = self._storage_for(url)
        if state is None or self.request is None:
            return
        origin, items = state
        await page.send("Page.addScriptToEvaluateOnNewDocument",
                        {"source": storage_script(origin, items)})
        out.behaviors = BehaviorLog(self.options.behaviors_for(url))
        out.behaviors.storage = {"origin": origin,
                                 "items": recorded_storage(items, self.request.logins)}

    def _refused(self, render_id: str, request: BrowserRequest, reason: str) -> FetchResult:
        """A request not made: an attempt that says why (the browser gets no answer)."""
        attempt = FetchAttempt(
            message_id=new_id("m-"), attempt_id=new_id("a-"), run_id=self.run_id,
            url=request.url, sequence=next(self._sequence), started_at=utc_now(),
            elapsed_ms=0.0, outcome="skipped", method=request.method, error=reason[:2000],
            render_id=render_id)
        return FetchResult(attempt, None, None, b"", 0.0)

    async def _check_alive(self, browser: Browser) -> None:
        """After a timeout: a browser that does not answer at once is hung; kill it."""
        if browser.gone:
            return
        with contextlib.suppress(BrowserError):
            await browser.send("Browser.getVersion", timeout=5.0)
            return
        browser.kill()

    async def _capture(self, page: Page, source: SourceCapture, out: _Captured,
                       proxy: RecordingProxy,
                       login: tuple[LoginRecipe, LoginLog] | None = None) -> None:
        width, height = self.options.viewport
        out.step = "opening the page"
        await page.send("Page.enable")
        await page.send("Inspector.enable")
        await page.send("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        if login is None:
            await self._give_storage(page, source.url, out)
        out.step = "loading"
        navigated = await page.send("Page.navigate", {"url": source.url})
        if navigated.get("errorText"):
            out.fail("error", f"navigation failed: {navigated['errorText']}")
            return
        if not await _wait_for(page, "Page.loadEventFired", out):
            return
        out.step = "settling"
        out.settle = await self._settle(page, out, proxy)
        if out.outcome != "rendered":
            return
        behaviors = self.options.behaviors_for(source.url)
        if login is not None:
            out.step = "logging in"
            out.behaviors = login[1]
            failed = await run_login(
                page, login[0], login[1],
                loaded=lambda: _wait_for(page, "Page.loadEventFired", out),
                settle=lambda: self._settle(page, out, proxy))
            if failed is not None:
                if out.outcome == "rendered":
                    out.fail("error", failed)
                return
            if login[1].captured is not None and self.request is not None:
                origin, items = login[1].captured  # a new login replaces the origin's state
                self.request.storage[origin] = items
        elif behaviors.active:
            out.step = "running behaviours"
            out.behaviors = out.behaviors or BehaviorLog(behaviors)
            done = await run_behaviors(
                page, out.behaviors,
                settle=lambda: self._settle(page, out, proxy, limit=behaviors.step_settle),
                requests=lambda: [(r.attempt.method, r.attempt.url, r.attempt.sequence)
                                  for r in proxy.results])
            if not done or out.outcome != "rendered":
                return
        out.step = "serializing"
        out.title = str(await page.evaluate("document.title") or "")
        out.final_url = str(await page.evaluate("location.href") or "") or None
        dom = await page.evaluate(_SERIALIZE)
        out.dom = str(dom).encode("utf-8", "surrogatepass")
        out.step = "taking the screenshot"
        metrics = await page.send("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics.get("contentSize") or {}
        full_width = max(1, min(int(size.get("width", width)), 4 * width))
        full_height = max(1, int(size.get("height", height)))
        if full_height > self.options.max_screenshot_height:
            full_height, out.screenshot_truncated = self.options.max_screenshot_height, True
        shot = await page.send("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True, "fromSurface": True,
            "clip": {"x": 0, "y": 0, "width": full_width, "height": full_height,
                     "scale": 1}})
        out.screenshot = base64.b64decode(shot["data"])
        if self.options.mhtml:
            out.step = "saving MHTML"
            snapshot = await page.send("Page.captureSnapshot", {"format": "mhtml"})
            out.mhtml = str(snapshot["data"]).encode("utf-8", "surrogatepass")

    async def _settle(self, page: Page, out: _Captured, proxy: RecordingProxy,
                      limit: float | None = None) -> RenderSettle | None:
        """The settle rule (module docstring): 'quiet', or 'deadline' (``limit`` seconds
        from now, at most ``settle_max``)."""
        quiet = self.options.quiet
        end = time.monotonic() + min(self.options.settle_max, limit or self.options.settle_max)
        last_digest, stable_since = b"", time.monotonic()
        while True:
            dom, loading = await page.evaluate(_SETTLE_SAMPLE)
            digest = hashlib.sha256(str(dom).encode("utf-8", "surrogatepass")).digest()
            now = time.monotonic()
            if digest != last_digest:
                last_digest, stable_since = digest, now
            network_quiet = (proxy.in_flight == 0 and not loading
                             and now - proxy.last_activity >= quiet)
            if network_quiet and now - stable_since >= quiet:
                return "quiet"
            if now >= end:
                return "deadline"
            if _crashed(page, out):
                return None
            await anyio.sleep(_SAMPLE)

    def _store(self, captured: _Captured, url: str) -> _Stored:
        """Put the artifacts (durable before the message names them); find the DOM's links."""
        stored = _Stored()
        if captured.dom is not None:
            stored.dom = self.artifacts.put(DOM_NS, captured.dom)
            extraction = extract_links(captured.dom, captured.final_url or url,
                                       encoding="utf-8")
            stored.refs, stored.refs_truncated = extraction.refs, extraction.truncated
        if captured.screenshot is not None:
            stored.screenshot = self.artifacts.put(SCREENSHOT_NS, captured.screenshot)
        if captured.mhtml is not None:
            stored.mhtml = self.artifacts.put(MHTML_NS, captured.mhtml)
        if captured.behaviors is not None:
            stored.behaviors = self.artifacts.put(BEHAVIORS_NS, captured.behaviors.encode())
        return stored


@dataclass
class _Captured:
    outcome: RenderOutcome = "rendered"
    error: str | None = None
    step: str = "starting"
    settle: RenderSettle | None = None
    title: str = ""
    final_url: str | None = None
    dom: bytes | None = None
    screenshot: bytes | None = None
    screenshot_truncated: bool = False
    mhtml: bytes | None = None
    behaviors: BehaviorLog | None = None  # kept whatever the outcome: what was done

    def fail(self, outcome: RenderOutcome, error: str) -> None:
        if self.outcome == "rendered":  # the first failure is the one that counts
            self.outcome, self.error = outcome, error[:2000]
            self.dom = self.screenshot = self.mhtml = None


@dataclass
class _Stored:
    dom: ArtifactRef | None = None
    screenshot: ArtifactRef | None = None
    mhtml: ArtifactRef | None = None
    behaviors: ArtifactRef | None = None
    refs: list[ObservedRef] = field(default_factory=list)
    refs_truncated: bool = False


def _crashed(page: Page, out: _Captured) -> bool:
    """Drain the page's events; a renderer crash fails the render."""
    while True:
        try:
            event = page.events.receive_nowait()
        except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
            return out.outcome != "rendered"
        if event.get("method") == "Inspector.targetCrashed":
            out.fail("crashed", "the page's renderer process crashed")
            return True


async def _wait_for(page: Page, name: str, out: _Captured) -> bool:
    """Until the event ``name``; False if the page crashed or its session ended first."""
    async for event in page.events:
        method = event.get("method")
        if method == name:
            return True
        if method == "Inspector.targetCrashed":
            out.fail("crashed", "the page's renderer process crashed")
            return False
    out.fail("crashed", "the page's DevTools session ended (the browser died)")
    return False
