"""What each host allows this run: its robots.txt (cached, stored, or fetched), and how
long a host waits whose robots.txt could not be had.

One fetch of robots.txt per host at a time (a lock per host), and none while the rules in
memory or those an earlier run recorded (``HostUpdate``, RFC 9309 2.4: at most a day old)
are in force. A fetch follows redirects (each hop an attempt) and commits what it got;
a 5xx or no answer leaves the host without rules: its pages are retried after
``robots_backoff``. The engine (``_crawl.crawler``) asks ``for_url`` before each page's
request; the scheduler reads a host's ``crawl_delay``.
"""

from __future__ import annotations

import collections
import datetime as dt
from collections.abc import Awaitable, Callable, Sequence

import anyio
import apsw

from .._model.messages import HostUpdate, Message, new_id, parse_time_text, utc_now
from .._model.refs import ArtifactRef
from .._model.urls import resolve_reference
from .._store.backend import ArtifactBackend
from . import frontier
from .fetch import FetchResult
from .robots import ROBOTS_TTL, Robots

__all__ = ["ROBOTS_BACKOFF_FIRST", "ROBOTS_BACKOFF_MAX", "HostRules", "robots_backoff"]

ROBOTS_BACKOFF_FIRST = 2.0
ROBOTS_BACKOFF_MAX = 60.0


def robots_backoff(failures: int) -> float:
    """How long a host waits after its robots.txt could not be had ``failures`` times in a
    row: 2 s, 6 s, 18 s, 54 s, then a minute. A seed whose host cannot be reached fails
    within seconds (three attempts: 2 + 6 s of waiting), while a host whose robots.txt
    stays down is asked at most once a minute."""
    return min(ROBOTS_BACKOFF_MAX, ROBOTS_BACKOFF_FIRST * 3 ** max(0, failures - 1))


Fetch = Callable[[str, int], Awaitable[FetchResult]]
Commit = Callable[[Sequence[Message]], Awaitable[None]]


class HostRules:
    """robots.txt of every host of one run. ``fetch(url, sequence)`` requests a URL (and
    counts it), ``commit(messages)`` commits a group; ``records`` are the hosts an
    earlier run recorded (``frontier.host_states``), set once the run has begun."""

    def __init__(self, *, run_id: str, user_agent: str, artifacts: ArtifactBackend,
                 fetch: Fetch, commit: Commit) -> None:
        self.run_id = run_id
        self.user_agent = user_agent
        self.artifacts = artifacts
        self._fetch = fetch
        self._commit = commit
        self.reader: apsw.Connection | None = None  # the run's reader, once it has begun
        self.records: dict[str, tuple] = {}
        self._robots: dict[str, Robots] = {}
        self._locks: dict[str, anyio.Lock] = collections.defaultdict(anyio.Lock)
        self._sequence: collections.Counter[str] = collections.Counter()
        self.problems: dict[str, str] = {}  # host -> why its robots.txt is unavailable
        self.failures: collections.Counter[str] = collections.Counter()  # in a row

    def crawl_delay(self, host: str) -> float | None:
        """robots.txt's Crawl-delay for the host, if its rules are known and say one."""
        robots = self._robots.get(host)
        return robots.crawl_delay(self.user_agent) if robots else None

    def unavailable(self, host: str) -> str:
        """Why the host's robots.txt could not be had, in words."""
        why = self.problems.get(host, "")
        return f"robots.txt unavailable ({why})" if why else "robots.txt unavailable"

    async def for_url(self, url: str, host: str) -> Robots | None:
        """The rules in force for ``url``'s host; None if robots.txt is unavailable (the
        host backs off: ``robots_backoff(failures[host])``)."""
        # Nearly every page finds its host's rules cached: that answer needs no lock (taking
        # and releasing an anyio Lock is four cancel scopes, per page).
        cached = self._fresh(host)
        if cached is not None:
            return cached
        async with self._locks[host]:  # one fetch of robots.txt per host at a time
            cached = self._fresh(host)  # another page's fetch may have got it
            if cached is not None:
                return cached
            robots = self._stored(host, utc_now()) or await self._fetch_robots(url, host)
            if robots is not None:
                self._robots[host] = robots
            return robots

    def _fresh(self, host: str) -> Robots | None:
        """The host's robots.txt rules held in memory, if not expired."""
        cached = self._robots.get(host)
        return cached if cached is not None and cached.expires_at > utc_now() else None

    def _stored(self, host: str, now: dt.datetime) -> Robots | None:
        """robots.txt recorded by an earlier run and not yet expired: no new request."""
        record = self.records.get(host)
        if record is None or record[0] is None:
            return None
        expires = parse_time_text(record[1])
        if expires is None or expires <= now:
            return None
        assert self.reader is not None
        body = frontier.attempt_body(self.reader, record[0])
        if body is None:
            return Robots.allow_all(attempt_id=record[0], expires_at=expires, status=None)
        data = self.artifacts.read(ArtifactRef(namespace=body[0], digest=body[1],
                                               size=body[2]))
        return Robots.parse(data, attempt_id=record[0], expires_at=expires, status=200)

    async def _fetch_robots(self, url: str, host: str) -> Robots | None:
        target = resolve_reference(url, "/robots.txt")
        for _hop in range(6):  # RFC 9309 2.3.1.2: follow at least five redirects
            self._sequence[target] += 1
            result = await self._fetch(target, self._sequence[target])
            status = result.status
            expires = utc_now() + ROBOTS_TTL
            location = result.headers.get("location") if result.headers is not None else None
            if status is not None and 300 <= status < 400 and location:
                await self._commit([result.attempt])
                target = resolve_reference(target, location)
                continue
            if result.attempt.outcome == "skipped":
                # The network policy refused it: robots.txt counts as absent (no rules, as
                # for a 4xx), for this run only; the page's own request is decided alike.
                await self._commit([result.attempt])
                return Robots.allow_all(attempt_id=result.attempt.attempt_id,
                                        expires_at=expires, status=None)
            if status is None or status >= 500:
                await self._commit([result.attempt])
                self.problems[host] = (f"HTTP {status}" if status is not None
                                       else result.attempt.error or "no answer")
                self.failures[host] += 1
                return None
            self.failures.pop(host, None)
            if 200 <= status < 300:
                robots = Robots.parse(result.body, attempt_id=result.attempt.attempt_id,
                                      expires_at=expires, status=status)
            else:
                robots = Robots.allow_all(attempt_id=result.attempt.attempt_id,
                                          expires_at=expires, status=status)
            await self._commit([result.attempt, HostUpdate(
                message_id=new_id("m-"), run_id=self.run_id, host=host,
                robots_attempt_id=result.attempt.attempt_id, robots_expires_at=expires,
                crawl_delay=robots.crawl_delay(self.user_agent),
                reason=f"robots.txt HTTP {status}")])
            return robots
        return None
