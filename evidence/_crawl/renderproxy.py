"""The recording proxy of one render: every request the browser makes passes through here.

    proxy = RecordingProxy(source=..., forward=...)
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)          # listening on 127.0.0.1:proxy.port
        ... point a browser context at http://127.0.0.1:{proxy.port} ...

Why a proxy: the browser's own network events give decoded bodies, never the bytes that
crossed the connection. Here each browser request is made again by the crawler's own HTTP
client, through the tap that records the wire (``_crawl.http.record_exchange``), so every
request of a render is a ``FetchAttempt`` with exact wire bytes, like every other attempt.
The browser then gets exactly those bytes back (head and body as read, chunk framing and
content coding included), and the connection is closed after each answer, so framing
never depends on what a keep-alive connection carried before. A response read over
HTTP/2 (the client speaks it to servers that offer it) reaches the browser as its decoded
head with an HTTP/1.1 status line and its DATA as the body (``_for_browser``).

The one change the browser's copy of every head gets: no ``WWW-Authenticate`` or
``Proxy-Authenticate`` field. Given a challenge, Chromium waits for someone to type a
password (there is no one): the page never loads, and the render ran into its timeout
for any page with one 401 image. The crawl answers challenges itself, with the
credentials it was given (``_crawl.secrets``); the attempt keeps the exact head. A digest
challenge (a first nonce, or a stale one) is answered at once: the request is made again
with the answer (``forward`` hands back both attempts, the browser gets the second).

- The first GET of the page being rendered is answered from the store: the source
  capture's response head and body as they were read, so the DOM is the rendering of the
  evidence already recorded, not of a second fetch.
- Every other request is forwarded (``forward``, which may refuse it: the crawl's network
  policy and scope, ``_crawl.render``; a refused one gets no answer, and is recorded with
  its reason): method, URL and body as the browser sent them, its
  headers except hop-by-hop ones, and ``Accept-Encoding: gzip, deflate`` (the codings the
  crawler can remove; ``br`` or ``zstd`` would leave content it cannot derive).
- ``CONNECT`` (HTTPS through a proxy): the proxy completes TLS with the browser itself,
  as the host, with a certificate of the crawl's own authority that only this browser
  trusts (``_crawl.rendertls``), reads the one request inside the tunnel and makes it as an
  ``https:`` request like any other. Without that authority (``tls=None``) the tunnel is
  refused (501) and listed in the render's ``not_recorded``.

One request is read per connection (at most ``MAX_HEAD`` bytes of head and the crawl's
body cap of body); a malformed request is answered 400 and recorded nowhere (nothing was
sent anywhere). ``in_flight`` and ``last_activity`` drive the settle rule.
"""

from __future__ import annotations

import contextlib
import http
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import anyio
import anyio.abc
import h11
from anyio.streams.tls import TLSStream

from .._errors import URLError
from .._model.urls import normalize_url
from .fetch import FetchResult

if TYPE_CHECKING:
    from .rendertls import RenderTLS

__all__ = ["BrowserRequest", "RecordingProxy", "SourceCapture"]

MAX_HEAD = 64 * 1024
_HOP_BY_HOP = frozenset({
    "connection", "proxy-connection", "keep-alive", "proxy-authorization", "te",
    "trailer", "transfer-encoding", "upgrade", "host", "accept-encoding", "content-length"})


@dataclass(frozen=True)
class SourceCapture:
    """The stored response the browser gets for the page being rendered."""

    url: str
    attempt_id: str
    head: bytes  # the response head as read
    body: bytes  # the body as read (transfer and content coding included)


@dataclass(frozen=True)
class BrowserRequest:
    method: str
    url: str
    headers: dict[str, str]
    body: bytes | None


# The attempts one browser request came to, in the order made: the browser gets the last.
Forward = Callable[[BrowserRequest], Awaitable[list[FetchResult]]]


@dataclass
class RecordingProxy:
    """Serves one render's browser context (see the module docstring)."""

    source: SourceCapture
    forward: Forward
    max_body_bytes: int = 10 * 1024 * 1024
    tls: RenderTLS | None = None
    port: int = 0
    in_flight: int = 0
    last_activity: float = field(default_factory=time.monotonic)
    results: list[FetchResult] = field(default_factory=list)  # in the order they ended
    not_recorded: list[str] = field(default_factory=list)
    source_served: bool = False
    _idle: anyio.Event = field(default_factory=anyio.Event)

    def __post_init__(self) -> None:
        self._key = normalize_url(self.source.url)
        self._idle.set()

    async def serve(self, *, task_status: anyio.abc.TaskStatus[int]) -> None:
        """Listen on 127.0.0.1 (a free port) until cancelled."""
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        async with listener:
            self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
            task_status.started(self.port)
            await listener.serve(self._connection)

    async def wait_idle(self) -> None:
        """Until no request is in flight."""
        while self.in_flight:
            await self._idle.wait()

    def _begin(self) -> None:
        self.in_flight += 1
        self.last_activity = time.monotonic()
        self._idle = anyio.Event()

    def _end(self) -> None:
        self.in_flight -= 1
        self.last_activity = time.monotonic()
        if not self.in_flight:
            self._idle.set()

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            request = await self._read_request(stream)
            if request is None:
                return
            if request.method == "CONNECT":
                await self._tunnel(stream, request.url)
                return
            await self._serve(stream, request)

    async def _serve(self, stream: anyio.abc.ByteStream, request: BrowserRequest) -> None:
        self._begin()
        try:
            answer = await self._answer(request)
        finally:
            self._end()
        if answer:
            with contextlib.suppress(anyio.BrokenResourceError, OSError):
                await stream.send(answer)

    async def _tunnel(self, stream: anyio.abc.SocketStream, authority: str) -> None:
        """Answer a CONNECT as the host itself (``_crawl.rendertls``), or refuse it."""
        host, _, port = authority.rpartition(":")
        if self.tls is None or not host or not port.isdigit():
            self.not_recorded.append(f"CONNECT {authority}: HTTPS is not recorded through "
                                     "the render proxy")
            with contextlib.suppress(anyio.BrokenResourceError, OSError):
                await stream.send(b"HTTP/1.1 501 Not Implemented\r\n"
                                  b"Content-Length: 0\r\nConnection: close\r\n\r\n")
            return
        try:
            await stream.send(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            tls = await TLSStream.wrap(stream, server_side=True, standard_compatible=False,
                                       ssl_context=self.tls.context_for(host))
        except (anyio.BrokenResourceError, anyio.EndOfStream, ssl.SSLError, OSError):
            return  # the browser gave up on the tunnel: no request was read, none made
        origin = f"https://{host}" + ("" if port == "443" else f":{port}")
        request = await self._read_request(tls, origin=origin)
        if request is not None:
            await self._serve(tls, request)

    async def _answer(self, request: BrowserRequest) -> bytes:
        if not self.source_served and request.method == "GET" and self._is_source(request.url):
            self.source_served = True
            return _for_browser(self.source.head) + self.source.body
        made = await self.forward(request)
        self.results += made
        result = made[-1]
        return _for_browser(result.head) + result.raw_body if result.head else b""

    def _is_source(self, url: str) -> bool:
        try:
            return normalize_url(url) == self._key
        except URLError:
            return False

    async def _read_request(self, stream: anyio.abc.ByteStream, *,
                            origin: str | None = None) -> BrowserRequest | None:
        """One request in absolute form (or CONNECT; in origin form inside a tunnel to
        ``origin``), or None (answered 400, or gone)."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        request: h11.Request | None = None
        body = bytearray()
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive(65536)
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    request = event
                    if request.method == b"CONNECT":
                        break
                elif isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > self.max_body_bytes:
                        raise h11.RemoteProtocolError("request body over the cap")
                elif isinstance(event, h11.ConnectionClosed):
                    return None
                else:  # EndOfMessage (or PAUSED after it)
                    break
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError, ssl.SSLError):
            return None
        except h11.RemoteProtocolError:
            with contextlib.suppress(anyio.BrokenResourceError, OSError):
                await stream.send(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n"
                                  b"Connection: close\r\n\r\n")
            return None
        if request is None:
            return None
        target = request.target.decode("latin-1")
        method = request.method.decode("latin-1")
        if origin is not None:  # inside a tunnel: origin form
            if not target.startswith("/"):
                return None
            target = origin + target
        elif method != "CONNECT" and not urlsplit(target).scheme:
            return None  # origin-form: not a proxy request
        headers: dict[str, str] = {}
        for name, value in request.headers.raw_items():  # as the browser spelled them
            key = name.decode("latin-1")
            if key.lower() in _HOP_BY_HOP:
                continue
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        headers["Accept-Encoding"] = "gzip, deflate"
        return BrowserRequest(method=method, url=target, headers=headers,
                              body=bytes(body) if body else None)


# A challenge field of a head, with its line end (obs-fold continuations included).
_NO_CHALLENGE = re.compile(
    rb"(?im)^(?:www|proxy)-authenticate[ \t]*:[^\r\n]*\r?\n(?:[ \t][^\r\n]*\r?\n)*")


def _for_browser(head: bytes) -> bytes:
    """A response head as the browser gets it over its HTTP/1.1 connection to the proxy: a
    head read over HTTP/2 (``HTTP/2 200``, rendered from its frames: ``_model.http2``) gets
    an HTTP/1.1 status line; its fields are sent as they were decoded. The attempt keeps
    the frames; this is only the browser's copy (its body ends where the connection does),
    and without the challenge fields (module docstring)."""
    head = _NO_CHALLENGE.sub(b"", head)
    if not head.startswith(b"HTTP/2 "):
        return head
    line, _, rest = head.partition(b"\r\n")
    status = line[7:10]
    try:
        reason = http.HTTPStatus(int(status)).phrase.encode()
    except ValueError:
        reason = b""
    return b"HTTP/1.1 " + status + b" " + reason + b"\r\n" + rest
