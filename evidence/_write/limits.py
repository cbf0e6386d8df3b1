"""What a writer is given: its bounds (``WriterLimits``) and its named fault points
(``WriterHooks``).

Both are read on the two sides of the writer, the queue that batches submissions
(``writer.py``) and the transaction that commits a batch (``commit.py``), so they live
below both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["WriterHooks", "WriterLimits"]


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
