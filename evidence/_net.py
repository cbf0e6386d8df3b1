"""Byte streams straight over asyncio transports: the crawler's sockets (issue 15).

anyio's asyncio socket streams pay, on every ``receive`` that waits, to switch the socket's
reading on and off again (two ``epoll_ctl`` calls; for a UNIX socket also a failed
selector lookup that formats the socket's ``repr``, two more system calls), and on every
``send`` a checkpoint that yields to the event loop. A crawl makes a few of those per page,
on the one thread that every page's Python runs on. ``Stream`` is an ``anyio`` byte stream
(usable wherever one is: ``FrameReader``, ``TLSStream.wrap``) whose socket stays
registered for reading while it is open; bytes that come are kept, at most
``_HIGH_WATER`` of them before reading pauses (a peer cannot make it buffer without bound).

Two things it does differently from anyio's streams, on purpose:

- ``receive`` and ``send`` return without yielding to the event loop when they need not
  wait (bytes already here; room in the write buffer). A task looping on them yields at
  the latest once the bounded buffer is drained or full.
- ``timeout`` (seconds, or None) bounds each wait of ``receive`` and each wait for the write
  buffer to drain: ``TimeoutError`` when it passes. One timer per wait instead of a cancel
  scope per call. anyio cancellation (a cancel scope around the caller) works as usual.

``acquire`` takes a semaphore's slot or a lock the same way: no yield when it is free.

``connect_tcp`` and ``wrap_socket`` give a ``Stream`` when the event loop is asyncio's, and
anyio's own stream under any other backend (trio), so callers need not know which.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.abc
import sniffio
from anyio.streams.tls import TLSStream

_HIGH_WATER = 256 * 1024  # bytes held unread before the socket's reading pauses
_LOW_WATER = 64 * 1024  # ... and below which it resumes


class _Protocol(asyncio.Protocol):
    """Keeps what comes (bounded), wakes the one waiting reader, tracks the write side."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: collections.deque[bytes] = collections.deque()
        self.held = 0  # bytes in chunks
        self.eof = False
        self.lost = False
        self.error: BaseException | None = None
        self.paused = False  # reading paused: held reached _HIGH_WATER
        self.reader: asyncio.Future[None] | None = None
        self.drain: asyncio.Future[None] | None = None  # set while writing is paused

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.held += len(data)
        if self.held >= _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake_reader()
        return True  # keep the write side open: the owner closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost, self.error = True, exc
        self._wake_reader()
        if self.drain is not None and not self.drain.done():
            self.drain.set_result(None)

    def pause_writing(self) -> None:
        if self.drain is None or self.drain.done():
            self.drain = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.drain is not None and not self.drain.done():
            self.drain.set_result(None)
        self.drain = None

    def _wake_reader(self) -> None:
        if self.reader is not None and not self.reader.done():
            self.reader.set_result(None)


class Stream(anyio.abc.ByteStream):
    """A connected socket's bytes, through an asyncio transport (see the module's doc)."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol,
                 timeout: float | None = None) -> None:
        self._transport, self._protocol = transport, protocol
        self._loop = asyncio.get_running_loop()
        self._closed = False
        self.timeout = timeout

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        sock = self._transport.get_extra_info("socket")
        peer = self._transport.get_extra_info("peername")
        return {anyio.abc.SocketAttribute.raw_socket: lambda: sock,
                anyio.abc.SocketAttribute.family: lambda: sock.family,
                anyio.abc.SocketAttribute.remote_address: lambda: peer}

    def at_rest(self) -> bool:
        """Whether nothing came since the last read and the peer has not closed (an idle
        keep-alive connection is still good to reuse)."""
        p = self._protocol
        return not (p.chunks or p.eof or p.lost or self._closed)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        p = self._protocol
        while not p.chunks:
            if self._closed:
                raise anyio.ClosedResourceError
            if p.lost and p.error is not None:
                raise anyio.BrokenResourceError from p.error
            if p.eof or p.lost:
                raise anyio.EndOfStream
            if p.reader is not None:
                raise anyio.BusyResourceError("reading from")
            p.reader = self._loop.create_future()
            try:
                await self._wait(p.reader)
            finally:
                p.reader = None
        chunk = p.chunks.popleft()
        if len(chunk) > max_bytes:
            chunk, rest = chunk[:max_bytes], chunk[max_bytes:]
            p.chunks.appendleft(rest)
        p.held -= len(chunk)
        if p.paused and p.held <= _LOW_WATER:
            p.paused = False
            self._transport.resume_reading()
        return chunk

    async def send(self, item: bytes) -> None:
        p = self._protocol
        if self._closed:
            raise anyio.ClosedResourceError
        if p.lost or self._transport.is_closing():
            raise anyio.BrokenResourceError from p.error
        self._transport.write(item)
        while p.drain is not None and not p.drain.done():
            await self._wait(p.drain)
            if p.lost:
                raise anyio.BrokenResourceError from p.error

    async def _wait(self, future: asyncio.Future[None]) -> None:
        if self.timeout is None:
            await future
            return
        timer = self._loop.call_later(self.timeout, _expire, future)
        try:
            await future
        finally:
            timer.cancel()

    async def send_eof(self) -> None:
        if not self._protocol.lost and self._transport.can_write_eof():
            self._transport.write_eof()

    async def aclose(self) -> None:
        self._closed = True
        self._transport.abort()
        await anyio.lowlevel.checkpoint()


def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


def _asyncio() -> bool:
    try:
        return sniffio.current_async_library() == "asyncio"
    except sniffio.AsyncLibraryNotFoundError:
        return False


async def connect_tcp(host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                      tls_hostname: str | None = None, timeout: float | None = None
                      ) -> anyio.abc.ByteStream:
    """A TCP connection (anyio's TLS over it when ``ssl_context`` is given, not requiring
    the peer's close_notify). ``timeout`` bounds each wait of a ``Stream``'s reads and
    writes, not the connect itself: callers bound that, as with ``anyio.connect_tcp``."""
    if not _asyncio():
        return await anyio.connect_tcp(host, port, ssl_context=ssl_context,
                                       tls_hostname=tls_hostname or host,
                                       tls_standard_compatible=False)
    loop = asyncio.get_running_loop()
    # asyncio resolves the name and tries each address in turn (RFC 8305 when given a
    # delay, as anyio does); its TCP transports set TCP_NODELAY.
    transport, protocol = await loop.create_connection(_Protocol, host, port,
                                                       happy_eyeballs_delay=0.25)
    stream: anyio.abc.ByteStream = Stream(transport, protocol, timeout)
    if ssl_context is not None:
        try:
            stream = await TLSStream.wrap(stream, hostname=tls_hostname or host,
                                          ssl_context=ssl_context, standard_compatible=False)
        except BaseException:
            transport.abort()
            raise
    return stream


async def connect_unix(path: str) -> anyio.abc.ByteStream:
    """A connection to a UNIX socket."""
    if not _asyncio():
        return await anyio.connect_unix(path)
    transport, protocol = await asyncio.get_running_loop().create_unix_connection(
        _Protocol, path)
    return Stream(transport, protocol)


async def wrap_socket(sock: socket.socket, *, timeout: float | None = None
                      ) -> anyio.abc.ByteStream:
    """A connected stream socket (TCP or UNIX) as a byte stream; the stream owns it."""
    if not _asyncio():
        if sock.family == socket.AF_UNIX:
            return await anyio.abc.UNIXSocketStream.from_socket(sock)
        return await anyio.abc.SocketStream.from_socket(sock)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_accepted_socket(_Protocol, sock)
    return Stream(transport, protocol, timeout)


async def adopt(stream: anyio.abc.ByteStream) -> anyio.abc.ByteStream:
    """A UNIX socket stream of anyio's (e.g. from a listener's ``accept``) as a ``Stream``
    under asyncio, which then owns its socket; any other stream as it is."""
    if not _asyncio() or not isinstance(stream, anyio.abc.UNIXSocketStream):
        return stream
    # anyio's asyncio UNIX stream registers its socket only while a call waits: idle, as
    # here, it holds the bare socket, which is handed over whole (anyio's object is dropped).
    raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    return await wrap_socket(socket.socket(raw.family, raw.type, raw.proto,
                                           fileno=raw.detach()))


async def acquire(slot: anyio.Semaphore | anyio.Lock) -> None:
    """Take ``slot``; when it is free (the usual case) without yielding to the event loop,
    as a read or write that need not wait does not (above). Waits, and yields, only when
    it is taken."""
    try:
        slot.acquire_nowait()
    except anyio.WouldBlock:
        await slot.acquire()
