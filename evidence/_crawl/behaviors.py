"""Behaviours: what a person would do to a rendered page before it is captured.

A render captures a page once it settles (docs/replay.md). Much of what a reviewer needs
is not there yet at that moment: items loaded as the reader scrolls, images that load
only near the viewport, text folded in ``<details>``, results behind a "load more"
button, media that waits to be played. Behaviours do those things before the capture,
one action at a time, each followed by the settle rule, and record every action as
evidence (the render's ``behaviors`` artifact, canonical JSON): which behaviour, what it
did to which element, when, and which of the render's requests followed. What they
revealed is captured with the page: the DOM, the screenshot, the requests, the links.

The built-in behaviours, in the order they run (``BEHAVIORS``):

- ``autoscroll``: scroll down a viewport at a time until the bottom stays put, or until
  ``max_scroll_height`` pixels (a page that grows forever stops there, recorded);
- ``lazy``: make lazy images and frames load: ``loading="lazy"`` becomes eager, and a
  ``data-src``/``data-srcset`` goes to ``src``/``srcset`` where the page left them empty;
- ``details``: open every closed ``<details>``;
- ``load-more``: click, one at a time, a visible, enabled element that matches one of
  ``click_selectors`` or is a button whose text reads "load more", "show more", "see
  more", "view more" or "more results" (a link that would leave the page is not clicked:
  it is followed as a link), at most ``max_clicks`` clicks; the click is the browser's
  own mouse input at the element's centre, not a script's ``click()``;
- ``autoplay``: start every ``<video>`` and ``<audio>``, muted.

A user script (``--behavior-script FILE``) runs after them, once, as an expression whose
value (awaited if a promise) is recorded. Everything is bounded: ``max_seconds`` for all
behaviours of a render, ``max_actions`` actions, and the render's own timeout.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import BrowserError

if TYPE_CHECKING:
    from .browser import Page

__all__ = ["BEHAVIORS", "BehaviorLog", "BehaviorOptions", "run_behaviors"]

BEHAVIORS = ("autoscroll", "lazy", "details", "load-more", "autoplay")
LOG_FORMAT = "evidence-behaviors/1"


@dataclass(frozen=True, kw_only=True)
class BehaviorOptions:
    """Which behaviours run before a render's capture, and their bounds."""

    enabled: tuple[str, ...] = BEHAVIORS
    click_selectors: tuple[str, ...] = ()  # CSS selectors of "load more" controls
    script: str | None = None  # a user script's source (a JavaScript expression)
    script_name: str | None = None  # what the log calls it (the file's name)
    max_seconds: float = 15.0  # all behaviours of one render
    max_scroll_height: int = 50_000  # pixels autoscroll goes down at most
    max_clicks: int = 20  # load-more clicks at most
    max_actions: int = 200
    step_settle: float = 5.0  # the longest an action waits to settle (then 'deadline')

    def __post_init__(self) -> None:
        unknown = [b for b in self.enabled if b not in BEHAVIORS]
        if unknown:
            raise ValueError(f"unknown behaviour(s) {', '.join(unknown)}; "
                             f"known: {', '.join(BEHAVIORS)}")

    @property
    def active(self) -> bool:
        return bool(self.enabled) or self.script is not None


# One step of a behaviour, in the page: does one action and says what it did, or returns
# null when the behaviour has nothing left to do. A click is not made here: the step
# returns where the element is, and the renderer clicks there with the browser's input.
_STEP = r"""
(function (name, opts) {
  const describe = (el) => {
    let d = el.tagName.toLowerCase();
    if (el.id) d += '#' + el.id;
    if (typeof el.className === 'string' && el.className.trim())
      d += '.' + el.className.trim().split(/\s+/).slice(0, 3).join('.');
    const text = (el.innerText || el.getAttribute('aria-label') || '').trim();
    return text ? d + ' "' + text.slice(0, 80) + '"' : d;
  };
  const root = document.scrollingElement || document.documentElement;
  if (name === 'autoscroll') {
    const height = root.scrollHeight, bottom = window.scrollY + window.innerHeight;
    if (bottom >= height - 2) return null;
    if (window.scrollY >= opts.max_scroll_height)
      return {action: 'stopped', target: 'max_scroll_height ' + opts.max_scroll_height,
              last: true};
    window.scrollBy(0, window.innerHeight);
    return {action: 'scroll', target: 'y=' + Math.round(window.scrollY) + ' of ' + height};
  }
  if (name === 'lazy') {
    let n = 0;
    for (const el of document.querySelectorAll('img, iframe')) {
      if (el.getAttribute('loading') === 'lazy') { el.setAttribute('loading', 'eager'); n++; }
      for (const [from, to] of [['data-src', 'src'], ['data-srcset', 'srcset']]) {
        const v = el.getAttribute(from);
        if (v && !el.getAttribute(to)) { el.setAttribute(to, v); n++; }
      }
    }
    return n ? {action: 'load-lazy', target: n + ' element(s)', last: true} : null;
  }
  if (name === 'details') {
    const closed = [...document.querySelectorAll('details:not([open])')];
    closed.forEach((d) => { d.open = true; });
    return closed.length ? {action: 'open', target: closed.length + ' details', last: true}
                         : null;
  }
  if (name === 'autoplay') {
    const media = [...document.querySelectorAll('video, audio')].filter((m) => m.paused);
    media.forEach((m) => { m.muted = true; const p = m.play(); if (p) p.catch(() => {}); });
    return media.length ? {action: 'play', target: media.length + ' media', last: true}
                        : null;
  }
  if (name === 'load-more') {
    const clicks = window.__evidenceClicks || (window.__evidenceClicks = new WeakMap());
    const words = /^\s*(load|show|see|view) more\b|^\s*more results\b/i;
    const leaves = (el) => {
      if (el.tagName !== 'A' || !el.getAttribute('href')) return false;
      const href = el.getAttribute('href');
      if (href === '#' || href.startsWith('javascript:')) return false;
      return new URL(el.href, location.href).href.split('#')[0] !== location.href.split('#')[0];
    };
    const candidates = [];
    for (const sel of opts.click_selectors) {
      try { candidates.push(...document.querySelectorAll(sel)); } catch (e) {}
    }
    for (const el of document.querySelectorAll('button, a, [role="button"], input[type="button"]'))
      if (words.test(el.innerText || el.value || '')) candidates.push(el);
    for (const el of candidates) {
      if (el.disabled || el.getAttribute('aria-disabled') === 'true' || leaves(el)) continue;
      if ((clicks.get(el) || 0) >= opts.max_clicks) continue;
      el.scrollIntoView({block: 'center'});
      const r = el.getBoundingClientRect();
      if (r.width < 1 || r.height < 1 || getComputedStyle(el).visibility === 'hidden') continue;
      clicks.set(el, (clicks.get(el) || 0) + 1);
      return {action: 'click', target: describe(el), x: r.left + r.width / 2,
              y: r.top + r.height / 2};
    }
    return null;
  }
  return null;
})
"""


class BehaviorLog:
    """What the behaviours of one render did, as they do it: a render cut short by its
    timeout still records the actions taken until then."""

    def __init__(self, options: BehaviorOptions) -> None:
        self.options = options
        self.actions: list[dict[str, Any]] = []
        self.stopped: dict[str, str] = {}  # behaviour -> why it ended
        # The localStorage a login left that the render was given (``_crawl.login``):
        # {"origin": ..., "items": {...}} as recorded, or None (then not in the log).
        self.storage: dict[str, object] | None = None

    def encode(self) -> bytes:
        """The log as canonical JSON (sorted keys, no spaces, UTF-8)."""
        o = self.options
        log: dict[str, object] = {
            "format": LOG_FORMAT, "enabled": list(o.enabled),
            "click_selectors": list(o.click_selectors),
            "script": o.script_name if o.script is not None else None,
            "bounds": {"max_seconds": o.max_seconds, "step_settle": o.step_settle,
                       "max_scroll_height": o.max_scroll_height,
                       "max_clicks": o.max_clicks, "max_actions": o.max_actions},
            "actions": self.actions, "stopped": self.stopped}
        if self.storage is not None:
            log["storage"] = self.storage
        return json.dumps(log, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False).encode()


async def run_behaviors(page: Page, log: BehaviorLog, *,
                        settle: Callable[[], Awaitable[str | None]],
                        requests: Callable[[], list[tuple[str, str, int]]]) -> bool:
    """Run the enabled behaviours on ``page`` (loaded and settled), then the user script,
    recording each action in ``log``; False if the page crashed meanwhile.

    ``settle()`` waits for the settle rule (its result, or None if the page crashed);
    ``requests()`` lists the render's requests so far as (method, URL, sequence), in the
    order they were made: an action's requests are those that appeared from the moment
    it began (before its step ran in the page) until it settled.
    """
    options = log.options
    started = time.monotonic()
    deadline = started + options.max_seconds
    origin = await page.evaluate("location.href")
    clicks = 0

    def made_since(before: int) -> list[dict[str, Any]]:
        return [{"method": m, "url": u, "sequence": s} for m, u, s in requests()[before:]]

    for name in options.enabled:
        reason = "done"
        while True:
            if time.monotonic() >= deadline:
                reason = f"max_seconds {options.max_seconds:g}"
                break
            if len(log.actions) >= options.max_actions:
                reason = f"max_actions {options.max_actions}"
                break
            if name == "load-more" and clicks >= options.max_clicks:
                reason = f"max_clicks {options.max_clicks}"
                break
            opts = {"max_scroll_height": options.max_scroll_height,
                    "click_selectors": list(options.click_selectors),
                    "max_clicks": options.max_clicks}
            # Counted before the step: the step itself acts (a scroll, lazy images made
            # eager), and what the page requests in answer can reach the proxy before the
            # step's answer reaches us (under load it did: the scroll's next page was in
            # no action).
            before = len(requests())
            at_ms = round((time.monotonic() - started) * 1000, 3)
            step = await page.evaluate(f"{_STEP}({json.dumps(name)}, {json.dumps(opts)})")
            if step is None:
                break
            if step.get("action") == "stopped":
                reason = str(step.get("target", "stopped"))
                break
            if step.get("action") == "click":
                await _click(page, float(step["x"]), float(step["y"]))
                clicks += 1
            settled = await settle()
            if settled is None:  # the page crashed: the render says so
                log.stopped[name] = "the page crashed"
                return False
            log.actions.append({"behavior": name, "action": step["action"],
                                "target": str(step.get("target", ""))[:300],
                                "at_ms": at_ms, "settle": settled,
                                "requests": made_since(before)})
            now = await page.evaluate("location.href")
            if now != origin:
                log.actions[-1]["navigated_to"] = str(now)
                log.stopped[name] = "the page navigated away"
                return True
            if step.get("last"):
                break
        log.stopped[name] = reason
    if options.script is not None:
        before = len(requests())
        at_ms = round((time.monotonic() - started) * 1000, 3)
        try:
            value = await page.evaluate(options.script,
                                        timeout=max(1.0, deadline - time.monotonic()))
            outcome: dict[str, Any] = {"value": _json_value(value)}
        except BrowserError as exc:
            if exc.gone:
                raise
            outcome = {"error": str(exc)[:2000]}
        settled = await settle()
        if settled is None:
            return False
        log.actions.append({"behavior": "script", "action": "run",
                            "target": options.script_name or "user script", "at_ms": at_ms,
                            "settle": settled, **outcome, "requests": made_since(before)})
    await page.evaluate("window.scrollTo(0, 0)")  # the capture starts at the top
    return True


async def _click(page: Page, x: float, y: float) -> None:
    """A left click at (x, y) in the viewport, as the browser's own mouse input."""
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
        params: dict[str, Any] = {"type": kind, "x": x, "y": y}
        if kind != "mouseMoved":
            params |= {"button": "left", "clickCount": 1}
        await page.send("Input.dispatchMouseEvent", params)


def _json_value(value: object) -> object:
    """A script's value as JSON can hold it, bounded (a page may return anything)."""
    text = json.dumps(value, default=str)
    return value if len(text) <= 65536 else text[:65536]
