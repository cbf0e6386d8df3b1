"""Clients of the writer service (``evidence serve``): ``AsyncClient`` and ``Client``.

    async with AsyncClient("store.sock") as client:           # anyio (asyncio or trio)
        ack = await client.submit(message)
        acks = await client.submit_group([attempt, discovery, frontier_update])

    with Client(address="127.0.0.1:7400", token=token) as client:   # blocking, thread-safe
        acks = client.submit_many(messages)                  # pipelined

The contract is the in-process ``Writer``'s: ``submit`` returns the message's ``Ack`` once
its batch has committed (``committed`` and ``duplicate`` are durable); ``submit_group``
commits its messages in one transaction; a ``CommitError`` means the batch did not commit
(redeliver); an invalid message raises ``MessageError`` and nothing of its request is
written. ``Writer`` and ``AsyncClient`` both satisfy ``Submitter``, so a crawler can be
handed either.

Many requests are in flight on one connection (up to ``ClientLimits.max_in_flight``; a
further ``submit`` waits). When the connection is lost (the service restarted, was killed,
or dropped this client for not reading), the client reconnects with exponential backoff and
sends every unanswered request again, in order. That is safe because the service's ledger
acknowledges a redelivered, already committed message as ``duplicate``: a submit that
returns, returns exactly one ack per message, and each message is recorded at most once.
Without a connection for ``reconnect_timeout`` seconds, pending and later submits raise
``ServiceError``. A wrong token or protocol version raises ``ServiceError`` at once.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import logging
import os
import random
import socket
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, TypeVar, TypeVarTuple

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import msgspec

from ._errors import CommitError, MessageError
from ._model.acks import Ack
from ._model.messages import MAX_MESSAGE_BYTES, Message, encode_checked
from ._net import connect_unix
from ._write.tls import parse_connect
from ._write.wire import (
    PEER_GONE,
    PROTOCOL_VERSION,
    AckFrame,
    ErrorFrame,
    FrameReader,
    Hello,
    Ping,
    Pong,
    ProtocolError,
    ServiceError,
    ServiceStatistics,
    StatsRequest,
    StatsResult,
    Submit,
    Welcome,
    decode_server_frame,
    encode_frame,
    parse_loopback,
)

__all__ = [
    "AsyncClient",
    "Client",
    "ClientLimits",
    "ClientStatistics",
    "ServiceError",
    "ServiceStatistics",
    "Submitter",
]

log = logging.getLogger("evidence.client")

T = TypeVar("T")
Args = TypeVarTuple("Args")

_MAX_ANSWER_BYTES = 64 * 1024 * 1024
_SEND_CHUNK = 1024 * 1024
_YIELD_EVERY = 64  # frames handled between two checkpoints


class Submitter(Protocol):
    """What a producer needs: ``Writer`` (in-process) and ``AsyncClient`` both provide it."""

    async def submit(self, message: Message) -> Ack: ...

    async def submit_group(self, messages: Sequence[Message]) -> list[Ack]: ...


@dataclass(frozen=True, kw_only=True)
class ClientLimits:
    """How much a client pipelines, and how it reconnects."""

    max_in_flight: int = 1024  # requests sent and unanswered; a further submit waits
    connect_timeout: float = 10.0  # one attempt: connect and handshake
    reconnect_timeout: float | None = 60.0  # without a connection this long: fail; None: never
    backoff_initial: float = 0.05  # seconds before the first retry, doubling (with jitter)
    backoff_max: float = 2.0


class ClientStatistics(msgspec.Struct, frozen=True, kw_only=True):
    connected: bool
    connections: int  # handshakes completed: 1 + reconnects
    redelivered: int  # requests sent again on a new connection
    in_flight: int  # requests unanswered now
    requests: int
    acks: int  # messages acknowledged


@dataclass(eq=False)
class _Request:
    id: int
    frame: bytes
    done: anyio.Event = field(default_factory=anyio.Event)
    result: object = None
    error: BaseException | None = None


async def connect_service(address: tuple[str, int], *, tls: ssl.SSLContext | None,
                          local_host: str | None = None) -> anyio.abc.ByteStream:
    """A TCP connection to the service, TLS when ``tls`` is given (the certificate checked
    against the host dialled)."""
    if tls is None:
        return await anyio.connect_tcp(*address, local_host=local_host)
    return await anyio.connect_tcp(*address, ssl_context=tls, tls_hostname=address[0],
                                   tls_standard_compatible=False, local_host=local_host)


class _Retry(Exception):
    """The service asked us to come back later (it is stopping, or full)."""


class AsyncClient:
    """A connection to the writer service, for anyio code. Use ``async with``.

    Give ``socket_path`` (a Unix socket) or ``address`` (``"127.0.0.1:PORT"``: a loopback
    address, or with ``tls``, a TLS context that verifies the service, any address or host
    name). ``token`` is required when the service has one. ``name`` appears in the
    service's log (default: host and pid). ``local_host``: the address to connect from.
    """

    def __init__(self, socket_path: os.PathLike[str] | str | None = None, *,
                 address: str | None = None, token: str | None = None, name: str = "",
                 limits: ClientLimits | None = None, tls: ssl.SSLContext | None = None,
                 local_host: str | None = None) -> None:
        if (socket_path is None) == (address is None):
            raise ServiceError("give the service's socket path or its address (not both)")
        self._socket_path = None if socket_path is None else os.fspath(socket_path)
        self._tls = tls
        self._local_host = local_host
        self._address = None if address is None else (
            parse_connect(address, tls=True) if tls is not None
            else parse_loopback(address, what="address"))
        self._where = self._socket_path or f"{address}"
        self._token = token or ""
        self._name = name or f"{socket.gethostname()} pid {os.getpid()}"
        self.limits = limits or ClientLimits()
        self.welcome: Welcome | None = None  # the service's, from the latest handshake
        self._ids = itertools.count(1)
        self._pending: dict[int, _Request] = {}
        self._outbox: collections.deque[int] = collections.deque()
        # anyio primitives need the event loop (Client makes us on another thread): __aenter__
        self._wake: anyio.Event
        self._slots: anyio.Semaphore
        self._changed: anyio.Event
        self._connected = False
        self._failure: ServiceError | None = None
        self._closed = False
        self._counts = collections.Counter[str]()
        self._tg: anyio.abc.TaskGroup | None = None

    # --- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> AsyncClient:
        """Connect (retrying with backoff up to ``reconnect_timeout``) and handshake."""
        self._wake = anyio.Event()
        self._slots = anyio.Semaphore(self.limits.max_in_flight, fast_acquire=True)
        self._changed = anyio.Event()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._supervise)
        try:
            while self.welcome is None and self._failure is None:
                self._changed = anyio.Event()
                await self._changed.wait()
            if self._failure is not None:
                raise self._failure
        except BaseException:
            self._tg.cancel_scope.cancel()
            await self._tg.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> bool | None:
        """Close. Requests still unanswered raise ``ServiceError`` in their callers."""
        self._closed = True
        self._fail_all(ServiceError("the client was closed before the service answered"))
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        if isinstance(exc, Exception):
            await self._tg.__aexit__(None, None, None)
            return None
        return await self._tg.__aexit__(exc_type, exc, tb)

    # --- requests ----------------------------------------------------------------------

    async def submit(self, message: Message) -> Ack:
        """Send one message; return its ack once its batch has committed."""
        [ack] = await self.submit_group([message])
        return ack

    async def submit_group(self, messages: Sequence[Message]) -> list[Ack]:
        """Send messages that commit in one transaction; return their acks in order."""
        if not messages:
            return []
        encoded = []
        for message in messages:
            encoded.append(msgspec.Raw(encode_checked(message)))
        request_id = next(self._ids)
        frame = encode_frame(Submit(id=request_id, messages=encoded))
        limit = self.welcome.max_frame_bytes if self.welcome else MAX_MESSAGE_BYTES
        if len(frame) - 4 > limit:
            raise MessageError(f"a group of {len(messages)} messages encodes to {len(frame)} "
                               f"bytes, over the service's frame limit of {limit}",
                               hint="submit it as smaller groups")
        acks = await self._request(request_id, frame)
        assert isinstance(acks, list)  # the answer to a Submit (_receive_loop)
        self._counts["acks"] += len(acks)
        return acks

    async def submit_many(self, messages: Iterable[Message]) -> list[Ack]:
        """Submit each message on its own, up to ``max_in_flight`` at once; acks in order."""
        items = list(messages)
        acks: dict[int, Ack] = {}
        positions = iter(range(len(items)))

        async def worker() -> None:
            for i in positions:
                acks[i] = await self.submit(items[i])

        async with anyio.create_task_group() as tg:
            for _ in range(min(len(items), self.limits.max_in_flight)):
                tg.start_soon(worker)
        return [acks[i] for i in range(len(items))]

    async def ping(self) -> float:
        """Round-trip time to the service, in seconds."""
        started = time.monotonic()
        request_id = next(self._ids)
        await self._request(request_id, encode_frame(Ping(id=request_id)))
        return time.monotonic() - started

    async def server_statistics(self) -> ServiceStatistics:
        """The service's writer and connection metrics."""
        return (await self._stats()).statistics

    async def metrics_text(self) -> str:
        """The same figures in the Prometheus text format."""
        return (await self._stats()).metrics

    async def _stats(self) -> StatsResult:
        request_id = next(self._ids)
        result = await self._request(request_id, encode_frame(StatsRequest(id=request_id)))
        assert isinstance(result, StatsResult)
        return result

    def statistics(self) -> ClientStatistics:
        return ClientStatistics(
            connected=self._connected, connections=self._counts["connections"],
            redelivered=self._counts["redelivered"], in_flight=len(self._pending),
            requests=self._counts["requests"], acks=self._counts["acks"])

    async def _request(self, request_id: int, frame: bytes) -> object:
        self._check_usable()
        async with self._slots:
            self._check_usable()
            request = _Request(request_id, frame)
            self._pending[request_id] = request
            self._counts["requests"] += 1
            self._outbox.append(request_id)
            self._wake.set()
            try:
                await request.done.wait()
            finally:
                self._pending.pop(request_id, None)  # cancelled: no redelivery either
        if request.error is not None:
            raise request.error
        return request.result

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed or self._tg is None:
            raise ServiceError("the client is not open", hint="use 'async with AsyncClient(...)'")

    def _resolve(self, request_id: int, result: object = None,
                 error: BaseException | None = None) -> None:
        request = self._pending.pop(request_id, None)
        if request is None:  # its caller was cancelled, or a redelivery was answered twice
            return
        request.result, request.error = result, error
        request.done.set()

    def _fail_all(self, error: ServiceError) -> None:
        for request in self._pending.values():
            request.error = error
            request.done.set()
        self._pending.clear()

    # --- the connection ----------------------------------------------------------------

    async def _supervise(self) -> None:
        """Connect, serve the connection until it is lost, reconnect with backoff; repeat."""
        lost_at = time.monotonic()
        delay = self.limits.backoff_initial
        while True:
            try:
                stream, reader, welcome = await self._connect()
            except ServiceError as exc:  # refused for good: wrong token or version
                self._give_up(exc)
                return
            except ssl.SSLCertVerificationError as exc:  # the wrong server, or the wrong CA
                self._give_up(ServiceError(
                    f"the writer service at {self._where} failed TLS verification: "
                    f"{exc.verify_message or exc}", code="tls",
                    hint="give the service's certificate (or its CA) with --tls-ca, and "
                    "dial an address its certificate names"))
                return
            except (OSError, TimeoutError, anyio.BrokenResourceError, anyio.EndOfStream,
                    ProtocolError, _Retry) as exc:
                waited = time.monotonic() - lost_at
                timeout = self.limits.reconnect_timeout
                if timeout is not None and waited >= timeout:
                    self._give_up(ServiceError(
                        f"no connection to the writer service at {self._where} for "
                        f"{waited:.0f} s (last error: {exc or type(exc).__name__})",
                        hint="start it with 'evidence serve', or check the socket path"))
                    return
                await anyio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, self.limits.backoff_max)
                continue
            delay = self.limits.backoff_initial
            try:
                fatal = await self._serve(stream, reader, welcome)
            finally:
                self._connected = False
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
            if fatal is not None:
                self._give_up(fatal)
                return
            lost_at = time.monotonic()
            log.info("connection to %s lost; reconnecting, %d requests to redeliver",
                     self._where, len(self._pending), extra={"event": "client.reconnect"})

    def _give_up(self, error: ServiceError) -> None:
        self._failure = error
        self._fail_all(error)
        self._changed.set()

    async def _connect(self) -> tuple[anyio.abc.ByteStream, FrameReader, Welcome]:
        with anyio.fail_after(self.limits.connect_timeout):
            stream: anyio.abc.ByteStream
            if self._socket_path is not None:
                stream = await connect_unix(self._socket_path)
            else:
                assert self._address is not None
                stream = await connect_service(self._address, tls=self._tls,
                                               local_host=self._local_host)
            try:
                await stream.send(encode_frame(Hello(versions=[PROTOCOL_VERSION],
                                                     token=self._token, client=self._name)))
                reader = FrameReader(stream)
                size = await reader.read_header()
                if size is None:
                    raise anyio.EndOfStream
                if size > _MAX_ANSWER_BYTES:
                    raise ProtocolError("frame_too_large", "the service sent a huge frame")
                frame = decode_server_frame(await reader.read_body(size))
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
                raise
        if isinstance(frame, Welcome):
            return stream, reader, frame
        await stream.aclose()
        if isinstance(frame, ErrorFrame) and frame.retryable:
            raise _Retry(f"{frame.code}: {frame.message}")
        if isinstance(frame, ErrorFrame):
            raise ServiceError(f"the writer service at {self._where} refused the connection: "
                               f"{frame.message}", code=frame.code, hint=frame.hint or (
                                   "check the token file" if frame.code == "unauthorized"
                                   else "upgrade evidence on both sides"))
        raise ServiceError(f"the writer service at {self._where} answered the hello with a "
                           f"{type(frame).__name__} frame", code="protocol")

    async def _serve(self, stream: anyio.abc.ByteStream, reader: FrameReader,
                     welcome: Welcome) -> ServiceError | None:
        """Redeliver what is unanswered, then run the connection until it ends."""
        self.welcome = welcome
        self._counts["connections"] += 1
        if self._counts["connections"] > 1:
            self._counts["redelivered"] += len(self._pending)
        self._outbox = collections.deque(sorted(self._pending))
        self._connected = True
        self._changed.set()
        fatal: ServiceError | None = None  # stays None if the sender fails first
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._send_loop, stream, tg.cancel_scope)
            fatal = await self._receive_loop(reader)
            tg.cancel_scope.cancel()
        return fatal

    async def _send_loop(self, stream: anyio.abc.ByteStream, scope: anyio.CancelScope) -> None:
        try:
            while True:
                if not self._outbox:
                    self._wake = anyio.Event()
                    await self._wake.wait()
                    continue
                chunk: list[bytes] = []
                size = 0
                while self._outbox and size < _SEND_CHUNK:
                    request = self._pending.get(self._outbox.popleft())
                    if request is not None:
                        chunk.append(request.frame)
                        size += len(request.frame)
                if chunk:
                    await stream.send(b"".join(chunk))
        except PEER_GONE:
            scope.cancel()  # the receiver sees the end too; stop both

    async def _receive_loop(self, reader: FrameReader) -> ServiceError | None:
        """Dispatch answers until the connection ends; a ServiceError if it must not resume."""
        frames = 0
        try:
            while True:
                size = await reader.read_header()
                if size is None:
                    return None
                if size > _MAX_ANSWER_BYTES:
                    return None
                frame = decode_server_frame(await reader.read_body(size))
                frames += 1
                if frames % _YIELD_EVERY == 0:
                    # Let the callers just answered submit again, and the sender send, while
                    # the service still works: two overlapping bursts, not one ping-pong.
                    await anyio.lowlevel.checkpoint()
                if isinstance(frame, AckFrame):
                    self._resolve(frame.id, frame.acks)
                elif isinstance(frame, (Pong, StatsResult)):
                    self._resolve(frame.id, frame)
                elif isinstance(frame, ErrorFrame):
                    if frame.id is None:
                        log.info("the service at %s ends the connection: %s: %s",
                                 self._where, frame.code, frame.message,
                                 extra={"event": "client.ended_by_service"})
                        if frame.retryable:
                            return None
                        return ServiceError(f"the writer service ended the connection: "
                                            f"{frame.message}", code=frame.code,
                                            hint="this is a bug in the client or service; "
                                            "report it")
                    self._request_failed(frame)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream,
                OSError, ProtocolError):
            return None

    def _request_failed(self, frame: ErrorFrame) -> None:
        assert frame.id is not None
        if frame.code == "invalid_message":
            self._resolve(frame.id, error=MessageError(frame.message, hint=frame.hint))
        elif frame.code == "commit_failed":
            self._resolve(frame.id, error=CommitError(frame.message, hint=frame.hint))
        elif frame.retryable:
            pass  # stays pending: redelivered when the connection is re-established
        else:
            self._resolve(frame.id, error=ServiceError(frame.message, code=frame.code,
                                                       hint=frame.hint))


class Client:
    """A blocking client: an ``AsyncClient`` running on its own event loop thread.

    Thread-safe: any number of threads may submit at once, and their requests share one
    connection. ``submit`` blocks until its ack; pipeline from one thread with
    ``submit_many`` or the ``*_soon`` variants, which return ``concurrent.futures.Future``.
    """

    def __init__(self, socket_path: os.PathLike[str] | str | None = None, *,
                 address: str | None = None, token: str | None = None, name: str = "",
                 limits: ClientLimits | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self._client = AsyncClient(socket_path, address=address, token=token, name=name,
                                   limits=limits, tls=tls)
        self._portal_cm: AbstractContextManager[anyio.from_thread.BlockingPortal] | None = None
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._client_cm: AbstractContextManager[AsyncClient] | None = None

    def __enter__(self) -> Client:
        portal_cm = anyio.from_thread.start_blocking_portal(name="evidence-client")
        portal = portal_cm.__enter__()
        try:
            client_cm = portal.wrap_async_context_manager(self._client)
            client_cm.__enter__()
        except BaseException:
            portal_cm.__exit__(*sys.exc_info())
            raise
        self._portal_cm, self._portal, self._client_cm = portal_cm, portal, client_cm
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._portal is None:
            return
        assert self._client_cm is not None and self._portal_cm is not None
        try:
            self._client_cm.__exit__(None, None, None)
        finally:
            self._portal = None
            self._portal_cm.__exit__(None, None, None)

    def _call(self, fn: Callable[[*Args], Awaitable[T]], *args: *Args) -> T:
        """``fn(*args)`` on the client's event loop thread; its result here."""
        if self._portal is None:
            raise ServiceError("the client is not open", hint="use 'with Client(...)'")
        return self._portal.call(fn, *args)

    def _soon(self, fn: Callable[[*Args], Awaitable[T]], *args: *Args
              ) -> concurrent.futures.Future[T]:
        """``fn(*args)`` started on the client's event loop thread; its result's future."""
        if self._portal is None:
            raise ServiceError("the client is not open", hint="use 'with Client(...)'")
        return self._portal.start_task_soon(fn, *args)

    def submit(self, message: Message) -> Ack:
        return self._call(self._client.submit, message)

    def submit_group(self, messages: Sequence[Message]) -> list[Ack]:
        return self._call(self._client.submit_group, messages)

    def submit_many(self, messages: Iterable[Message]) -> list[Ack]:
        return self._call(self._client.submit_many, list(messages))

    def submit_soon(self, message: Message) -> concurrent.futures.Future[Ack]:
        return self._soon(self._client.submit, message)

    def submit_group_soon(self, messages: Sequence[Message]
                          ) -> concurrent.futures.Future[list[Ack]]:
        return self._soon(self._client.submit_group, messages)

    def ping(self) -> float:
        return self._call(self._client.ping)

    def server_statistics(self) -> ServiceStatistics:
        return self._call(self._client.server_statistics)

    def metrics_text(self) -> str:
        return self._call(self._client.metrics_text)

    def statistics(self) -> ClientStatistics:
        return self._call(self._statistics)

    async def _statistics(self) -> ClientStatistics:
        return self._client.statistics()  # read on the client's own thread, as it counts
