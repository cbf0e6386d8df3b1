"""robots.txt: fetched once per host, kept as evidence, cached until it expires.

A robots.txt fetch is a fetch attempt like any other (its bytes are in the artifact store);
a ``HostUpdate`` message records which attempt is in force for the host and until when, so
a restarted crawl reuses it instead of fetching it again (RFC 9309 section 2.4: a cached
copy is used for at most 24 hours). Parsing is protego's (a maintained parser).

Status rules (RFC 9309 section 2.3.1): 2xx: the rules apply; 3xx: followed up to five hops,
each hop an attempt; 4xx: no rules (everything allowed); 5xx or unreachable: the host is
treated as fully disallowed *for now*: it goes into backoff and its URLs are retried later.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from protego import Protego

__all__ = ["ROBOTS_TTL", "Robots"]

ROBOTS_TTL = dt.timedelta(hours=24)
MAX_ROBOTS_BYTES = 500 * 1024  # RFC 9309 2.5: parse at least 500 KiB


@dataclass(frozen=True)
class Robots:
    """The rules in force for one host."""

    attempt_id: str | None  # the fetch that produced them (None: allow-all by status)
    expires_at: dt.datetime
    parser: Protego | None  # None: no rules, everything allowed
    status: int | None

    @classmethod
    def parse(cls, body: bytes, *, attempt_id: str | None, expires_at: dt.datetime,
              status: int | None) -> Robots:
        text = body[:MAX_ROBOTS_BYTES].decode("utf-8", "replace")
        return cls(attempt_id, expires_at, Protego.parse(text), status)

    @classmethod
    def allow_all(cls, *, attempt_id: str | None, expires_at: dt.datetime,
                  status: int | None) -> Robots:
        return cls(attempt_id, expires_at, None, status)

    def allowed(self, url: str, user_agent: str) -> bool:
        return self.parser is None or self.parser.can_fetch(url, user_agent)

    def crawl_delay(self, user_agent: str) -> float | None:
        if self.parser is None:
            return None
        delay = self.parser.crawl_delay(user_agent)
        return None if delay is None else float(delay)

    def sitemaps(self) -> list[str]:
        return [] if self.parser is None else list(self.parser.sitemaps)

    def refusal(self, user_agent: str) -> str:
        """The reason recorded for a URL these rules disallow."""
        return f"robots: disallowed for user agent {user_agent!r} by robots.txt " + (
            f"(attempt {self.attempt_id})" if self.attempt_id else "")
