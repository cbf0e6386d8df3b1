"""A crawl session's cookies: the ones the user gave, and those ``Set-Cookie`` answers set.

    jar = CookieJar()
    jar.load_netscape(Path("cookies.txt").read_text(), secret=True)   # the user's
    jar.header_for("https://example.com/a")            # -> ("sid=abc; lang=fr", {"sid"})
    jar.update("https://example.com/a", [b"Set-Cookie: lang=en; Path=/"])  # an answer's

The crawler's HTTP client sends no cookie of its own accord (``_crawl.http``): a request
depends only on its URL and the crawl's configuration. With cookies configured (``crawl
--cookies FILE``, a ``[[hosts]]`` table, a secrets file) the crawler keeps a jar per session
and asks it for the ``Cookie`` field of each request, as a browser would: a cookie goes to a
URL whose host its domain matches (the domain itself or a subdomain, unless it is
host-only), whose path is under its path, over HTTPS only if it is ``Secure``, and until
it expires. A response's ``Set-Cookie`` fields update the jar (RFC 6265 section 5.3, the
parts a crawler needs: ``Domain``, ``Path``, ``Expires``, ``Max-Age``, ``Secure``; a
``Domain`` the answering host is not within is ignored, as is a cookie whose name or value
cannot be sent back as it is).

Which values are secret: every cookie the user supplied (a login's session, a consent
token someone else could reuse), unless its name is listed as public. A secret value is
sealed in the stored request (``_crawl.secrets``); a cookie a server set is already in the
evidence (its response head) and is sent as it is.

The jar is state of the session, and that state is the evidence itself: the user's
cookies come from the configuration, the rest from ``Set-Cookie`` fields in recorded
response heads. A resumed run rebuilds the jar by reading those heads again, in the order
they were recorded (``Crawler`` does, before its first request), so nothing is kept
beside the store that could disagree with it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

from .._errors import EvidenceError

__all__ = ["Cookie", "CookieJar", "parse_netscape"]

_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a token (RFC 6265 section 4.1.1)
_VALUE = re.compile(r'[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*|"[\x21\x23-\x2b\x2d-\x3a'
                    r'\x3c-\x5b\x5d-\x7e]*"')  # cookie-octets, optionally quoted
MAX_COOKIES = 3000  # the jar's bound: a site setting more loses its oldest


@dataclass(frozen=True)
class Cookie:
    """One cookie. ``domain`` is lower-case, without a leading dot; ``host_only`` sends it
    to that host only; ``expires`` is a Unix time (None: until the session ends)."""

    name: str
    value: str
    domain: str
    path: str = "/"
    host_only: bool = True
    secure: bool = False
    expires: float | None = None
    secret: bool = False  # the user's: its value is sealed in the stored request

    def matches(self, scheme: str, host: str, path: str, now: float) -> bool:
        if self.expires is not None and self.expires <= now:
            return False
        if self.secure and scheme != "https":
            return False
        if self.host_only:
            if host != self.domain:
                return False
        elif host != self.domain and not host.endswith("." + self.domain):
            return False
        return _path_matches(path, self.path)


def _path_matches(path: str, cookie_path: str) -> bool:
    if path == cookie_path:
        return True
    if path.startswith(cookie_path):
        return cookie_path.endswith("/") or path[len(cookie_path)] == "/"
    return False


def _default_path(path: str) -> str:
    if not path.startswith("/") or path.count("/") == 1:
        return "/"
    return path[:path.rindex("/")]


def parse_netscape(text: str, *, source: str, secret: bool = True) -> list[Cookie]:
    """The cookies of a Netscape ``cookies.txt`` (as curl, wget and browser extensions
    write it): one cookie a line, seven tab-separated fields (domain, include subdomains,
    path, secure, expiry, name, value); ``#`` starts a comment, except ``#HttpOnly_``
    before a domain. A line that is not so is an error naming ``source`` and the line."""
    cookies = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("#HttpOnly_"):
            line = line[len("#HttpOnly_"):]
        elif not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.rstrip("\r\n").split("\t")
        if len(fields) != 7:
            raise EvidenceError(
                f"{source}, line {number}: expected 7 tab-separated fields, found "
                f"{len(fields)}", hint="a cookies.txt line is: domain, TRUE/FALSE, path, "
                "TRUE/FALSE, expiry (Unix time, 0 for a session cookie), name, value")
        domain, subdomains, path, secure, expiry, name, value = fields
        if not _NAME.fullmatch(name) or not _VALUE.fullmatch(value):
            raise EvidenceError(f"{source}, line {number}: cookie {name[:80]!r} has a name "
                                "or value that cannot be sent as it is",
                                hint="a name is a token, a value has no spaces, commas, "
                                "semicolons, quotes or backslashes")
        if subdomains.upper() not in ("TRUE", "FALSE") or secure.upper() not in ("TRUE",
                                                                                 "FALSE"):
            raise EvidenceError(f"{source}, line {number}: the second and fourth fields are "
                                "TRUE or FALSE", hint="check the file was written in the "
                                "Netscape cookies.txt format")
        try:
            when = int(expiry)
        except ValueError:
            raise EvidenceError(f"{source}, line {number}: expiry {expiry[:40]!r} is not a "
                                "Unix time", hint="0 means a session cookie") from None
        host = domain.lower().lstrip(".")
        if not host:
            raise EvidenceError(f"{source}, line {number}: no domain",
                                hint="the first field names the cookie's domain")
        cookies.append(Cookie(name=name, value=value, domain=host, path=path or "/",
                              host_only=subdomains.upper() == "FALSE" and
                              not domain.startswith("."),
                              secure=secure.upper() == "TRUE",
                              expires=float(when) if when > 0 else None, secret=secret))
    return cookies


class CookieJar:
    """The cookies of one session (the module's doc). Not thread-safe: one event loop."""

    def __init__(self, cookies: Iterable[Cookie] = (), *,
                 clock: Callable[[], float] = time.time) -> None:
        self._cookies: dict[tuple[str, str, str], Cookie] = {}
        self._clock = clock
        for cookie in cookies:
            self.add(cookie)

    def __len__(self) -> int:
        return len(self._cookies)

    def __iter__(self) -> Iterator[Cookie]:
        return iter(list(self._cookies.values()))

    def add(self, cookie: Cookie) -> None:
        key = (cookie.domain, cookie.path, cookie.name)
        self._cookies.pop(key, None)  # a replaced cookie moves to the end: newest last
        if cookie.expires is not None and cookie.expires <= self._clock():
            return  # an expiry in the past deletes it
        self._cookies[key] = cookie
        while len(self._cookies) > MAX_COOKIES:
            del self._cookies[next(iter(self._cookies))]

    def header_for(self, url: str) -> tuple[str | None, list[str]]:
        """The ``Cookie`` field for ``url`` (None: no cookie goes there) and the values in
        it that are secret. Longer paths first, then older first (RFC 6265 5.4)."""
        try:
            parts = urlsplit(url)
            scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
        except ValueError:
            return None, []
        path, now = parts.path or "/", self._clock()
        chosen = [c for c in self._cookies.values() if c.matches(scheme, host, path, now)]
        if not chosen:
            return None, []
        chosen.sort(key=lambda c: -len(c.path))  # stable: older first within a length
        return ("; ".join(f"{c.name}={c.value}" for c in chosen),
                [c.value for c in chosen if c.secret and c.value])

    def update(self, url: str, set_cookies: Iterable[str], *, at: float | None = None) -> None:
        """Apply a response's ``Set-Cookie`` field values, as answered for ``url`` (at the
        Unix time ``at``, default now: a ``Max-Age`` counts from the answer)."""
        try:
            parts = urlsplit(url)
            host = (parts.hostname or "").lower()
        except ValueError:
            return
        for value in set_cookies:
            cookie = _set_cookie(value, host, parts.path or "/",
                                 self._clock() if at is None else at)
            if cookie is not None:
                known = self._cookies.get((cookie.domain, cookie.path, cookie.name))
                if known is not None and known.secret and known.value == cookie.value:
                    continue  # the server echoed the user's cookie: it stays sealed
                self.add(cookie)


def _set_cookie(value: str, host: str, request_path: str, now: float) -> Cookie | None:
    """One ``Set-Cookie`` value as a cookie for ``host`` (None: one a browser ignores)."""
    pair, *attributes = value.split(";")
    if "=" not in pair:
        return None
    name, _, val = pair.partition("=")
    name, val = name.strip(), val.strip()
    if not _NAME.fullmatch(name) or not _VALUE.fullmatch(val):
        return None
    domain, path, secure, expires = host, _default_path(request_path), False, None
    host_only, max_age = True, None
    for attribute in attributes:
        key, _, arg = attribute.partition("=")
        key, arg = key.strip().lower(), arg.strip()
        if key == "domain" and arg:
            wanted = arg.lower().lstrip(".")
            if host != wanted and not host.endswith("." + wanted):
                return None  # a domain the host is not within (RFC 6265 5.3 step 6)
            domain, host_only = wanted, False
        elif key == "path" and arg.startswith("/"):
            path = arg
        elif key == "secure":
            secure = True
        elif key == "max-age":
            try:
                max_age = int(arg)
            except ValueError:
                continue
        elif key == "expires":
            try:
                expires = parsedate_to_datetime(arg).timestamp()
            except (TypeError, ValueError, IndexError, OverflowError):
                continue
    if max_age is not None:  # Max-Age wins over Expires (RFC 6265 5.3 step 3)
        expires = now + max_age if max_age > 0 else 0.0
    return Cookie(name=name, value=val, domain=domain, path=path, host_only=host_only,
                  secure=secure, expires=expires)
