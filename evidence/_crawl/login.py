"""Logins that hold (issue 36 point 2): a form login run in Chromium, recorded as evidence,
and run again when a page shows the crawl was logged out.

A login recipe is a ``[[logins]]`` table of the secrets file (``--secrets``): its field
values are secrets, so the recipe lives with them.

    [[logins]]
    url = "https://intranet.example/login"     # the login form's page
    fields = { "#user" = "alice", "#password" = "s3cret" }   # CSS selector = value
    submit = "#sign-in"                         # the element clicked to submit
    logged_in = "#logout"                       # present once logged in: the check
    logged_out = "Please sign in"               # optional: a page whose content matches
    max_logins = 3                              # logins in a run, the first included
    script = "..."                              # optional JavaScript run before submitting

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
render carry the logged-in session. (Local storage is not carried over: each render is a
new browser context; sites that keep their session only there are not covered.)

Logged out. A page fetched on the login's origin is a sign of being logged out when it is
a redirect to the login URL, or when its content matches ``logged_out``. Then the crawler
logs in again (one login at a time; a page whose request started before the last login
ended is just retried) and retries the page at once, its settlement saying why
(``logged out (redirected to the login page): logged in again, login 2 of 3``). After
``max_logins`` the page is settled as it came, and the reason says no login was left.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urljoin, urlsplit

import msgspec

from .._errors import EvidenceError
from .behaviors import BehaviorLog, BehaviorOptions
from .browser import Page

__all__ = ["LoginLog", "LoginRecipe", "logged_out_reason", "login_tables", "run_login"]

LOG_FORMAT = "evidence-login/1"


class LoginRecipe(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
                  omit_defaults=True):
    """One ``[[logins]]`` table (the module's doc)."""

    url: str
    fields: dict[str, str]
    submit: str
    logged_in: str
    logged_out: str | None = None
    max_logins: int = 3
    script: str | None = None

    def __repr__(self) -> str:  # never the field values
        return f"LoginRecipe({self.as_record()!r})"

    def as_record(self) -> dict[str, object]:
        """What the session records: the selectors, never a value."""
        record: dict[str, object] = {"url": self.url, "fields": sorted(self.fields),
                                     "submit": self.submit, "logged_in": self.logged_in,
                                     "max_logins": self.max_logins}
        if self.logged_out is not None:
            record["logged_out"] = self.logged_out
        if self.script is not None:
            record["script"] = True
        return record

    @property
    def origin(self) -> str:
        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"

    def applies_to(self, url: str) -> bool:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}" == self.origin


def login_tables(tables: object, where: str) -> list[LoginRecipe]:
    """The ``[[logins]]`` tables of the secrets file, checked."""
    if not isinstance(tables, list):
        raise EvidenceError(f"{where}: logins must be an array of tables",
                            hint="write each as [[logins]] with url, fields, submit and "
                            "logged_in")
    recipes: list[LoginRecipe] = []
    for i, table in enumerate(tables):
        at = f"{where}, logins[{i}]"
        try:
            recipe = msgspec.convert(table, LoginRecipe)
        except msgspec.ValidationError as exc:
            # msgspec names the field, never its value
            raise EvidenceError(f"{at}: {exc}", hint="a [[logins]] table takes url, fields, "
                                "submit, logged_in, logged_out, max_logins, script") from None
        if urlsplit(recipe.url).scheme not in ("http", "https"):
            raise EvidenceError(f"{at}: url must be an http:// or https:// URL",
                                hint="the page with the login form")
        if not recipe.fields:
            raise EvidenceError(f"{at}: fields is empty", hint='fields = { "#user" = "..." }')
        if recipe.max_logins < 1:
            raise EvidenceError(f"{at}: max_logins must be 1 or more",
                                hint="the first login counts")
        if recipe.logged_out is not None:
            try:
                re.compile(recipe.logged_out)
            except re.error as exc:
                raise EvidenceError(f"{at}: logged_out is not a regular expression: {exc}",
                                    hint="a Python regular expression") from None
        if any(r.origin == recipe.origin for r in recipes):
            raise EvidenceError(f"{at}: a second login for {recipe.origin}",
                                hint="one login per origin")
        recipes.append(recipe)
    return recipes


def logged_out_reason(recipe: LoginRecipe, url: str, status: int | None,
                      location: str | None, content: bytes) -> str | None:
    """Why a page fetched on the recipe's origin says the crawl is logged out, or None."""
    if not recipe.applies_to(url) or url.split("#")[0] == recipe.url:
        return None
    if status is not None and 300 <= status < 400 and location:
        target = urljoin(url, location).split("#")[0].split("?")[0]
        if target == recipe.url.split("?")[0]:
            return "redirected to the login page"
    if recipe.logged_out is not None and content and re.search(
            recipe.logged_out, content.decode("utf-8", "replace")):
        return f"its content matches logged_out {recipe.logged_out!r}"
    return None


class LoginLog(BehaviorLog):
    """What one login did: each step, and whether the check held (the render's log)."""

    def __init__(self, recipe: LoginRecipe, why: str) -> None:
        super().__init__(BehaviorOptions(enabled=()))
        self.recipe, self.why = recipe, why
        self.logged_in = False

    def encode(self) -> bytes:
        log = {"format": LOG_FORMAT, "login": self.recipe.as_record(), "why": self.why,
               "actions": self.actions, "logged_in": self.logged_in}
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
    return None
