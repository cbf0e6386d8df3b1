"""The writer service: many producer processes, one serialized writer.

    async with Service(store, socket_path="evidence.sock") as service:
        await anyio.sleep_forever()  # until SIGTERM: exiting the block drains and closes

The service owns one ``Writer`` (``service.writer``, usable in-process too), the listening
sockets (a Unix socket created 0600, and optionally a loopback TCP port that requires a
token) and an optional Prometheus ``/metrics`` endpoint. Each connection has a reader (frames
in), a sender (answers out) and request tasks, each calling ``writer.submit_group`` for one
request (or a run of requests read back to back) and answering only after the commit.

The service is in parts: this module is its lifecycle, its listeners and its protocol (the
hello, then frames read, decoded, submitted and answered); ``admission.py`` decides who may
connect and how many (the token, worker hosts, fences, the per-peer share);
``connection.py`` is what one connection is made of (its outbox and sender, the read budget
its reads wait on, the merge of back-to-back submits); ``unixsocket.py`` binds the socket
file; ``limits.py`` holds ``ServiceLimits``.

Invariants:
  - a connection is authenticated before any frame but its hello is read; a protocol error
    ends the connection with an error frame, and nothing of the bad frame is written;
  - memory is bounded: bytes read from sockets count against ``max_pending_bytes``
    service-wide as they arrive, until their request commits (a client that declares a huge
    frame and sends one byte holds one byte); with the budget spent, connections stop
    reading, so clients block in their own ``send`` (backpressure over the wire) instead of
    the service buffering. ``max_in_flight`` requests service-wide and
    ``connection_in_flight`` per connection bound the requests read and unanswered;
  - one client cannot starve the others: a frame's body must arrive within
    ``body_timeout`` seconds of sending time; connections that have not said hello have
    their own limit (the oldest is dropped for a newcomer) and ``handshake_timeout``, so
    they never take an authenticated client's slot; an authenticated connection with
    nothing in flight is closed after ``idle_timeout``; and one peer (the process at the
    other end of the Unix socket, or the address a TCP connection comes from) holds at most
    ``max_connections_per_peer`` of the ``max_connections``, so one peer cannot fill them;
  - a request task never blocks on a socket: answers go to the connection's outbox (never
    fuller than its in-flight bound), and a sender that cannot write for ``send_timeout``
    drops its connection. A client that stops reading stalls only itself;
  - a connection that drops loses only answers: what it submitted still commits, and its
    redelivery is acknowledged ``duplicate`` from the ledger;
  - leaving the ``async with`` (the CLI does on SIGTERM) stops accepting, stops reading,
    waits for every read request to commit and be answered, then closes the writer.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.streams.tls import TLSStream

from .._errors import CommitError, MessageError, WriterClosedError
from .._model.messages import Message, decode_message
from .._net import acquire, adopt
from .._store.db import Store
from .._version import __version__
from .admission import Admission, peer_in_words, peer_of
from .connection import ClientConnection, Merge, MeteredStream, ReadBudget, error_frame
from .limits import ServiceLimits, WriterLimits
from .tls import TLSFiles, parse_listen, server_context
from .unixsocket import bind_unix
from .wire import (
    HEADER,
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
    decode_client_frame,
    encode_frame,
)
from .writer import Writer

__all__ = ["Service", "ServiceStatistics", "prometheus_text"]

log = logging.getLogger("evidence.service")

_YIELD_EVERY = 64  # frames read between two checkpoints, so reading never hogs the loop


# (stream, bytes read past the hello, the hello's client name, the peer in words, whom it
# counts against (its source address over TCP), its worker host identity or "")
WorkerHandler = Callable[[anyio.abc.ByteStream, bytes, str, str, str, str], Awaitable[None]]
# A crawl coordinator's check of what a TCP client submits (``_crawl/hostauth.py``): given
# the client's name (its hello's), its host identity (``hosts``; "" without), its peer and
# the request's messages, the reason to refuse them all, or None.
SubmissionGuard = Callable[[str, str, str, Sequence[Message]], "str | None"]


class Service:
    """The writer of ``store``, serving clients on a Unix socket and/or a TCP port.

    ``socket_path``: a Unix socket, created with mode 0600 (a stale socket left by a killed
    service is replaced; a live one is refused). ``listen``: ``"HOST:PORT"`` (port 0 picks
    one; see ``tcp_address``), which needs ``token``; a loopback address, or with ``tls``
    (the certificate and key, ``_write/tls.py``) any address, each connection a TLS one.
    When ``token`` is set, every connection must present it. ``metrics``: a loopback
    ``HOST:PORT`` serving ``/metrics`` (``_write/metrics.py``); another address only with
    ``metrics_public``.

    ``worker_handler``: a crawl coordinator's (``_crawl/workers.py``): a connection whose
    hello says ``role: worker`` is handed to it after the welcome (``WorkerHandler``).
    ``fence(name)`` ends a client's connections and refuses that name from then on (an
    expired lease).

    ``hosts``: worker host identities, name -> SHA-256 of that host's token (a crawl's
    ``--hosts-file``, ``_crawl/hostauth.py``). With it, a TCP connection must present one
    of those tokens (``token`` then serves the Unix socket only), it is that host's, and
    what it submits records the host's name in the ledger (``ingest_ledger.submitter``,
    under the Merkle leaf); ``fence_host(name)`` refuses the host's token from then on.
    ``submission_guard``: what a TCP client submits is checked by it first; a refusal is
    an ``not_leased`` error for that request, nothing of it written. With a guard and no
    ``hosts``, a TCP client's messages record its hello's name as their submitter.
    """

    def __init__(self, store: Store, *, socket_path: os.PathLike[str] | str | None = None,
                 listen: str | None = None, token: str | None = None,
                 metrics: str | None = None, limits: ServiceLimits | None = None,
                 writer_limits: WriterLimits | None = None,
                 tls: TLSFiles | ssl.SSLContext | None = None,
                 worker_handler: WorkerHandler | None = None,
                 metrics_public: bool = False,
                 hosts: Mapping[str, bytes] | None = None) -> None:
        if socket_path is None and listen is None:
            raise ServiceError("the service needs a Unix socket path or a TCP address",
                               hint="give --socket PATH, or --listen 127.0.0.1:PORT")
        if listen is not None and not token and not hosts:
            raise ServiceError("listening on a TCP port needs a token: anyone who can reach "
                               "it could connect", hint="add --token-file FILE (mode 600)")
        self.store = store
        self.limits = limits or ServiceLimits()
        self.writer_limits = writer_limits or WriterLimits(max_batch_delay=0.002)
        self.socket_path = None if socket_path is None else Path(socket_path)
        self._tls = server_context(tls) if isinstance(tls, TLSFiles) else tls
        self._listen = None if listen is None else parse_listen(listen,
                                                                tls=self._tls is not None)
        self.worker_handler = worker_handler
        self.submission_guard: SubmissionGuard | None = None
        self._admission = Admission(self.limits, token=token, hosts=hosts)
        self._metrics = None
        if metrics is not None:
            from .metrics import metrics_address

            self._metrics = metrics_address(metrics, public=metrics_public)
        self.tcp_address: tuple[str, int] | None = None
        self.metrics_address: tuple[str, int] | None = None
        self.writer: Writer  # set on entry
        self._stack = contextlib.AsyncExitStack()
        self._tg: anyio.abc.TaskGroup
        self._listeners: list[anyio.abc.SocketListener] = []
        self._tcp_listeners: list[anyio.abc.SocketListener] = []
        self._connections: set[ClientConnection] = set()
        # anyio primitives need the event loop: made in __aenter__
        self._accept_scopes: list[anyio.CancelScope] = []
        self._metrics_scope: anyio.CancelScope
        self._connections_changed: anyio.Event
        self._requests: anyio.Semaphore
        self._budget: ReadBudget
        self._counts = collections.Counter[str]()
        self._errors = collections.Counter[str]()
        self._socket_inode: int | None = None
        self._stopping = False
        self._started = time.monotonic()

    # --- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Service:
        self._metrics_scope = anyio.CancelScope()
        self._connections_changed = anyio.Event()
        self._requests = anyio.Semaphore(self.limits.max_in_flight, fast_acquire=True)
        self._budget = ReadBudget(max(self.limits.max_pending_bytes, 1),
                                   self.limits.max_frame_bytes + HEADER.size)
        await self._stack.__aenter__()
        try:
            self.writer = await self._stack.enter_async_context(
                Writer(self.store, limits=self.writer_limits))
            self._stack.callback(self._unlink_socket)
            await self._open_listeners()
            self._tg = await self._stack.enter_async_context(anyio.create_task_group())
            for listener in self._listeners:
                self._tg.start_soon(self._accept, listener, listener in self._tcp_listeners)
            if self._metrics is not None:
                metrics = await anyio.create_tcp_listener(local_host=self._metrics[0],
                                                          local_port=self._metrics[1])
                self.metrics_address = (self._metrics[0],
                                        metrics.extra(anyio.abc.SocketAttribute.local_port))
                self._tg.start_soon(self._serve_metrics, metrics)
        except BaseException as exc:
            for listener in self._listeners:
                await listener.aclose()
            await self._stack.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._started = time.monotonic()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> bool | None:
        if exc is None:
            await self._drain()
        else:
            self._tg.cancel_scope.cancel()
        return await self._stack.__aexit__(exc_type, exc, tb)

    async def _drain(self) -> None:
        """Stop accepting and reading; answer what was read once it commits; close clients."""
        self._stopping = True
        for scope in self._accept_scopes:
            scope.cancel()
        self._unlink_socket()
        for conn in list(self._connections):
            conn.read_scope.cancel()
        with anyio.move_on_after(self.limits.drain_timeout):
            await self._wait_no_connections()
        for conn in list(self._connections):
            conn.scope.cancel()
        await self._wait_no_connections()
        self._metrics_scope.cancel()

    async def _wait_no_connections(self) -> None:
        while self._connections:
            await self._connections_change()

    async def wait_gone(self, client: str) -> None:
        """Until no connection of the client named ``client`` (in its hello) is open.

        A connection closes only after every request it read has committed (or failed), so
        afterwards the store holds everything that client will ever get written.
        """
        while any(conn.client == client for conn in self._connections):
            await self._connections_change()

    async def fence(self, client: str) -> None:
        """Refuse the client named ``client`` from now on, end its connections, and wait
        until they are gone: what they had read has committed (or failed) by then, and
        nothing it sends later is written. A worker host whose lease expired is fenced so
        that its pages can be settled from the store without a late submission racing."""
        self._admission.fence(client)
        for conn in list(self._connections):
            if conn.client == client:
                conn.read_scope.cancel()
        await self.wait_gone(client)

    async def fence_host(self, host: str) -> None:
        """Refuse worker host ``host`` (a ``hosts`` identity) for as long as this service
        runs, whatever name it gives, end its connections and wait until they are gone."""
        self._admission.fence_host(host)
        for conn in list(self._connections):
            if conn.host == host:
                conn.read_scope.cancel()
        while any(conn.host == host for conn in self._connections):
            await self._connections_change()

    async def _start_tls(self, conn: ClientConnection) -> None:
        """The TLS handshake (inside the hello's deadline: a peer that stalls it is
        dropped like one that says nothing)."""
        assert self._tls is not None
        conn.stream = await TLSStream.wrap(conn.stream, server_side=True,
                                           ssl_context=self._tls, standard_compatible=False)

    async def _connections_change(self) -> None:
        if self._connections_changed.is_set():  # shared by every waiter until it fires
            self._connections_changed = anyio.Event()
        await self._connections_changed.wait()

    # --- listening ---------------------------------------------------------------------

    async def _open_listeners(self) -> None:
        if self.socket_path is not None:
            self._listeners.append(await anyio.abc.SocketListener.from_socket(
                bind_unix(self.socket_path)))
            self._socket_inode = self.socket_path.stat().st_ino
        if self._listen is not None:
            tcp = await anyio.create_tcp_listener(local_host=self._listen[0],
                                                  local_port=self._listen[1])
            for listener in tcp.listeners:  # one per address family, each accepts alone
                assert isinstance(listener, anyio.abc.SocketListener)
                self._listeners.append(listener)
                self._tcp_listeners.append(listener)
            self.tcp_address = (self._listen[0], tcp.extra(anyio.abc.SocketAttribute.local_port))

    def _unlink_socket(self) -> None:
        """Remove our socket file (only ours: a successor may have bound the path since)."""
        if self.socket_path is None or self._socket_inode is None:
            return
        with contextlib.suppress(FileNotFoundError):
            if self.socket_path.stat().st_ino == self._socket_inode:
                self.socket_path.unlink()
        self._socket_inode = None

    async def _accept(self, listener: anyio.abc.SocketListener, tcp: bool = False) -> None:
        with anyio.CancelScope() as scope:
            self._accept_scopes.append(scope)
            if self._stopping:
                scope.cancel()
            async with listener:
                while True:
                    try:
                        stream = await listener.accept()
                    except OSError as exc:  # EMFILE and friends: wait, do not spin
                        log.warning("accept failed: %s", exc,
                                    extra={"event": "service.accept_failed"})
                        await anyio.sleep(0.1)
                        continue
                    self._tg.start_soon(self._handle, stream, tcp and self._tls is not None, tcp)

    # --- one connection ----------------------------------------------------------------

    async def _handle(self, stream: anyio.abc.ByteStream, tls: bool = False,
                      tcp: bool = False) -> None:
        try:
            stream = await adopt(stream)  # a UNIX connection: read through _net (cheaper)
        except OSError as exc:  # the socket is unusable: as if the peer went at once
            log.info("a connection failed as it was accepted: %s", exc,
                     extra={"event": "service.connection_failed"})
            with contextlib.suppress(OSError):
                await stream.aclose()
            return
        self._counts["connections"] += 1
        identity = peer_of(stream)
        conn = ClientConnection(stream, self.limits,
                           f"connection {self._counts['connections']} {peer_in_words(stream)}",
                           identity)
        conn.tls = tls
        conn.tcp = tcp
        self._connections.add(conn)
        try:
            with conn.scope:
                await self._serve(conn)
        finally:
            with anyio.CancelScope(shield=True):
                await conn.stream.aclose()  # the TLS stream, if one was started
            self._admission.leave(conn)
            self._budget.frame_done(conn)
            self._budget.release(conn.held)  # what it read and never handed on
            conn.held = 0
            self._connections.discard(conn)
            if conn.slow:
                self._counts["slow_disconnects"] += 1
            self._connections_changed.set()

    async def _serve(self, conn: ClientConnection) -> None:
        self._admission.waiting(conn)
        reader = FrameReader(MeteredStream(conn, self._budget, self._counts))
        try:
            with conn.hello_scope, anyio.fail_after(self.limits.handshake_timeout):
                if conn.tls:
                    await self._start_tls(conn)
                await self._handshake(conn, reader)
        except ProtocolError as exc:
            self._admission.not_waiting(conn)
            await self._refuse(conn, exc)
            return
        except TimeoutError:
            self._admission.not_waiting(conn)
            await self._refuse(conn, ProtocolError("handshake_timeout",
                                                   "no valid hello in time"))
            return
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream,
                OSError, ssl.SSLError):
            return
        if conn.hello_scope.cancelled_caught:  # dropped for a newer connection (not logged:
            self._errors["too_many_unauthenticated"] += 1  # a flood would flood the log)
            return
        if conn.role == "worker" and self.worker_handler is not None:
            # The connection is the coordinator's now: the worker protocol, its own
            # reads (a worker channel carries a few small frames, not the budget's).
            with conn.read_scope:
                await self.worker_handler(conn.stream, reader.take_buffered(),
                                          conn.client, conn.peer, conn.identity, conn.host)
            return
        await self._serve_authenticated(conn, reader)

    async def _serve_authenticated(self, conn: ClientConnection, reader: FrameReader) -> None:
        final: ProtocolError | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(conn.send_loop)
            with conn.read_scope:
                try:
                    await self._read_loop(conn, reader)
                except ProtocolError as exc:
                    final = exc
                except PEER_GONE:
                    pass
            await conn.wait_requests_done()  # they commit whatever becomes of the socket
            if final is None and self._stopping:
                final = ProtocolError("shutting_down", "the service is stopping; reconnect "
                                      "and redeliver what was not acked", retryable=True)
            if final is not None:
                self._count_error(final, conn)
                conn.push(encode_frame(final.frame()), slot=False)
            conn.close_outbox()
        if not conn.dead:
            await self._linger(conn)

    async def _handshake(self, conn: ClientConnection, reader: FrameReader) -> None:
        size = await reader.read_header()
        if size is None:
            raise anyio.EndOfStream
        if size > self.limits.max_hello_bytes:
            raise ProtocolError("frame_too_large", f"a {size}-byte frame before the hello "
                                f"was accepted (at most {self.limits.max_hello_bytes})")
        hello = decode_client_frame(await reader.read_body(size))
        self._release(conn, HEADER.size + size)
        if not isinstance(hello, Hello):
            raise ProtocolError("protocol", "the first frame must be a hello")
        self._admission.admit(conn, hello, stopping=self._stopping,
                              takes_workers=self.worker_handler is not None)
        conn.client = hello.client
        conn.role = hello.role
        conn.peer = f"{conn.peer} ({hello.client or 'unnamed client'})"
        welcome = Welcome(version=PROTOCOL_VERSION, server=f"evidence {__version__}",
                          store_id=self.store.store_id,
                          max_frame_bytes=self.limits.max_frame_bytes,
                          max_in_flight=self.limits.connection_in_flight)
        with anyio.fail_after(self.limits.send_timeout):
            await conn.stream.send(encode_frame(welcome))

    def _release(self, conn: ClientConnection, n: int) -> None:
        """Give back ``n`` bytes of the read budget that ``conn`` took."""
        conn.held -= n
        self._budget.release(n)

    async def _refuse(self, conn: ClientConnection, error: ProtocolError) -> None:
        """Send one error frame and close, without reading anything more of the peer's."""
        self._count_error(error, conn)
        with contextlib.suppress(*PEER_GONE, TimeoutError), anyio.fail_after(1.0):
            await conn.stream.send(encode_frame(error.frame()))
        await self._linger(conn)

    async def _linger(self, conn: ClientConnection) -> None:
        """Half-close, and discard what the peer still sends until it closes (bounded).

        Closing a socket with unread input resets the connection, and the peer may then
        lose the answers and error frame it has not read yet.
        """
        with contextlib.suppress(*PEER_GONE), \
                anyio.move_on_after(min(self.limits.send_timeout, 5.0)):
            if not conn.tls:  # TLS has no half-close: the peer closes after our answers
                await conn.stream.send_eof()
            while True:
                await conn.stream.receive()

    def _count_error(self, error: ProtocolError, conn: ClientConnection) -> None:
        self._errors[error.code] += 1
        if error.code != "shutting_down":
            log.info("%s: %s: %s", conn.peer, error.code, error,
                     extra={"event": "service.protocol_error"})

    async def _read_loop(self, conn: ClientConnection, reader: FrameReader) -> None:
        """Read, decode and dispatch frames until the peer ends the stream.

        Submits already buffered are handed to the writer together, as one group (their
        messages commit in one transaction anyway, each still failing alone), which saves a
        task and a queue entry per request. The merge is flushed before anything that could
        wait, so a request never waits for a later one.
        """
        merge = Merge()
        try:
            while True:
                if not reader.frame_ready():
                    self._flush(conn, merge)  # the next read may wait on the socket
                size = await self._next_header(conn, reader)
                if size is None:
                    return
                if size > self.limits.max_frame_bytes:
                    raise ProtocolError("frame_too_large", f"a {size}-byte frame is over the "
                                        f"limit of {self.limits.max_frame_bytes} bytes")
                self._release(conn, HEADER.size)
                reserved = size  # released here, or by the request task after the commit
                try:
                    frame = decode_client_frame(await self._body(conn, reader, size))
                    self._counts["frames"] += 1
                    if self._counts["frames"] % _YIELD_EVERY == 0:
                        self._flush(conn, merge)
                        await anyio.lowlevel.checkpoint()  # let tasks and senders run
                    if isinstance(frame, Hello):
                        raise ProtocolError("protocol", "hello sent twice")
                    if conn.slots.value == 0 or self._requests.value == 0:
                        self._flush(conn, merge)
                        self._counts["backpressure_waits"] += 1
                    await acquire(conn.slots)  # released when the answer is written
                    if isinstance(frame, Submit):
                        messages = self._decode_messages(conn, frame)
                        if messages is None or not self._allowed(conn, frame.id, messages):
                            continue
                        await acquire(self._requests)
                        conn.request_started()
                        merge.add(frame.id, messages, reserved)
                        reserved = 0  # the request task releases it after the commit
                        if merge.full():
                            self._flush(conn, merge)
                    elif isinstance(frame, Ping):
                        conn.push(encode_frame(Pong(id=frame.id)), slot=True)
                    elif isinstance(frame, StatsRequest):
                        stats = self.statistics()
                        conn.push(encode_frame(StatsResult(
                            id=frame.id, statistics=stats, metrics=prometheus_text(stats))),
                            slot=True)
                finally:
                    if reserved:
                        self._release(conn, reserved)
        finally:
            self._flush(conn, merge)  # what was read is committed and answered, whatever ends

    async def _next_header(self, conn: ClientConnection, reader: FrameReader) -> int | None:
        """The next frame's size; a connection with nothing in flight that sends nothing
        for ``idle_timeout`` is closed (retryable: its client reconnects when it needs to)."""
        if reader.buffered() >= HEADER.size:  # no wait: no timeout to arm
            return await reader.read_header()
        while True:
            with anyio.move_on_after(self.limits.idle_timeout) as idle:
                return await reader.read_header()
            if idle.cancelled_caught and conn.in_flight == 0:
                raise ProtocolError("idle_timeout", f"nothing sent for "
                                    f"{self.limits.idle_timeout:g} s", retryable=True)

    async def _body(self, conn: ClientConnection, reader: FrameReader, size: int) -> bytes:
        """A frame's body: the client has ``body_timeout`` seconds of sending time for it,
        and its bytes count against the read budget as they arrive."""
        if reader.buffered() >= size:
            return await reader.read_body(size)
        conn.body_time_left = self.limits.body_timeout
        self._budget.frame_started(conn)
        try:
            return await reader.read_body(size)
        except TimeoutError:
            raise ProtocolError("body_timeout", f"a {size}-byte frame did not arrive within "
                                f"{self.limits.body_timeout:g} s") from None
        finally:
            conn.body_time_left = None
            self._budget.frame_done(conn)

    def _flush(self, conn: ClientConnection, merge: Merge) -> None:
        if merge.requests:
            self._tg.start_soon(self._submit, conn, merge.requests, merge.reserved)
            merge.clear()

    def _decode_messages(self, conn: ClientConnection, frame: Submit) -> list[Message] | None:
        """Decode strictly; a defect refuses the whole request (nothing of it is written)."""
        try:
            messages = [decode_message(raw) for raw in frame.messages]
        except MessageError as exc:
            self._errors["invalid_message"] += 1
            conn.push(encode_frame(ErrorFrame(
                code="invalid_message", message=str(exc), id=frame.id, hint=exc.hint)),
                slot=True)
            return None
        self._counts["messages"] += len(messages)
        return messages

    def _allowed(self, conn: ClientConnection, request_id: int, messages: list[Message]) -> bool:
        """Whether the coordinator's guard lets a TCP client submit these (else answered
        ``not_leased``, nothing of the request written; the guard fences the host)."""
        guard = self.submission_guard
        if guard is None or not conn.tcp:
            return True
        refused = guard(conn.client, conn.host, conn.identity, messages)
        if refused is None:
            return True
        self._errors["not_leased"] += 1
        log.warning("%s: refused what it submitted: %s", conn.peer, refused,
                    extra={"event": "service.submission_refused"})
        conn.push(encode_frame(ErrorFrame(code="not_leased", message=refused, id=request_id,
                                          hint="a worker host submits only what the "
                                          "coordinator leased to it")), slot=True)
        return False

    def _submitter(self, conn: ClientConnection) -> str | None:
        """Who ``conn``'s messages say submitted them (``ingest_ledger.submitter``)."""
        if conn.host:
            return conn.host
        if conn.tcp and self.submission_guard is not None and conn.client:
            return conn.client
        return None

    async def _submit(self, conn: ClientConnection, requests: list[tuple[int, list[Message]]],
                      reserved: int) -> None:
        """Commit requests (as one group) and answer each; a failure answers each alike."""
        try:
            try:
                acks = await self.writer.submit_group(
                    [m for _, messages in requests for m in messages], decoded=True,
                    submitter=self._submitter(conn))
            except MessageError:
                if len(requests) == 1:
                    raise
                # One message re-encodes over the limit: find it, and fail its request alone.
                for request in requests:
                    await self._submit_one(conn, request)
                return
            offset = 0
            for request_id, messages in requests:
                part = acks[offset:offset + len(messages)]
                offset += len(messages)
                self._counts["acks"] += len(part)
                conn.push(encode_frame(AckFrame(id=request_id, acks=part)), slot=True)
        except (MessageError, CommitError, WriterClosedError) as exc:
            for request_id, _ in requests:
                conn.push(encode_frame(error_frame(exc, request_id)), slot=True)
        finally:
            self._release(conn, reserved)
            for _ in requests:
                self._requests.release()
            conn.request_done(len(requests))

    async def _submit_one(self, conn: ClientConnection, request: tuple[int, list[Message]]) -> None:
        request_id, messages = request
        try:
            acks = await self.writer.submit_group(messages, decoded=True,
                                                  submitter=self._submitter(conn))
        except (MessageError, CommitError, WriterClosedError) as exc:
            conn.push(encode_frame(error_frame(exc, request_id)), slot=True)
        else:
            self._counts["acks"] += len(acks)
            conn.push(encode_frame(AckFrame(id=request_id, acks=acks)), slot=True)

    # --- health and metrics ------------------------------------------------------------

    def statistics(self) -> ServiceStatistics:
        now = time.monotonic()
        return ServiceStatistics(
            writer=self.writer.statistics(),
            uptime=now - self._started,
            connected_clients=len(self._connections),
            connections_total=self._counts["connections"],
            requests_in_flight=self.limits.max_in_flight - self._requests.value,
            pending_bytes=self._budget.used,
            frames_received=self._counts["frames"],
            messages_received=self._counts["messages"],
            acks_sent=self._counts["acks"],
            backpressure_waits=self._counts["backpressure_waits"],
            send_blocked_connections=sum(
                1 for c in self._connections
                if c.blocked_since is not None and now - c.blocked_since > 0.1),
            slow_disconnects=self._counts["slow_disconnects"],
            protocol_errors=dict(self._errors),
        )

    async def _serve_metrics(self,
                             listener: anyio.abc.Listener[anyio.abc.SocketStream]) -> None:
        from .metrics import serve_metrics

        with self._metrics_scope:
            await serve_metrics(listener,
                                lambda: prometheus_text(self.statistics(), self.store),
                                lambda: not self._stopping)


def prometheus_text(s: ServiceStatistics, store: Store | None = None) -> str:
    """The statistics as Prometheus text (``_write/metrics.py``, imported when first
    asked: a command that serves no metrics never loads the Prometheus client)."""
    from .metrics import prometheus_text as text

    return text(s, store)
