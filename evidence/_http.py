"""The crawler's HTTP client: httpx, with a cheaper check of idle pooled connections.

Before every request, and after every response, httpcore asks each idle connection of its
pool whether its server has closed it ("is_readable"). Through anyio that question
rebuilds the stream's attribute table and calls ``getpeername()`` every time: measured at
about a tenth of a crawl's event-loop time with 16 connections to one host. The stream
wrapper here keeps the socket it got at connect time and polls it directly, which is the
same answer without the rest. Everything else is httpx's and httpcore's own.

The wrapper sits on the pool's network backend, an attribute httpcore does not promise;
if a future version moves it, ``crawl_client`` quietly returns the plain client.
"""

from __future__ import annotations

import select
import socket
import typing

import httpcore
import httpx

__all__ = ["crawl_client"]


def crawl_client(*, connections: int, timeout: float) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` that never retries and keeps ``connections`` alive."""
    transport = httpx.AsyncHTTPTransport(retries=0, limits=httpx.Limits(
        max_connections=connections, max_keepalive_connections=connections))
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if isinstance(backend, httpcore.AsyncNetworkBackend):
        pool._network_backend = _Backend(backend)  # type: ignore[union-attr]
    return httpx.AsyncClient(transport=transport, timeout=timeout)


def _readable(sock: socket.socket) -> bool:
    """Whether a read would not block (data, or the end of the stream: a closed peer)."""
    fd = sock.fileno()
    if fd < 0:  # closed: the next read reports it
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


class _Stream(httpcore.AsyncNetworkStream):
    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._socket = inner.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(self, ssl_context: typing.Any, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        return _Stream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "is_readable" and isinstance(self._socket, socket.socket):
            return _readable(self._socket)
        return self._inner.get_extra_info(info)


class _Backend(httpcore.AsyncNetworkBackend):
    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: typing.Iterable[typing.Any] | None = None,
                          ) -> httpcore.AsyncNetworkStream:
        return _Stream(await self._inner.connect_tcp(
            host, port, timeout=timeout, local_address=local_address,
            socket_options=socket_options))

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: typing.Iterable[typing.Any] | None = None,
                                  ) -> httpcore.AsyncNetworkStream:
        return _Stream(await self._inner.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)
