"""The bounds of the write path, each explicit: a writer's (``WriterLimits``) and its
named fault points (``WriterHooks``), and a service's (``ServiceLimits``).

Each is read by several parts: a writer's by the queue that batches submissions
(``writer.py``) and the transaction that commits a batch (``commit.py``); a service's by
the service, its connections (``connection.py``) and its gate (``admission.py``). So they
live below all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ServiceLimits", "WriterHooks", "WriterLimits"]


@dataclass(frozen=True, kw_only=True)
class WriterLimits:
    """How much the writer queues and batches. Every bound is explicit."""

    queue_size: int = 10_000  # submissions (messages or groups) waiting; full: submit waits
    max_batch_messages: int = 500
    max_batch_bytes: int = 16 * 1024 * 1024
    max_batch_delay: float = 0.0  # seconds to linger for more messages; 0: group commit only
    busy_retries: int = 5  # BEGIN IMMEDIATE attempts beyond the first, each after busy_timeout
    verify_artifacts: bool = False  # re-hash referenced artifacts (not just size) on validation
    # A checkpoint once the WAL holds this many bytes of frames (4 MiB at most under
    # sync=normal), and the WAL truncated past it: docs/store.md, "The write path".
    checkpoint_wal_bytes: int = 128 * 1024 * 1024
    # A server database (PostgreSQL): while no batch comes for this long, the write
    # connection is checked, so that a session the server ended is made again, and the
    # writer lock taken again, at once (Store.check_connection). None: never.
    idle_check: float | None = 1.0


@dataclass(frozen=True, kw_only=True)
class WriterHooks:
    """Named fault points, for tests that crash the writer at exact places."""

    # batch_seq, inside the transaction once its messages are applied (on the event loop's
    # thread for a local store), before its payloads' fsync and COMMIT:
    after_apply: Callable[[int], None] | None = None
    # batch_seq, inside the transaction right before COMMIT (its payloads synced):
    before_commit: Callable[[int], None] | None = None
    after_commit: Callable[[int], None] | None = None  # batch_seq, before any ack resolves
    # The time a batch records (its received_at and committed_at, as now_text() spells it):
    # two writers given the same clock and the same batches write the same bytes (the
    # cross-backend export test); every writer that is not a test uses the system clock.
    batch_time: Callable[[], str] | None = None


@dataclass(frozen=True, kw_only=True)
class ServiceLimits:
    """How much the service reads ahead of its writer, and how long it waits on clients."""

    max_frame_bytes: int = 16 * 1024 * 1024  # one frame (a group of messages)
    max_hello_bytes: int = 8 * 1024  # the only frame read before authentication
    max_connections: int = 256  # authenticated connections
    max_connections_per_peer: int = 64  # of those, from one process or address (peer_of)
    max_unauthenticated: int = 64  # connections that have not said hello yet
    max_in_flight: int = 4096  # requests read and unanswered, all connections together
    max_pending_bytes: int = 64 * 1024 * 1024  # bytes read, until their request commits
    connection_in_flight: int = 1024  # requests read and unanswered, one connection
    send_timeout: float = 30.0  # a connection whose answers cannot be written is dropped
    handshake_timeout: float = 10.0  # from connect to a valid hello
    body_timeout: float = 30.0  # a frame's body, from its header (time spent sending it)
    idle_timeout: float = 600.0  # an authenticated connection with nothing to do is closed
    drain_timeout: float = 30.0  # on stop: time for in-flight answers to reach clients
