"""What the writer answers: an ``Ack`` per message, and its ``WriterStatistics``.

Pure values, shared by the writer, the writer service's wire protocol and
``evidence.client``: a producer that only submits messages (a worker process) imports
these, never the writer, the store or SQLite.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["Ack", "Recorded", "WriterStatistics"]


class Ack(msgspec.Struct, frozen=True, kw_only=True):
    """What became of one message. ``committed`` and ``duplicate`` are durable."""

    message_id: str
    status: Literal["committed", "duplicate", "conflict", "rejected"]
    log_index: int | None = None
    batch_seq: int | None = None
    reason: str | None = None


class Recorded(msgspec.Struct, frozen=True, kw_only=True):
    """What committed batches recorded, counted by the writer after each COMMIT returned (a
    redelivery acknowledged ``duplicate`` is not counted again), so the counts agree with
    the store: what a crawl's metrics report as done is what the store holds."""

    attempts: dict[str, int] = {}  # fetch attempts, by outcome
    settled: dict[str, int] = {}  # frontier settlements, by the state the URL entered
    renders: dict[str, int] = {}  # renders, by outcome
    render_seconds: dict[str, int] = {}  # histogram: bucket upper bound -> renders
    render_seconds_sum: float = 0.0
    fetched_bytes: int = 0  # response bodies of the attempts, as received
    recorded_bytes: int = 0  # the attempts' and renders' payloads (a repeat counts again)


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
    commit_latencies: dict[str, int] = {}  # histogram: bucket upper bound (s) -> batches
    commit_latency_sum: float = 0.0  # seconds, all batches
    recorded: Recorded = msgspec.field(default_factory=Recorded)
