"""What the writer answers: an ``Ack`` per message, and its ``WriterStatistics``.

Pure values, shared by the writer, the writer service's wire protocol and
``evidence.client``: a producer that only submits messages (a worker process) imports
these, never the writer, the store or SQLite.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["Ack", "WriterStatistics"]


class Ack(msgspec.Struct, frozen=True, kw_only=True):
    """What became of one message. ``committed`` and ``duplicate`` are durable."""

    message_id: str
    status: Literal["committed", "duplicate", "conflict", "rejected"]
    log_index: int | None = None
    batch_seq: int | None = None
    reason: str | None = None


class WriterStatistics(msgspec.Struct, frozen=True, kw_only=True):
    queue_depth: int
    oldest_pending_age: float  # seconds the oldest unacknowledged message has waited
    batches: int
    batch_sizes: dict[str, int]  # histogram: bucket upper bound -> batches
    commit_latency_p50: float
    commit_latency_p99: float
    commit_latency_max: float
    busy_retries: int
    committed: int
    duplicates: int
    conflicts: int
    rejections: int
    commit_errors: int
    checkpoints: int
    checkpoint_errors: int
    wal_truncations: int
    tree_size: int
    reconnects: int = 0  # connections to a database server made again after one was lost
