"""The crawler's HTTP client, made the same way in the crawl and in its worker processes,
and the tap that records every request's bytes as they cross its connection.

    with record_exchange("GET") as exchange:
        response = await client.send(request, stream=True)
        ...
    exchange.sent, exchange.received      # bytes written, bytes read: exactly

The tap is in the network stream under httpcore (``_Stream``): what h11 wrote is what the
socket (or TLS layer) was given, and what it read is what h11 was fed, byte for byte. An
exchange belongs to the task that opened it (a context variable): in HTTP/1.1 without
pipelining, every read and write for a request happens in the task that sends it, so a
keep-alive connection reused by another request records into that request's exchange,
never into ours. A connection whose last exchange read bytes beyond the end of its
response (pipelined or misframed data, see ``_model.http1.split_response``) answers "readable"
to the pool's idle check, so the pool closes it instead of reading those bytes as the next
request's response.
"""

from __future__ import annotations

import contextlib
import contextvars
import select
import socket
import typing
from collections.abc import Iterator
from http.cookiejar import CookieJar

import httpcore
import httpx

from .._model.http1 import Split, split_response

__all__ = ["Exchange", "crawl_client", "record_exchange"]


class Exchange:
    """The bytes one request wrote to its connection and read from it, in order."""

    __slots__ = ("_split", "_surplus", "method", "received", "sent")

    def __init__(self, method: str) -> None:
        self.method = method
        self.sent = bytearray()
        self.received = bytearray()
        self._split: Split | None = None
        self._surplus: bool | None = None

    def split(self) -> Split:
        """The response's head, body and surplus (computed once the exchange is over)."""
        if self._split is None:
            self._split = split_response(bytes(self.received), self.method)
        return self._split

    def surplus(self) -> bool:
        """Whether bytes beyond the end of the response were read, or the response did not
        end where its framing says (never reuse the connection then: h11 would read those
        bytes as the next response)."""
        if self._surplus is None:
            split = self.split()
            self._surplus = bool(split.surplus) or not split.complete
        return self._surplus

    def close(self) -> None:
        """Drop the bytes (an idle connection keeps only the answer of ``surplus``, which
        the caller settles first, on the event loop that asks it)."""
        self.surplus()
        self.sent, self.received, self._split = bytearray(), bytearray(), None


_exchange: contextvars.ContextVar[Exchange | None] = contextvars.ContextVar(
    "evidence_exchange", default=None)


@contextlib.contextmanager
def record_exchange(method: str) -> Iterator[Exchange]:
    """Record what this task writes and reads on crawler connections until the block ends."""
    exchange = Exchange(method)
    token = _exchange.set(exchange)
    try:
        yield exchange
    finally:
        _exchange.reset(token)


def crawl_client(*, connections: int, timeout: float) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` that never retries, keeps no cookies, keeps ``connections`` alive.

    A retry would be a request the evidence does not record: the crawler retries through
    its frontier instead, each attempt recorded. No cookies: a request depends only on its
    URL and the crawl's configuration, never on which page some worker happened to fetch
    before it (a ``Set-Cookie`` is kept as evidence in the response head, never sent back).
    """
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    transport = httpx.AsyncHTTPTransport(retries=0, limits=limits)
    # The same pool httpx would build, on a network backend whose idle check is cheap (see
    # _Stream). httpx has no public way to pass a backend, hence the one private attribute;
    # tests/test_http.py fails if httpx stops using it.
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=httpx.create_ssl_context(),
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        retries=0,
        network_backend=_Backend(),
    )
    return httpx.AsyncClient(transport=transport, timeout=timeout, cookies=_NoCookies())


class _NoCookies(CookieJar):
    """A cookie jar that stores nothing and adds nothing (and skips the parsing)."""

    def extract_cookies(self, response: typing.Any, request: typing.Any) -> None:
        pass

    def add_cookie_header(self, request: typing.Any) -> None:
        pass


class _Backend(httpcore.AsyncNetworkBackend):
    """httpcore's anyio backend, its streams wrapped in ``_Stream``."""

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, *args: typing.Any, **kwargs: typing.Any) -> _Stream:
        return _Stream(await self._inner.connect_tcp(*args, **kwargs))

    async def connect_unix_socket(self, *args: typing.Any, **kwargs: typing.Any) -> _Stream:
        return _Stream(await self._inner.connect_unix_socket(*args, **kwargs))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _Stream(httpcore.AsyncNetworkStream):
    """A connection that records its bytes into the current ``Exchange``, and whose "is it
    readable?" answer costs one poll(2).

    Before each request and after each response the pool asks every idle connection whether
    it is readable (the server closed it, or sent bytes nobody asked for). httpcore's anyio
    stream answers by building anyio's whole extra-attribute table each time: ~6% of a crawl
    worker's CPU. The socket never changes, so it is looked up once here.
    """

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._socket: socket.socket | None = inner.get_extra_info("socket")
        self._last: Exchange | None = None  # the exchange that last read from it

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = await self._inner.read(max_bytes, timeout)
        exchange = _exchange.get()
        if exchange is not None:
            exchange.received += data
            self._last = exchange
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)  # recorded once written: what went out
        exchange = _exchange.get()
        if exchange is not None:
            exchange.sent += buffer
            self._last = exchange

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(self, *args: typing.Any, **kwargs: typing.Any) -> _Stream:
        return _Stream(await self._inner.start_tls(*args, **kwargs))

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "is_readable":  # asked only of idle connections, once a response is over
            if self._last is not None and self._last.surplus():
                return True
            return _readable(self._socket)
        return self._inner.get_extra_info(info)


def _readable(sock: socket.socket | None) -> bool:
    """Whether a read would not block; a socket that is gone counts as readable (EOF)."""
    fd = -1 if sock is None else sock.fileno()
    if fd < 0:
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
