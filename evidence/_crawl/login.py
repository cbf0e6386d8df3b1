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

A login with a ``name`` runs only for the seeds that name it (``login = "NAME"`` in a
``[[seeds]]`` table of a seeds file, ``_crawl.seeds``), so one secrets file can serve many
crawls; its ``url``, ``submit``, ``logged_in``, ``logged_out``, ``max_logins`` and
``script`` may then be given by the seed instead (``[seeds.login]``, with ``name``), the
field values never: they stay in the secrets file (``NamedLogin``, ``SeedLogin``,
``resolve_login``). A login without a name runs for its origin in every crawl given the file.

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
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urljoin, urlsplit

import msgspec

from .._errors import EvidenceError
from .behaviors import BehaviorLog, BehaviorOptions
from .browser import Page

__all__ = ["LoginLog", "LoginRecipe", "NamedLogin", "SeedLogin", "logged_out_reason",
           "login_tables", "read_storage", "recorded_storage", "resolve_login", "run_login",
           "storage_script"]

LOG_FORMAT = "evidence-login/1"

_T = TypeVar("_T")


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
    name: str | None = None  # a named login runs for the seeds that name it

    def __repr__(self) -> str:  # never the field values
        return f"LoginRecipe({self.as_record()!r})"

    def as_record(self) -> dict[str, object]:
        """What the session records: the selectors, never a value."""
        record: dict[str, object] = {"url": self.url, "fields": sorted(self.fields),
                                     "submit": self.submit, "logged_in": self.logged_in,
                                     "max_logins": self.max_logins}
        if self.name is not None:
            record["name"] = self.name
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


class SeedLogin(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
                omit_defaults=True):
    """A seed's ``[seeds.login]`` table: which named login, and the parts it sets (none of
    them secret: the field values stay in the secrets file)."""

    name: str
    url: str | None = None
    submit: str | None = None
    logged_in: str | None = None
    logged_out: str | None = None
    max_logins: int | None = None
    script: str | None = None


class NamedLogin(SeedLogin, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A ``[[logins]]`` table with a ``name``: the field values, and whichever other parts
    the secrets file gives (a seed naming it gives the rest)."""

    fields: dict[str, str]

    def __repr__(self) -> str:  # never the field values
        return f"NamedLogin({self.name!r})"


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_PARTS = ("url", "submit", "logged_in", "logged_out", "max_logins", "script")


def resolve_login(named: NamedLogin, seed: SeedLogin | None, where: str) -> LoginRecipe:
    """The recipe a seed's login comes to: the named login's parts, each part the seed
    gives over it, and the field values from the secrets file; checked as a ``[[logins]]``
    table is."""
    table: dict[str, object] = {"name": named.name, "fields": dict(named.fields)}
    for part in _PARTS:
        value = getattr(seed, part, None) if seed is not None else None
        value = getattr(named, part) if value is None else value
        if value is not None:
            table[part] = value
    missing = [p for p in ("url", "submit", "logged_in") if p not in table]
    if missing:
        raise EvidenceError(f"{where}: the login {named.name!r} has no {missing[0]}",
                            hint=f"give {missing[0]} in the seed's [seeds.login] table or in "
                            "the secrets file's [[logins]] table")
    return _checked_recipe(msgspec.convert(table, LoginRecipe), where)


def _checked_recipe(recipe: LoginRecipe, at: str) -> LoginRecipe:
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
    return recipe


def login_tables(tables: object, where: str
                 ) -> tuple[list[LoginRecipe], dict[str, NamedLogin]]:
    """The ``[[logins]]`` tables of the secrets file, checked: the logins that run for
    their origin, and the named ones (by name) that run for the seeds naming them."""
    if not isinstance(tables, list):
        raise EvidenceError(f"{where}: logins must be an array of tables",
                            hint="write each as [[logins]] with url, fields, submit and "
                            "logged_in")
    recipes: list[LoginRecipe] = []
    named: dict[str, NamedLogin] = {}
    for i, table in enumerate(tables):
        at = f"{where}, logins[{i}]"
        if isinstance(table, dict) and "name" in table:
            login = _named(table, at)
            if login.name in named:
                raise EvidenceError(f"{at}: a second login named {login.name!r}",
                                    hint="give each [[logins]] table its own name")
            named[login.name] = login
            continue
        recipe = _checked_recipe(_table(table, LoginRecipe, at, (
            "a [[logins]] table takes url, fields, submit, logged_in, logged_out, "
            "max_logins, script, and name")), at)
        if any(r.origin == recipe.origin for r in recipes):
            raise EvidenceError(f"{at}: a second login for {recipe.origin}",
                                hint="one login per origin")
        recipes.append(recipe)
    return recipes, named


def _table(table: object, kind: type[_T], at: str, hint: str) -> _T:
    try:
        return msgspec.convert(table, kind)
    except msgspec.ValidationError as exc:  # msgspec names the field, never its value
        raise EvidenceError(f"{at}: {exc}", hint=hint) from None


def _named(table: dict[str, object], at: str) -> NamedLogin:
    login = _table(table, NamedLogin, at, (
        "a named [[logins]] table takes name and fields, and any of url, submit, "
        "logged_in, logged_out, max_logins, script (a seed naming it may give those)"))
    if not _NAME.fullmatch(login.name):
        raise EvidenceError(f"{at}: name {login.name!r} is not a name",
                            hint="letters, digits, '_', '.' and '-', e.g. name = \"intranet\"")
    if not login.fields:
        raise EvidenceError(f"{at}: fields is empty", hint='fields = { "#user" = "..." }')
    return login


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
