"""What the demo site is: its configuration, its page graph and documents at each content
version, and the ground truth a crawler is compared with. Pure values; ``_demo.site``
serves them (its docstring describes the site from a crawler's side).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from html import escape as html_escape
from types import MappingProxyType
from urllib.parse import urlsplit
from urllib.robotparser import RobotFileParser

__all__ = ["DEFAULT_ROBOTS_TXT", "HTML_TYPE", "ROBOTS_PATH", "SITEMAP_PATH", "Layout", "SiteConfig",
           "page_index", "render_page", "sort_key"]

DEFAULT_ROBOTS_TXT = "User-agent: *\nDisallow: /private/\n"
"""The default robots.txt: everything is allowed except ``/private/``."""

ROBOTS_PATH = "/robots.txt"
SITEMAP_PATH = "/sitemap.xml"

HTML_TYPE = "text/html; charset=utf-8"
_WORDS = (
    "archive", "bridge", "candle", "delta", "ember", "falcon", "garden", "harbor",
    "island", "juniper", "kettle", "lantern", "meadow", "nectar", "orchard", "pepper",
    "quarry", "river", "saddle", "timber", "umber", "valley", "willow", "yarrow",
    "zephyr", "anchor", "beacon", "cobalt", "dune", "estuary", "fjord", "glacier",
)  # fmt: skip


def _default_redirects() -> dict[str, str]:
    return {"/old": "/moved", "/moved": "/p/1"}


@dataclass(frozen=True, kw_only=True)
class SiteConfig:
    """What the site serves. Mappings are copied into read-only views on creation."""

    pages: int = 50
    links_per_page: int = 4
    robots_txt: str | None = DEFAULT_ROBOTS_TXT
    crawl_delay: float | None = None
    sitemap_in_robots: bool = True
    redirects: Mapping[str, str] = field(default_factory=_default_redirects)
    private_links: tuple[str, ...] = ("/private/a", "/private/b")
    not_found: tuple[str, ...] = ("/missing/a", "/missing/b")
    flaky: Mapping[str, int] = field(default_factory=dict)
    rate_limited: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    slow: Mapping[str, float] = field(default_factory=dict)
    large: Mapping[str, int] = field(default_factory=dict)
    drip: Mapping[str, float] = field(default_factory=dict)  # seconds between body bytes
    kill_paths: frozenset[str] = frozenset()
    unvalidated: frozenset[str] = frozenset()  # served without ETag and Last-Modified
    hold_seconds: float = 30.0
    version: int = 1

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        if self.pages < 1:
            raise ValueError("pages must be at least 1")
        if self.links_per_page < 0:
            raise ValueError("links_per_page must not be negative")
        if self.version < 1:
            raise ValueError("version must be at least 1")
        if self.crawl_delay is not None and self.crawl_delay < 0:
            raise ValueError("crawl_delay must not be negative")
        if self.hold_seconds < 0:
            raise ValueError("hold_seconds must not be negative")
        put("redirects", MappingProxyType({_path(k): str(v) for k, v in self.redirects.items()}))
        put("flaky", MappingProxyType({_path(k): _count(v) for k, v in self.flaky.items()}))
        put("rate_limited", MappingProxyType(
            {_path(k): (_count(n), _seconds(s)) for k, (n, s) in self.rate_limited.items()}))
        put("slow", MappingProxyType({_path(k): _seconds(v) for k, v in self.slow.items()}))
        put("large", MappingProxyType({_path(k): _count(v) for k, v in self.large.items()}))
        put("drip", MappingProxyType({_path(k): _seconds(v) for k, v in self.drip.items()}))
        put("kill_paths", frozenset(_path(p) for p in self.kill_paths))
        put("unvalidated", frozenset(_path(p) for p in self.unvalidated))
        put("private_links", tuple(_path(p) for p in self.private_links))
        put("not_found", tuple(_path(p) for p in self.not_found))
        for target in self.redirects.values():
            if not target:
                raise ValueError("a redirect target must not be empty")
        for p in (ROBOTS_PATH, SITEMAP_PATH):
            if p in self.large:
                raise ValueError(f"large applies to HTML documents, not {p}")
        served = {"/", ROBOTS_PATH, SITEMAP_PATH, *self.redirects, *self.private_links,
                  *self.special_paths()}
        for p in self.not_found:
            if p in served or page_index(p) is not None:
                raise ValueError(f"not_found path {p!r} is also served")

    def special_paths(self) -> tuple[str, ...]:
        """Configured fault paths that are not pages: served as small pages linked from /."""
        seen: dict[str, None] = {}
        for group in (self.flaky, self.rate_limited, self.slow, self.large, self.drip,
                      sorted(self.kill_paths)):
            for p in group:
                if (p != "/" and p not in (ROBOTS_PATH, SITEMAP_PATH)
                        and p not in self.redirects and page_index(p) is None):
                    seen[p] = None
        return tuple(seen)


def _path(p: object) -> str:
    if not isinstance(p, str) or not p.startswith("/") or any(
            c in p for c in "?# \t\r\n"):
        raise ValueError(f"not a plain absolute path: {p!r}")
    return p


def _count(n: object) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"not a count: {n!r}")
    return n


def _seconds(s: object) -> float:
    if not isinstance(s, int | float) or isinstance(s, bool) or not 0 <= s < float("inf"):
        raise ValueError(f"not a delay in seconds: {s!r}")
    return float(s)


def page_index(path: str) -> int | None:
    """The *i* of a canonical ``/p/i`` path, whatever the page count."""
    if path.startswith("/p/"):
        tail = path[3:]
        if tail.isascii() and tail.isdigit() and str(int(tail)) == tail:
            return int(tail)
    return None


def sort_key(path: str) -> tuple[int, int, str]:
    if path == "/":
        return (0, 0, "")
    i = page_index(path)
    return (1, i, "") if i is not None else (2, 0, path)


def _page_targets(i: int, n: int, k: int) -> list[int]:
    """The pages page *i* links to: up to *k* distinct others, deterministically."""
    want = min(k, n - 1)
    out: list[int] = []
    if want <= 0:
        return out
    candidates = itertools.chain(
        ((2 * i + 1) % n, (2 * i + 2) % n, (7 * i + 3) % n, (i + 1) % n),
        ((i + d) % n for d in range(1, n + 1)),
    )
    for t in candidates:
        if t != i and t not in out:
            out.append(t)
            if len(out) == want:
                break
    return out


def _orphan(config: SiteConfig) -> int | None:
    """The page whose inbound links version 2 removes."""
    keep = {*config.redirects, *config.redirects.values(), *config.flaky,
            *config.rate_limited, *config.slow, *config.large, *config.drip,
            *config.kill_paths}
    for i in range(config.pages - 1, 0, -1):
        if f"/p/{i}" not in keep:
            return i
    return None


def _robots_parser(robots_txt: str | None) -> RobotFileParser | None:
    if robots_txt is None:
        return None
    parser = RobotFileParser()
    parser.parse(robots_txt.splitlines())
    return parser


class Layout:
    """The site's structure at one content version: what is served and what links where."""

    def __init__(self, config: SiteConfig, version: int) -> None:
        self.config = config
        self.version = version
        n, k = config.pages, config.links_per_page
        orphan = _orphan(config)
        self.orphan = f"/p/{orphan}" if orphan is not None and version >= 2 else None
        self.new_page = f"/p/{n}" if version >= 2 else None
        specials = config.special_paths()

        links: dict[str, list[str]] = {}
        home = [f"/p/{i}" for i in range(min(k, n))]
        targets = set(config.redirects.values())
        home += [s for s in config.redirects if s not in targets] or list(config.redirects)
        home += specials
        if self.new_page:
            home.append(self.new_page)
        links["/"] = home
        for i in range(n):
            links[f"/p/{i}"] = [f"/p/{t}" for t in _page_targets(i, n, k)] + ["/"]
        if self.new_page:
            links[self.new_page] = [f"/p/{t}" for t in _page_targets(n, n, k)] + ["/"]
            links["/p/0"].append(self.new_page)
        hosts = [i for i in range(n) if i != orphan] or [0]
        for j, extra in enumerate((*config.private_links, *config.not_found)):
            links[f"/p/{hosts[(5 + 11 * j) % len(hosts)]}"].append(extra)
        for p in (*specials, *config.private_links):
            links.setdefault(p, ["/"])
        self.links: dict[str, tuple[str, ...]] = {
            p: tuple(dict.fromkeys(x for x in out if x != self.orphan))
            for p, out in links.items()
        }

    def revision(self, i: int) -> int:
        """The content version in which page *i*'s text last changed."""
        for k in range(self.version, 1, -1):
            if i % 4 == (k - 1) % 4:
                return k
        return 1

    @cached_property
    def walk(self) -> tuple[frozenset[str], frozenset[str]]:
        """(reachable, disallowed) for a robots-obeying crawler starting at ``/``."""
        robots = _robots_parser(self.config.robots_txt)
        redirects = self.config.redirects
        reachable: set[str] = set()
        disallowed: set[str] = set()
        seen: set[str] = set()
        queue = deque(["/"])
        while queue:
            p = queue.popleft()
            if p in seen:
                continue
            seen.add(p)
            if robots is not None and not robots.can_fetch("*", p):
                disallowed.add(p)
            elif p in redirects:
                if redirects[p].startswith("/"):
                    queue.append(urlsplit(redirects[p]).path)
            elif p in self.links:
                reachable.add(p)
                queue.extend(self.links[p])
        return frozenset(reachable), frozenset(disallowed)

    def documents(self) -> dict[str, tuple[bytes, str]]:
        """Every HTML document of this version: path -> (body, content type)."""
        docs: dict[str, tuple[bytes, str]] = {}
        for p, out in self.links.items():
            i = page_index(p)
            if p == "/":
                title = "Evidence test site"
                text = [f"Site version {self.version}.",
                        f"{self.config.pages} pages; start here."]
            elif i is not None:
                rev = self.revision(i)
                title = f"Page {i}"
                text = [f"Content revision {rev}.",
                        " ".join(_WORDS[(i * 7 + rev * 13 + j * 5) % len(_WORDS)]
                                 for j in range(12)).capitalize() + "."]
            else:
                title = f"Page {p}"
                text = [f"A special page at {p}."]
            docs[p] = (render_page(title, text, out, self.config.large.get(p)), HTML_TYPE)
        return docs


def render_page(title: str, text: Sequence[str], links: Iterable[str], size: int | None) -> bytes:
    def label(p: str) -> str:
        i = page_index(p)
        return "Home" if p == "/" else f"Page {i}" if i is not None else p

    head = (f'<!doctype html>\n<html lang="en">\n<head><meta charset="utf-8">'
            f"<title>{html_escape(title)}</title></head>\n<body>\n<h1>{html_escape(title)}</h1>\n"
            + "".join(f"<p>{html_escape(t)}</p>\n" for t in text)
            + "<ul>\n"
            + "".join(f'<li><a href="{html_escape(p)}">{html_escape(label(p))}</a></li>\n'
                      for p in links)
            + "</ul>\n").encode()
    tail = b"</body>\n</html>\n"
    if size is None:
        return head + tail
    frame = b'<p class="padding"></p>\n'
    fill = size - len(head) - len(tail) - len(frame)
    if fill < 0:
        raise ValueError(f"large size {size} is below this page's {size - fill} bytes")
    pad = (b"lorem ipsum " * (fill // 12 + 1))[:fill]
    return head + frame[:-5] + pad + frame[-5:] + tail
