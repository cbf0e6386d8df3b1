"""The crawler's HTTP client, made the same way in the crawl and in its worker processes."""

from __future__ import annotations

import select
import socket
import typing
from http.cookiejar import CookieJar

import httpcore
import httpx

__all__ = ["crawl_client"]


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
    """A connection whose "is it readable?" answer costs one poll(2).

    Before each request and after each response the pool asks every idle connection whether
    it is readable (the server closed it, or sent bytes nobody asked for). httpcore's anyio
    stream answers by building anyio's whole extra-attribute table each time: ~6% of a crawl
    worker's CPU. The socket never changes, so it is looked up once here.
    """

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._socket: socket.socket | None = inner.get_extra_info("socket")
        self.read = inner.read  # type: ignore[method-assign]
        self.write = inner.write  # type: ignore[method-assign]

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)  # replaced per instance above

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)  # replaced per instance above

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(self, *args: typing.Any, **kwargs: typing.Any) -> _Stream:
        return _Stream(await self._inner.start_tls(*args, **kwargs))

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "is_readable":
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
