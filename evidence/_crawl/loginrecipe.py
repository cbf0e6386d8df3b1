"""Login recipes (issue 36 point 2): what a login is, as the secrets file and a seeds file
give it, checked; and when a fetched page shows the crawl logged out (``logged_out_reason``).

Separate from ``_crawl.login`` (which runs a recipe in Chromium) because every crawl reads
these: a seeds file's ``[seeds.login]`` tables and a secrets file's ``[[logins]]`` are
parsed with the rest of the crawl's options, and a page worker asks whether a page shows
it logged out; a crawl that never logs in must not load the browser, the behaviours and
the renderer to do so (issue 35 point 5: start-up imports).

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
"""

from __future__ import annotations

import re
from typing import TypeVar
from urllib.parse import urljoin, urlsplit

import msgspec

from .._errors import EvidenceError

__all__ = ["LoginRecipe", "NamedLogin", "SeedLogin", "logged_out_reason", "login_tables",
           "resolve_login"]

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
