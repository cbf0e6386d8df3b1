"""The crawl's configuration, its scope rules, and reading the durable frontier.

The frontier lives in the store (``frontier`` and ``host_state``, migration 002). This
module only *reads* it, through short read-only snapshots; every transition is a
``FrontierUpdate`` or ``HostUpdate`` message that the writer applies (design rule 14: nothing
but the writer writes). Invariants:
  - a URL is claimed (queued -> in_flight, attempts + 1) durably before it is fetched;
  - a page's attempt, its links and its settlement commit in one transaction;
  - every URL that is not fetched carries its reason (scope rule, depth, robots rule,
    attempts exhausted), so "why was this page never captured?" has an answer in the store.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import apsw
import msgspec

from .._errors import EvidenceError, URLError
from .._model.urls import (
    NORMALIZER_VERSION,
    key_and_host,
    key_origin,
    normalize_url,
    registrable_domain,
    url_host,
)

__all__ = ["CrawlConfig", "FrontierCounts", "QueuedRow", "Scope", "SessionRecord",
           "check_seeds"]

ScopeKind = Literal["host", "domain", "prefix"]


class CrawlConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a session crawls. Recorded with the session; a resumed run must match it."""

    seeds: list[str]
    scope: ScopeKind = "host"
    include: list[str] = []  # regular expressions; when given, a URL must match one
    exclude: list[str] = []  # regular expressions; a URL matching one is out of scope
    max_depth: int | None = None  # links from a seed; None: unlimited
    max_attempts: int = 3  # claims of one URL before it is failed
    sitemap: bool = False  # also seed from the hosts' sitemaps (robots.txt Sitemap lines)
    obey_robots: bool = True
    user_agent: str = "evidence/0.1 (+https://example.invalid/evidence)"
    max_body_bytes: int = 10 * 1024 * 1024
    # What a page may cost in memory beyond its wire bytes (issue 30; docs/crawling.md,
    # "Caps"): the content derived from its body (decompressed), the part of the content
    # parsed for links (and read by rules), the references taken from it. Past each the
    # record says so (content_truncated, a truncated discovery, a rule's error verdict).
    max_content_bytes: int = 8 * 1024 * 1024
    max_parse_bytes: int = 2 * 1024 * 1024
    max_links: int = 10_000
    # Minimum recrawl intervals in incremental sessions: a regular expression over the
    # fetch key, or "type:<media type prefix>", to a frequency (daily, weekly, 12h, 3d...).
    recrawl: dict[str, str] = {}
    # Compliance rules judged on every page: full definitions (RuleSet.as_record()).
    rules: list[dict[str, object]] = []
    # Load each 2xx HTML page in headless Chromium and record what it shows (docs/replay.md);
    # render_only: only pages whose fetch key matches one of these regular expressions.
    render: bool = False
    render_only: list[str] = []
    # Follow page requisites (images, scripts, stylesheets, CSS url()s, media: the edge
    # kinds of _crawl/links.REQUISITE_KINDS) within the scope; without it they are
    # recorded as edges only.
    requisites: bool = False
    # Networks the crawl may connect to beyond the public Internet (CIDRs, normalized): by
    # default loopback, private, link-local... addresses are refused, a seed's own origin
    # aside (_crawl.netpolicy).
    allow_network: list[str] = []
    # A rendered page's requests other than GET and HEAD (a form's POST, a script's
    # fetch(PUT)...) may go outside the scope; by default they are refused and recorded.
    render_unsafe_anywhere: bool = False
    # Proxies (_crawl.proxy; docs/crawling.md, "Proxies"): every host's (a URL, or "none"),
    # and per host pattern ({"hosts": [patterns], "url": URL or "none"}, the first match
    # wins), each URL without its credentials (they are never recorded); a socks5h proxy
    # resolves names the network policy cannot check: only with proxy_remote_dns.
    proxy: str | None = None
    proxies: list[dict[str, object]] = []
    proxy_remote_dns: bool = False
    # Speak HTTP/1.1 only: TLS offers ALPN http/1.1 alone, as before HTTP/2 (by default
    # it offers h2 and http/1.1, and the server picks; _crawl.http).
    http1_only: bool = False
    # What requests carry beyond the defaults (issue 36, ``_crawl.secrets``): one record
    # per host table (``--header`` is the table ``*``), naming every header, cookie and
    # credential, with no secret value.
    request: list[dict[str, object]] = []
    # Per-seed rules (issue 36, ``_crawl.seeds``): one record per seed when a TOML seeds
    # file gave any (url, and the scope, max_depth, include, exclude, headers and
    # behaviors it sets); a URL is in the crawl when some seed's rules take it.
    seed_options: list[dict[str, object]] = []

    def as_record(self) -> dict[str, object]:
        return msgspec.to_builtins(self)

    def differences(self, recorded: dict[str, object]) -> list[str]:
        """The keys whose value differs from a recorded configuration.

        A key the record lacks (recorded before the key existed) counts as its default.
        """
        mine = self.as_record()
        defaults = msgspec.to_builtins(CrawlConfig(seeds=[]))
        theirs = {**defaults, **recorded}
        return sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))


# What the normalizer's complaints mean for a seed someone typed, in their words.
_PLAIN = (
    ("URL has no scheme", "it does not start with http:// or https://",
     "write the whole URL, e.g. https://example.com/"),
    ("unsupported scheme", "only http:// and https:// URLs can be crawled",
     "give an http:// or https:// URL"),
    ("URL has no host", "it names no host", "write the whole URL, e.g. https://example.com/"),
    ("URL has leading or trailing whitespace", "it has spaces around it",
     "remove the spaces (quote the URL in the shell)"),
    ("URL has whitespace in its host part", "its host name contains a space", None),
)


def check_seeds(seeds: list[str]) -> None:
    """Refuse a seed the crawler cannot fetch, naming it and saying what is wrong with it."""
    for seed in seeds:
        try:
            normalize_url(seed)
        except URLError as exc:
            what, hint = str(exc), exc.hint
            for prefix, plain, better in _PLAIN:
                if what.startswith(prefix):
                    what, hint = plain, better or hint
                    break
            if "://" not in seed and seed.strip():
                hint = f"write the whole URL, e.g. https://{seed.strip().strip('/')}/"
            raise URLError(f"seed {seed!r} cannot be crawled: {what}",
                           hint=hint or "give an http:// or https:// URL", url=seed) from exc


class Scope:
    """Decides, for one URL, whether the crawl may fetch it, and names the rule if not.

    ``host``: the seeds' origins (scheme, host and port: http://a:8080/ is not in the scope
    of http://a/, nor https://a/); ``domain``: any scheme and port on a host under a seed's
    registrable domain (the Public Suffix List: ``registrable_domain``); ``prefix``: under a
    seed's fetch key."""

    def __init__(self, config: CrawlConfig) -> None:
        self.kind = config.scope
        self.hosts = {url_host(s) for s in config.seeds}
        self.origins = {key_origin(normalize_url(s)) for s in config.seeds}
        # The Public Suffix List is read only for a domain scope (~0.1 s of CPU, once).
        self.domains = ({registrable_domain(h) for h in self.hosts}
                        if self.kind == "domain" else set())
        self.prefixes = [normalize_url(s) for s in config.seeds]
        try:
            self.include = [re.compile(p) for p in config.include]
            self.exclude = [re.compile(p) for p in config.exclude]
        except re.error as exc:
            raise EvidenceError(f"invalid include/exclude pattern: {exc}",
                                hint="patterns are Python regular expressions") from exc
        self.max_depth = config.max_depth
        # Per-seed rules: one Scope per seed, each with its own rules over the crawl's.
        self.per_seed = [Scope(_seed_config(config, seed)) for seed in config.seed_options]

    def reason_to_skip(self, url: str, depth: int) -> str | None:
        """None when in scope, else the rule that excludes it, e.g. ``scope: host``."""
        key, host = key_and_host(url)
        return self.reason_to_skip_key(key, host, depth)

    def reason_out_of(self, url: str) -> str | None:
        """Why ``url`` is outside the scope whatever its depth (None: inside)."""
        try:
            return self.reason_to_skip(url, 0)
        except URLError as exc:
            return f"invalid URL: {exc}"

    def reason_to_skip_key(self, key: str, host: str, depth: int) -> str | None:
        """``reason_to_skip`` of a URL whose fetch key and host are known already."""
        if self.per_seed:  # some seed's rules take it; else the reason of its host's seed
            reasons = [scope.reason_to_skip_key(key, host, depth) for scope in self.per_seed]
            if None in reasons:
                return None
            origin = key_origin(key)
            own = [r for scope, r in zip(self.per_seed, reasons, strict=True)
                   if origin in scope.origins]
            near = [r for scope, r in zip(self.per_seed, reasons, strict=True)
                    if host in scope.hosts]
            return (own or near or reasons)[0]
        if self.kind == "host":
            if host not in self.hosts:
                return f"scope: host {host} is not a seed host"
            origin = key_origin(key)
            if origin not in self.origins:
                return f"scope: host: origin {origin} is not a seed's origin"
        if self.kind == "domain" and registrable_domain(host) not in self.domains:
            return f"scope: domain of {host} is not a seed domain"
        if self.kind == "prefix" and not any(key.startswith(p) for p in self.prefixes):
            return "scope: not under a seed prefix"
        for pattern in self.exclude:
            if pattern.search(key):
                return f"scope: exclude pattern {pattern.pattern!r}"
        if self.include and not any(p.search(key) for p in self.include):
            return "scope: matches no include pattern"
        if self.max_depth is not None and depth > self.max_depth:
            return f"depth: {depth} is beyond max depth {self.max_depth}"
        return None


def _seed_config(config: CrawlConfig, seed: dict[str, object]) -> CrawlConfig:
    """One seed's rules over the crawl's: its own scope, patterns and depth where set."""
    def own(key: str, default: object) -> object:
        value = seed.get(key)
        return default if value is None else value

    return msgspec.convert({"seeds": [seed["url"]], "scope": own("scope", config.scope),
                            "include": own("include", config.include),
                            "exclude": own("exclude", config.exclude),
                            "max_depth": own("max_depth", config.max_depth)}, CrawlConfig)


@dataclass(frozen=True)
class SessionRecord:
    session_id: str
    mode: str
    config: dict[str, object]
    outcome: str | None
    open_runs: list[str]  # runs of this session with no recorded end
    baseline_session_id: str | None = None


@dataclass(frozen=True)
class QueuedRow:
    frontier_id: int
    url: str
    depth: int
    attempts: int
    not_before: str | None
    via: str
    key: str  # the URL's fetch key, as the store holds it: never computed again


class FrontierCounts(msgspec.Struct, frozen=True, kw_only=True):
    queued: int = 0
    in_flight: int = 0
    done: int = 0
    failed: int = 0
    skipped: int = 0
    oldest_in_flight_at: str | None = None


def last_session(conn: apsw.Connection) -> SessionRecord | None:
    rows = conn.execute(
        "SELECT session_id, mode, config, outcome, baseline_session_id FROM crawl_session "
        "ORDER BY started_at DESC, session_id DESC LIMIT 1").fetchall()
    if not rows:
        return None
    session_id, mode, config, outcome, baseline = rows[0]
    open_runs = [r for (r,) in conn.execute(
        "SELECT run_id FROM crawl_run WHERE session_id = ? AND ended_at IS NULL "
        "ORDER BY started_at", (session_id,))]
    return SessionRecord(session_id, mode, msgspec.json.decode(config), outcome, open_runs,
                         baseline)


def last_completed_session(conn: apsw.Connection) -> str | None:
    """The newest completed session: the baseline of an incremental session."""
    rows = conn.execute(
        "SELECT session_id FROM crawl_session WHERE outcome = 'completed' "
        "ORDER BY ended_at DESC, session_id DESC LIMIT 1").fetchall()
    return rows[0][0] if rows else None


def queued_after(conn: apsw.Connection, session_id: str, after_id: int,
                 limit: int) -> list[QueuedRow]:
    """The next queued URLs in discovery order (the index makes this a range scan)."""
    return [QueuedRow(*row) for row in conn.execute(
        "SELECT f.frontier_id, f.url, f.depth, f.attempts, f.not_before, f.via, u.fetch_key "
        "FROM frontier f JOIN url_identity u ON u.url_id = f.url_id "
        "WHERE f.session_id = ? AND f.state = 'queued' AND f.frontier_id > ? "
        "ORDER BY f.frontier_id LIMIT ?", (session_id, after_id, limit))]


def in_flight(conn: apsw.Connection, session_id: str) -> list[tuple[str, int]]:
    """(url, attempts) of URLs claimed but never settled: the crawler stopped mid-fetch."""
    return list(conn.execute(
        "SELECT url, attempts FROM frontier WHERE session_id = ? AND state = 'in_flight' "
        "ORDER BY frontier_id", (session_id,)))


def seeds(conn: apsw.Connection, session_id: str) -> list[tuple[str, str, str]]:
    """(url, state, reason) of the session's seeds, in the order they were queued."""
    return list(conn.execute(
        "SELECT url, state, reason FROM frontier WHERE session_id = ? AND via = 'seed' "
        "ORDER BY frontier_id", (session_id,)))


def counts(conn: apsw.Connection, session_id: str) -> FrontierCounts:
    by_state = dict(conn.execute(
        "SELECT state, count(*) FROM frontier WHERE session_id = ? GROUP BY state",
        (session_id,)))
    oldest = conn.execute(
        "SELECT min(claimed_at) FROM frontier WHERE session_id = ? AND state = 'in_flight'",
        (session_id,)).fetchall()[0][0]
    return FrontierCounts(oldest_in_flight_at=oldest, **by_state)


def host_states(conn: apsw.Connection) -> dict[str, tuple[str | None, str | None,
                                                          float | None, str | None]]:
    """host -> (robots_attempt_id, robots_expires_at, crawl_delay, backoff_until)."""
    return {h: (a, e, d, b) for h, a, e, d, b in conn.execute(
        "SELECT host, robots_attempt_id, robots_expires_at, crawl_delay, backoff_until "
        "FROM host_state")}


def attempt_body(conn: apsw.Connection, attempt_id: str) -> tuple[str, str, int] | None:
    """(namespace, digest, size) of an attempt's content: its content artifact, or its
    body when they are the same bytes."""
    rows = conn.execute(
        "SELECT a.namespace, a.digest, a.size FROM fetch_attempt f "
        "JOIN artifact a ON a.artifact_id = coalesce(f.content_id, f.body_id) "
        "WHERE f.attempt_id = ?", (attempt_id,)).fetchall()
    return rows[0] if rows else None


def claim_state(conn: apsw.Connection, session_id: str, url: str,
                key: str | None = None) -> tuple[str, int, str | None]:
    """(state, attempts, not_before) of ``url`` (fetch key ``key``, if known) in the
    session's frontier."""
    rows = conn.execute(
        "SELECT f.state, f.attempts, f.not_before FROM frontier f "
        "JOIN url_identity u ON u.url_id = f.url_id "
        "WHERE f.session_id = ? AND u.normalizer_version = ? AND u.fetch_key = ?",
        (session_id, NORMALIZER_VERSION, key or normalize_url(url))).fetchall()
    if not rows:
        raise EvidenceError(f"{url} is not in the frontier of session {session_id}")
    return rows[0]
