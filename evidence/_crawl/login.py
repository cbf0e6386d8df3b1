"""Logins that hold (issue 36 point 2): a form login run in Chromium, recorded as evidence,
and run again when a page shows the crawl was logged out.

A login recipe is a ``[[logins]]`` table of the secrets file (``--secrets``), or a named
one completed by a seed's ``[seeds.login]`` table: its format, its checks and what shows
a page logged out are in ``_crawl.loginrecipe``, which every crawl reads; this module
runs a recipe in the browser, loaded only by a crawl that logs in or renders.

How a login runs. The crawler fetches the login page (an attempt like any other: the page
as the site served it, its CSRF token included) and renders that capture in Chromium,
through the recording proxy, as any rendered page: each field gets its value (focused,
set, ``input`` and ``change`` dispatched, as typing would), the optional script runs,
the submit element is clicked, and once the next page has loaded and settled the check
selector must be there. The render is the evidence of the login: its requests (the form's
``POST`` and whatever followed, each an attempt of the render), its DOM and screenshot
after the login, and its log (``behaviors``: each step, the check's result). The field
values are sealed wherever a request carries them (the ``POST`` body as sent, form-encoded
or not), like every secret (``_crawl.secrets``). What the site set while logging in
(``Set-Cookie``) goes to the session's jar, so the crawler's fetches and every later
render carry the logged-in session.

Local storage. Sites that keep their session in ``localStorage`` (a token a script sends
with each API call) are logged in only if the page finds it there. Once the check held,
the login reads the ``localStorage`` of the page's origin (``read_storage``): that and the
jar are the login's *storage state*, kept with the session's request options
(``RequestOptions.storage``). Every later render of that origin starts with it: an init
script (``Page.addScriptToEvaluateOnNewDocument``) puts each item in place before the
page's own scripts run, unless the page set that key already (``storage_script``); a new
login replaces the origin's state. The state is evidence: the login's log records what
it captured and each render's log what it was given (``"storage"``: the origin and its
items). A value holding one of the recipe's field values is recorded with each occurrence
replaced by ``[field SELECTOR]`` (``recorded_storage``), the value itself being in the
sealed request of the login's form (whose opening proves it); and every request of a
render given such a value seals it, as the login's own requests do.

Logged out. A page fetched on the login's origin is a sign of being logged out when it is
a redirect to the login URL, or when its content matches ``logged_out``. Then the crawler
logs in again (one login at a time; a page whose request started before the last login
ended is just retried) and retries the page at once, its settlement saying why
(``logged out (redirected to the login page): logged in again, login 2 of 3``). After
``max_logins`` the page is settled as it came, and the reason says no login was left.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .behaviors import BehaviorLog, BehaviorOptions
from .loginrecipe import LoginRecipe

if TYPE_CHECKING:
    from .browser import Page

__all__ = ["LoginLog", "read_storage", "recorded_storage", "run_login", "storage_script"]

LOG_FORMAT = "evidence-login/1"


class LoginLog(BehaviorLog):
    """What one login did: each step, and whether the check held (the render's log)."""

    def __init__(self, recipe: LoginRecipe, why: str) -> None:
        super().__init__(BehaviorOptions(enabled=()))
        self.recipe, self.why = recipe, why
        self.logged_in = False
        # What the login left in localStorage, as read (origin, items): never encoded as
        # such (``recorded_storage`` is what the log holds).
        self.captured: tuple[str, dict[str, str]] | None = None

    def encode(self) -> bytes:
        log: dict[str, object] = {"format": LOG_FORMAT, "login": self.recipe.as_record(),
                                  "why": self.why, "actions": self.actions,
                                  "logged_in": self.logged_in}
        if self.storage is not None:
            log["storage"] = self.storage
        return json.dumps(log, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False).encode()


_FILL = """(function (selector, value) {
  const el = document.querySelector(selector);
  if (!el) return false;
  el.focus();
  const proto = el instanceof HTMLTextAreaElement ? HTMLTextAreaElement.prototype
    : HTMLInputElement.prototype;
  const setter = Object.getOwnPropertyDescriptor(proto, 'value');
  if (setter && setter.set) setter.set.call(el, value); else el.value = value;
  el.dispatchEvent(new Event('input', {bubbles: true}));
  el.dispatchEvent(new Event('change', {bubbles: true}));
  return true;
})(%s, %s)"""

_CLICK = """(function (selector) {
  const el = document.querySelector(selector);
  if (!el) return false;
  el.click();
  return true;
})(%s)"""


async def run_login(page: Page, recipe: LoginRecipe, log: LoginLog, *,
                    loaded: Callable[[], Awaitable[bool]],
                    settle: Callable[[], Awaitable[Any]]) -> str | None:
    """Fill, submit, wait for the next page (``loaded``) and ``settle``, then check; None
    when logged in, else what went wrong. Each step is logged (values never)."""
    for selector, value in recipe.fields.items():
        found = await page.evaluate(_FILL % (json.dumps(selector), json.dumps(value)))
        log.actions.append({"action": "fill", "target": selector, "found": bool(found)})
        if not found:
            return f"login: no element {selector!r} to fill on {recipe.url}"
    if recipe.script is not None:
        value = await page.evaluate(recipe.script)
        log.actions.append({"action": "script", "value": None if value is None else
                            str(value)[:2000]})
    clicked = await page.evaluate(_CLICK % json.dumps(recipe.submit))
    log.actions.append({"action": "submit", "target": recipe.submit, "found": bool(clicked)})
    if not clicked:
        return f"login: no element {recipe.submit!r} to submit on {recipe.url}"
    if not await loaded():
        return "login: the page after submitting never loaded"
    await settle()
    present = await page.evaluate(
        f"document.querySelector({json.dumps(recipe.logged_in)}) !== null")
    where = str(await page.evaluate("location.href") or "")
    log.actions.append({"action": "check", "target": recipe.logged_in,
                        "found": bool(present), "url": where})
    log.logged_in = bool(present)
    if not present:
        return (f"login: {recipe.logged_in!r} is not on the page after submitting "
                f"({where[:300]}): the login did not hold")
    origin, items = await read_storage(page)
    log.captured = (origin, items)
    log.storage = {"origin": origin, "items": recorded_storage(items, [recipe])}
    return None


# The page's origin as ``LoginRecipe.origin`` writes it (scheme://host:port, the port
# always there), computed in the page.
_ORIGIN_JS = ("(location.protocol.slice(0, -1) + '://' "
              "+ location.hostname.replace(/^\\[|\\]$/g, '').toLowerCase() + ':' "
              "+ (location.port || (location.protocol === 'https:' ? '443' : '80')))")

_READ_STORAGE = """(function () {
  const items = {};
  try {
    for (let i = 0; i < localStorage.length; i++) {
      const key = localStorage.key(i);
      items[key] = localStorage.getItem(key);
    }
  } catch (e) {}
  return JSON.stringify({origin: ORIGIN, items: items});
})()""".replace("ORIGIN", _ORIGIN_JS)

_PUT_STORAGE = """(function (origin, items) {
  try {
    if (ORIGIN !== origin) return;
    for (const [key, value] of Object.entries(items)) {
      if (localStorage.getItem(key) === null) localStorage.setItem(key, value);
    }
  } catch (e) {}
})(%s, %s)""".replace("ORIGIN", _ORIGIN_JS)


async def read_storage(page: Page) -> tuple[str, dict[str, str]]:
    """The page's origin and the items of its ``localStorage`` (none if it has none or
    the page may not read it)."""
    found = json.loads(str(await page.evaluate(_READ_STORAGE)))
    items = found.get("items") or {}
    return str(found["origin"]), {str(k): str(v) for k, v in items.items()}


def storage_script(origin: str, items: dict[str, str]) -> str:
    """The init script that puts ``items`` in the ``localStorage`` of ``origin`` before a
    page of that origin runs its own scripts (keys the page set already are left)."""
    return _PUT_STORAGE % (json.dumps(origin), json.dumps(items, sort_keys=True))


def recorded_storage(items: dict[str, str], recipes: list[LoginRecipe]) -> dict[str, str]:
    """``items`` as a log records them: each occurrence of a recipe's field value replaced
    by ``[field SELECTOR]`` (longest values first), every other byte as it is."""
    values = sorted(((v, s) for r in recipes for s, v in r.fields.items() if v),
                    key=lambda pair: -len(pair[0]))
    out = {}
    for key, value in items.items():
        for secret, selector in values:
            value = value.replace(secret, f"[field {selector}]")
        out[key] = value
    return out
