"""One client's connection to the service, and what its reads and answers are held to.

``ClientConnection`` is a connection's state: its stream, its outbox of answers (written by
``send_loop``, never blocking a request task), its bound on requests in flight and its
cancel scopes. ``ReadBudget`` is the bytes read from every client socket and not yet
committed, service-wide; ``MeteredStream`` is a socket as its frame reader sees it, each
read waiting for room in that budget. ``Merge`` gathers submits read back to back into one
group for the writer. The service (``service.py``) owns the connections; these are the
parts each of them is made of, apart so that the service reads as its protocol.
"""

from __future__ import annotations

import collections
import itertools
import logging
import time

import anyio
import anyio.abc

from .._errors import CommitError, MessageError
from .._model.messages import Message
from .limits import ServiceLimits
from .wire import PEER_GONE, ErrorFrame

__all__ = ["ClientConnection", "Merge", "MeteredStream", "ReadBudget", "error_frame"]

log = logging.getLogger("evidence.service")

_CHUNK = 64 * 1024  # bytes one socket read takes at most


class ReadBudget:
    """Bytes read from client sockets and not yet released (committed, or discarded),
    service-wide, taken as they arrive.

    A connection waits for room before each socket read while the budget is spent. Frames
    in reception never wait on each other for good: the connection receiving the oldest
    unfinished frame may go over by up to one frame, and a complete frame needs no more
    room to commit, so room always comes back.
    """

    def __init__(self, total: int, overdraft: int) -> None:
        self.total = total
        self.overdraft = overdraft
        self.used = 0
        self._released = anyio.Event()
        self._receiving: dict[ClientConnection, int] = {}  # connection -> its frame's ticket
        self._tickets = itertools.count()

    def frame_started(self, conn: ClientConnection) -> None:
        self._receiving[conn] = next(self._tickets)

    def frame_done(self, conn: ClientConnection) -> None:
        self._receiving.pop(conn, None)

    def _may_read(self, conn: ClientConnection) -> bool:
        if self.used < self.total:
            return True
        ticket = self._receiving.get(conn)
        return (ticket is not None and self.used < self.total + self.overdraft
                and ticket == min(self._receiving.values()))

    async def room(self, conn: ClientConnection) -> bool:
        """Wait until ``conn`` may read from its socket; whether it had to wait."""
        waited = False
        while not self._may_read(conn):
            waited = True
            if self._released.is_set():
                self._released = anyio.Event()
            await self._released.wait()
        return waited

    def take(self, n: int) -> None:
        self.used += n

    def release(self, n: int) -> None:
        if n:
            self.used -= n
            self._released.set()


class MeteredStream:
    """A connection's socket as its FrameReader sees it: each read waits for room in the
    read budget and counts what arrived; inside a frame's body, reads share the frame's
    ``body_timeout`` (time waiting for room is not counted: that wait is ours, not the
    client's)."""

    def __init__(self, conn: ClientConnection, budget: ReadBudget, counts: collections.Counter[str]
                 ) -> None:
        self._conn = conn
        self._budget = budget
        self._counts = counts

    async def receive(self, max_bytes: int = _CHUNK) -> bytes:
        conn = self._conn
        if await self._budget.room(conn):
            self._counts["backpressure_waits"] += 1
        n = min(max_bytes, _CHUNK)
        if conn.body_time_left is None:
            data = await conn.stream.receive(n)
        else:
            started = time.monotonic()
            with anyio.fail_after(max(conn.body_time_left, 0.0)):
                data = await conn.stream.receive(n)
            conn.body_time_left -= time.monotonic() - started
        self._budget.take(len(data))
        conn.held += len(data)
        return data


class ClientConnection:
    """One client connection: its stream, outbox, in-flight bound and cancel scopes."""

    def __init__(self, stream: anyio.abc.ByteStream, limits: ServiceLimits, peer: str,
                 identity: str = "") -> None:
        self.stream = stream
        self.peer = peer
        self.identity = identity  # who it counts against in max_connections_per_peer
        self.client = ""  # the name in its hello
        self.limits = limits
        self.scope = anyio.CancelScope()  # the whole connection (cancelled past drain_timeout)
        self.read_scope = anyio.CancelScope()  # the reader (cancelled on stop, or by the sender)
        self.slots = anyio.Semaphore(limits.connection_in_flight, fast_acquire=True)
        self.in_flight = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._outbox: collections.deque[tuple[bytes, bool]] = collections.deque()
        self._wake = anyio.Event()
        self._closed = False
        self.dead = False  # the sender gave up; answers are dropped
        self.slow = False
        self.blocked_since: float | None = None
        self.held = 0  # bytes of the read budget this connection holds
        self.body_time_left: float | None = None  # while a frame's body is being read
        self.hello_scope = anyio.CancelScope()  # cancelled to drop it before its hello
        self.tls = False  # the TLS handshake is due before the hello
        self.role = ""  # the hello's: "worker" hands the connection to the coordinator
        self.tcp = False  # over TCP (a worker host, say), not the Unix socket
        self.host = ""  # its worker host identity (Service ``hosts``), once it said hello
        self.counted = False  # it holds a place in max_connections and its peer's share

    def push(self, data: bytes, *, slot: bool) -> None:
        """Queue an answer without blocking; ``slot``: it releases a request slot when sent."""
        if self.dead:
            if slot:
                self.slots.release()
            return
        self._outbox.append((data, slot))
        self._wake.set()

    def close_outbox(self) -> None:
        self._closed = True
        self._wake.set()

    def request_started(self) -> None:
        if self.in_flight == 0:
            self._idle = anyio.Event()
        self.in_flight += 1

    def request_done(self, n: int = 1) -> None:
        self.in_flight -= n
        if self.in_flight == 0:
            self._idle.set()

    async def wait_requests_done(self) -> None:
        await self._idle.wait()

    async def send_loop(self) -> None:
        """Write queued answers, many per write; drop the connection if it stops draining."""
        try:
            while True:
                if not self._outbox:
                    if self._closed:
                        return
                    self._wake = anyio.Event()
                    await self._wake.wait()
                    continue
                frames, self._outbox = self._outbox, collections.deque()
                self.blocked_since = time.monotonic()
                with anyio.fail_after(self.limits.send_timeout):
                    await self.stream.send(b"".join(data for data, _ in frames))
                self.blocked_since = None
                for _ in range(sum(slot for _, slot in frames)):
                    self.slots.release()
        except TimeoutError:
            self.slow = True
            log.warning("%s: dropped: its answers could not be written for %.0f s (it does "
                        "not read them); it will redeliver what it has not seen acked",
                        self.peer, self.limits.send_timeout,
                        extra={"event": "service.slow_client_dropped"})
        except PEER_GONE:
            pass
        self.dead = True
        self.blocked_since = None
        for _, slot in self._outbox:
            if slot:
                self.slots.release()
        self._outbox.clear()
        self.read_scope.cancel()
        await self.stream.aclose()


class Merge:
    """Submits read back to back, to hand to the writer as one group."""

    MAX_REQUESTS = 64
    MAX_MESSAGES = 256

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.requests: list[tuple[int, list[Message]]] = []
        self.messages = 0
        self.reserved = 0

    def add(self, request_id: int, messages: list[Message], reserved: int) -> None:
        self.requests.append((request_id, messages))
        self.messages += len(messages)
        self.reserved += reserved

    def full(self) -> bool:
        return len(self.requests) >= self.MAX_REQUESTS or self.messages >= self.MAX_MESSAGES


def error_frame(exc: Exception, request_id: int) -> ErrorFrame:
    if isinstance(exc, MessageError):
        return ErrorFrame(code="invalid_message", message=str(exc), id=request_id,
                          hint=exc.hint)
    if isinstance(exc, CommitError):
        return ErrorFrame(code="commit_failed", message=str(exc), id=request_id,
                          hint=exc.hint, retryable=True)
    return ErrorFrame(code="writer_closed", message=str(exc), id=request_id, retryable=True)
