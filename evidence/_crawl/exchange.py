"""A request of the crawler's HTTP client (``_crawl.http``) laid out, and what it
exchanged: ``_prepare`` checks a URL and the caller's headers and lays the request out
(Host first, then the defaults, then the caller's fields) before any protocol writes it;
``Exchange`` holds the bytes one request wrote and read, in order, as they crossed the
connection; ``Headers`` reads a response's fields by name; ``FetchError`` names the step
that failed when no response head came that the client accepts.

Separate from the client because these are the values both protocols share (HTTP/1.1 in
``_crawl.http``, HTTP/2 in ``_crawl.h2connection``) and what the fetch
(``_crawl.fetch``) reads back: none of them does I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from .._model.http1 import Split
from .._model.wire import wire_format
from .connection import Peer
from .netpolicy import Origin

__all__ = ["Exchange", "FetchError", "Headers"]

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})  # an empty one says Content-Length: 0
_TARGET_OK = re.compile(r"[!$&'()*+,\-./0-9:;=?@A-Z_a-z~%]*")  # sent as it is
_TARGET_SAFE = "!$&'()*+,-./:;=?@_~%"  # kept by quote(): the rest is percent-encoded
_BAD_VALUE = re.compile(r"[\r\n\x00]")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a field name (RFC 9110 section 5.1)


class Exchange:
    """The bytes one request wrote to its connection and read from it, in order, and the
    connection it went over (``peer``; ``reused``: an earlier request went over it)."""

    __slots__ = ("_split", "method", "peer", "protocol", "received", "reused", "sent")

    def __init__(self, method: str) -> None:
        self.method = method
        # "http/1.1": ``sent`` and ``received`` are the bytes of the connection; "h2": the
        # frames of the request's stream (``_model.http2``).
        self.protocol = "http/1.1"
        self.sent = bytearray()
        self.received = bytearray()
        self._split: Split | None = None
        self.peer: Peer | None = None
        self.reused = False

    def split(self) -> Split:
        """The response's head, body and surplus (computed once the exchange is over)."""
        if self._split is None:
            try:
                self._split = wire_format(self.protocol).split_response(self.received,
                                                                        self.method)
            except ValueError:  # frames stored as read, from which no head is derived
                self._split = Split(b"", b"", b"", self.protocol, False)
        return self._split

    def close(self) -> None:
        """Drop the bytes (they are stored by then)."""
        self.sent, self.received, self._split = bytearray(), bytearray(), None


class Headers:
    """A response's header fields by name: names compared case-insensitively, the values of
    a repeated field joined by ", ", decoded as ASCII if the whole head is ASCII, else as
    UTF-8 if it all decodes so, else as Latin-1 (as httpx reads them)."""

    __slots__ = ("_encoding", "raw")

    def __init__(self, fields: list[tuple[bytes, bytes]]) -> None:
        self.raw = fields  # (name, value) as sent, values stripped (``parse_head``)
        self._encoding: str | None = None

    @property
    def encoding(self) -> str:
        if self._encoding is None:
            self._encoding = "iso-8859-1"
            for encoding in ("ascii", "utf-8"):
                try:
                    for name, value in self.raw:
                        name.decode(encoding)
                        value.decode(encoding)
                except UnicodeDecodeError:
                    continue
                self._encoding = encoding
                break
        return self._encoding

    def get(self, name: str, default: str | None = None) -> str | None:
        wanted = name.lower().encode("latin-1")
        values = [v for n, v in self.raw if n.lower() == wanted]
        return b", ".join(values).decode(self.encoding) if values else default

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None


class FetchError(Exception):
    """No response head the client accepts: ``kind`` names the step that failed;
    ``refused``: the network policy refused the connection (nothing was sent); ``peer``:
    the connection as far as it went (a proxy that refused the tunnel), if any."""

    def __init__(self, kind: str, detail: str, *, timeout: bool = False,
                 refused: bool = False, peer: Peer | None = None) -> None:
        super().__init__(detail if refused else f"{kind}: {detail}")
        self.kind = kind
        self.timeout = timeout
        self.refused = refused
        self.peer = peer



@dataclass(frozen=True)
class _Prepared:
    """A request checked and laid out, before any protocol writes it."""

    origin: Origin
    method: str
    target: str  # the path and query, as sent
    authority: str  # the host and port (the port only if not the scheme's default)
    fields: list[tuple[str, str]]  # in the order sent: Host first, then defaults, caller's
    content: bytes | None


def _prepare(method: str, url: str, headers: Mapping[str, str],
             content: bytes | None) -> _Prepared:
    """Where to connect and what to send, checked (FetchError ``InvalidURL`` if it cannot
    be sent as it is)."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        port = parts.port
        host = parts.hostname or ""
    except ValueError as exc:
        raise FetchError("InvalidURL", f"{exc}: {url[:200]!r}") from None
    if scheme not in ("http", "https"):
        raise FetchError("UnsupportedProtocol", f"not an http or https URL: {url[:200]!r}")
    if not host:
        raise FetchError("InvalidURL", f"no host in {url[:200]!r}")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise FetchError("InvalidURL", f"host {host!r}: {exc}") from None
    default = 443 if scheme == "https" else 80
    port = default if port is None else port
    name = f"[{host}]" if ":" in host else host
    authority = name if port == default else f"{name}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not _TARGET_OK.fullmatch(target):
        target = quote(target, safe=_TARGET_SAFE)
    # Host first, then the defaults, then the caller's fields (a caller's field replaces a
    # default of the same name, case-insensitively, in its place).
    fields: dict[str, tuple[str, str]] = {}
    if not any(key.lower() == "host" for key in headers):
        fields["host"] = ("Host", authority)
    fields["accept"] = ("Accept", "*/*")
    fields["accept-encoding"] = ("Accept-Encoding", "gzip, deflate")
    fields["connection"] = ("Connection", "keep-alive")
    for key, value in headers.items():
        fields[key.lower()] = (key, value)
    if content is not None or method in _BODY_METHODS:
        fields.pop("transfer-encoding", None)
        fields["content-length"] = ("Content-Length", str(len(content or b"")))
    for key, value in fields.values():
        if not _TOKEN.fullmatch(key) or _BAD_VALUE.search(value):
            raise FetchError("InvalidURL", f"header {key[:80]!r} cannot be sent as it is")
        try:
            value.encode("latin-1")
        except UnicodeEncodeError as exc:
            raise FetchError("InvalidURL", f"a header that is not Latin-1: {exc}") from None
    return _Prepared(Origin(scheme, host, port), method, target, authority,
                     list(fields.values()), content)


def _request(method: str, url: str, headers: Mapping[str, str],
             content: bytes | None) -> tuple[Origin, bytes]:
    """Where to connect and the request's HTTP/1.1 bytes (head, then body)."""
    prepared = _prepare(method, url, headers, content)
    return prepared.origin, _http1(prepared)


def _http1(prepared: _Prepared) -> bytes:
    """The request's HTTP/1.1 bytes (head, then body)."""
    lines = [f"{prepared.method} {prepared.target} HTTP/1.1"]
    lines += [f"{key}: {value}" for key, value in prepared.fields]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + (prepared.content or b"")
