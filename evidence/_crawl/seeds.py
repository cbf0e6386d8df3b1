"""Per-seed configuration: one crawl of many sites, each with its own rules (issue 36).

A seeds file is one URL a line, or, named ``*.toml``, ``[[seeds]]`` tables:

    [[seeds]]
    url = "https://news.example/"
    scope = "prefix"             # host, domain or prefix (default: the crawl's --scope)
    max_depth = 2                # default: the crawl's --max-depth
    include = ["/2026/"]         # default: the crawl's --include (each replaces, not adds)
    exclude = ["\\?print="]
    headers = { "Accept-Language" = "fr" }   # added to requests to this seed's origin
    behaviors = ["autoscroll", "lazy"]       # a rendered page of this origin: these only
    login = "news"                           # the [[logins]] table named "news" in --secrets

    [[seeds]]
    url = "https://shop.example/account"
    [seeds.login]                            # a named login, with parts given here
    name = "shop"                            # its field values stay in the secrets file
    url = "https://shop.example/signin"      # and url, submit, logged_in, logged_out,
    logged_in = ".account-menu"              # max_logins, script over the named table's

What a URL is held to. The frontier does not know from which seed a URL came (a page is
linked from many), so a URL is in the crawl when *some* seed's rules take it: inside that
seed's scope, matching its patterns, and no deeper than its ``max_depth`` (a URL's depth
is its distance from the nearest seed, as always). A URL no seed takes is skipped with the
reason of the seed of its own origin, else of its host, else of the first seed. A seed's
headers go to its origin (scheme, host and port); its behaviours to rendered pages of that
origin (the first seed of an origin that names them). Secret headers, cookies and
credentials stay in the secrets file (``_crawl.secrets``): a seeds file is recorded.
A seed's ``login`` names a ``[[logins]]`` table of the secrets file by its ``name``
(``_crawl.login``): that login runs for the crawl, with the parts the seed gives over the
table's; a name the secrets file lacks, or no ``--secrets`` at all, is an error naming the
seeds file's line.

The tables are recorded in the session's configuration (``CrawlConfig.seed_options``), so a
resumed run holds every URL to the same rules without being given the file again.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Collection, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import msgspec

from .._errors import EvidenceError
from .loginrecipe import SeedLogin
from .secrets import SECRET_HEADERS, parse_header

__all__ = ["SeedOptions", "load_seeds_file", "origin_of", "read_seed_tables"]


class SeedOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
                  omit_defaults=True):
    """One ``[[seeds]]`` table; None: the crawl's own option."""

    url: str
    scope: str | None = None
    max_depth: int | None = None
    include: list[str] | None = None
    exclude: list[str] | None = None
    headers: dict[str, str] = {}
    behaviors: list[str] | None = None
    login: str | SeedLogin | None = None  # a named login of the secrets file


def origin_of(url: str) -> str:
    """scheme://host:port of a URL, the port always written."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}:{port}"


def read_seed_tables(path: str, text: str, *, behaviors: Sequence[str],
                     logins: Collection[str] | None = None) -> list[SeedOptions]:
    """The ``[[seeds]]`` tables of a TOML seeds file, each checked (``behaviors``: the
    names a table may pick; ``logins``: the names of the secrets file's logins, None
    without one). Errors name the file and the table, a login's its line."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise EvidenceError(f"the seeds file {path} is not valid TOML: {exc}",
                            hint="[[seeds]] tables, each with url = \"...\" "
                            "(docs/crawling.md, Per-seed configuration)") from None
    unknown = sorted(set(data) - {"seeds"})
    if unknown:
        raise EvidenceError(f"{path}: unknown key {unknown[0]!r}",
                            hint="a TOML seeds file holds [[seeds]] tables only")
    tables = data.get("seeds")
    if not isinstance(tables, list) or not tables:
        raise EvidenceError(f"the seeds file {path} holds no [[seeds]] table",
                            hint="write each seed as [[seeds]] with a url = \"...\" line")
    seeds = []
    for i, table in enumerate(tables):
        if isinstance(table, dict) and "login" in table:
            line = _login_line(text, i)
            at = f"{path}, line {line}" if line else f"{path}, seeds[{i}]"
            _check_login(table["login"], at, logins)
        seeds.append(_checked(table, f"{path}, seeds[{i}]", behaviors))
    return seeds


def _login_line(text: str, index: int) -> int | None:
    """The line of the ``index``-th ``[[seeds]]`` table's ``login`` key (or its
    ``[seeds.login]`` table), if it can be found."""
    heads = [m.start() for m in re.finditer(r"(?m)^[ \t]*\[\[[ \t]*seeds[ \t]*\]\]", text)]
    if index >= len(heads):
        return None
    end = heads[index + 1] if index + 1 < len(heads) else len(text)
    found = re.compile(r"(?m)^[ \t]*(login[ \t]*=|\[[ \t]*seeds\.login[ \t]*\])").search(
        text, heads[index], end)
    return None if found is None else text.count("\n", 0, found.start()) + 1


def _check_login(value: object, at: str, logins: Collection[str] | None) -> None:
    """A seed's ``login``: a name, or a ``[seeds.login]`` table without field values,
    naming a login of the secrets file."""
    if isinstance(value, dict) and "fields" in value:
        raise EvidenceError(f"{at}: login.fields: a login's field values are secrets, and a "
                            "seeds file is recorded", hint="keep fields in the [[logins]] "
                            "table of the secrets file (--secrets FILE) and name it here")
    try:
        login = msgspec.convert(value, str | SeedLogin)
    except msgspec.ValidationError as exc:
        raise EvidenceError(f"{at}: login: {exc}", hint='login = "NAME", a [[logins]] table '
                            "of the secrets file; or a [seeds.login] table with name and any "
                            "of url, submit, logged_in, logged_out, max_logins, script") from None
    name = login if isinstance(login, str) else login.name
    if logins is None:
        raise EvidenceError(f"{at}: login = {name!r} names a login of the secrets file, and "
                            "none was given", hint="add --secrets FILE, the file whose "
                            f"[[logins]] table has name = \"{name}\"")
    if name not in logins:
        raise EvidenceError(f"{at}: login = {name!r}: the secrets file has no login by that "
                            "name" + (f" (it has {', '.join(map(repr, sorted(logins)))})"
                                      if logins else ""),
                            hint=f"add name = \"{name}\" to a [[logins]] table of the "
                            "secrets file")


def _checked(table: object, where: str, behaviors: Sequence[str]) -> SeedOptions:
    try:
        seed = msgspec.convert(table, SeedOptions)
    except msgspec.ValidationError as exc:
        raise EvidenceError(f"{where}: {exc}", hint="a [[seeds]] table takes url, scope, "
                            "max_depth, include, exclude, headers, behaviors, login") from None
    if seed.scope is not None and seed.scope not in ("host", "domain", "prefix"):
        raise EvidenceError(f"{where}: scope {seed.scope!r} is not host, domain or prefix",
                            hint="see --scope in 'evidence crawl --help'")
    if seed.max_depth is not None and seed.max_depth < 0:
        raise EvidenceError(f"{where}: max_depth must be 0 or more", hint="0: the seed only")
    for name, value in seed.headers.items():
        parse_header(f"{name}: {value}", where=where)
        if name.lower() in SECRET_HEADERS:
            raise EvidenceError(f"{where}: {name} carries a credential and cannot be given "
                                "here", hint="put it in the secrets file (--secrets FILE)")
    unknown = [b for b in seed.behaviors or () if b not in behaviors]
    if unknown:
        raise EvidenceError(f"{where}: unknown behaviour {unknown[0]!r}",
                            hint=f"pick among {', '.join(behaviors)}, or [] for none")
    return seed


def load_seeds_file(path: str, *, behaviors: Sequence[str],
                    logins: Collection[str] | None = None
                    ) -> tuple[list[str], list[SeedOptions] | None]:
    """A seeds file's URLs, and its tables if it is TOML (``*.toml``; ``logins``: the
    secrets file's login names, None without one)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EvidenceError(f"cannot read the seeds file {path}: {exc}",
                            hint="one URL a line, or [[seeds]] tables in a .toml file, "
                            "in UTF-8") from exc
    if not path.endswith(".toml"):
        seeds = [line.strip() for line in text.splitlines() if line.strip() and not
                 line.lstrip().startswith("#")]
        if not seeds:
            raise EvidenceError(f"the seeds file {path} holds no URL",
                                hint="one URL a line; lines starting with # are comments")
        return seeds, None
    tables = read_seed_tables(path, text, behaviors=behaviors, logins=logins)
    return [t.url for t in tables], tables
