"""The serialized writer: the one place write transactions begin and end.

    async with Writer(store) as writer:
        ack = await writer.submit(message)

``submit`` puts the message on a bounded queue (a full queue makes it wait: backpressure)
and returns only after the message's batch has committed. One writer task drains the queue
into batches bounded by count, bytes and linger time, and commits each batch in a worker
thread: ``BEGIN IMMEDIATE``; per message a SAVEPOINT, ledger dedup, validation, appends
and the projection; the commit-log row; ``COMMIT``; then every ack resolves.

Invariants (DESIGN.md "Writer rules"):
  - nothing is acked before COMMIT returned, and every committed message is acked;
  - a bad message fails alone (its savepoint is rolled back and it is quarantined whole);
  - an error at COMMIT means "outcome unknown": the writer reopens the database and reads
    the commit log to learn whether the batch is there, and acks from that, never guessing;
  - SQLITE_BUSY at BEGIN gets a bounded number of retries, then the batch fails.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import anyio
import apsw
import msgspec

from . import _apply
from ._errors import CommitError, MessageError, WriterClosedError
from ._log import entry_hash, load_head
from ._merkle import leaf_hash
from ._messages import (
    MAX_MESSAGE_BYTES,
    Message,
    canonical_encode,
    decode_message,
    now_text,
    payload_hash,
)
from ._store import Store, map_sqlite_errors

__all__ = ["Ack", "Writer", "WriterLimits", "WriterStatistics"]

log = logging.getLogger("evidence.writer")


@dataclass(frozen=True, kw_only=True)
class WriterLimits:
    """How much the writer queues and batches. Every bound is explicit."""

    queue_size: int = 10_000  # submissions (messages or groups) waiting; full: submit waits
    max_batch_messages: int = 500
    max_batch_bytes: int = 16 * 1024 * 1024
    max_batch_delay: float = 0.0  # seconds to linger for more messages; 0: group commit only
    busy_retries: int = 5  # BEGIN IMMEDIATE attempts beyond the first, each after busy_timeout
    verify_artifacts: bool = False  # re-hash referenced artifacts (not just size) on validation
    checkpoint_wal_bytes: int = 32 * 1024 * 1024  # past this, checkpoint after a commit


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


_BUCKETS = (1, 10, 50, 100, 500, 1000, 5000, math.inf)


@dataclass(eq=False)
class _Pending:
    message: Message
    encoded: bytes
    payload_hash: str
    submitted_at: float
    keys: dict[str, str]  # fetch keys of its URLs, computed at submit, off the commit thread
    done: anyio.Event = field(default_factory=anyio.Event)
    ack: Ack | None = None
    error: BaseException | None = None


@dataclass(frozen=True, kw_only=True)
class WriterHooks:
    """Named fault points, for tests that crash the writer at exact places."""

    before_commit: Callable[[int], None] | None = None  # batch_seq, inside the transaction
    after_commit: Callable[[int], None] | None = None  # batch_seq, before any ack resolves


class Writer:
    """The one serialized writer of a store. Use as ``async with Writer(store) as w``."""

    def __init__(self, store: Store, *, limits: WriterLimits | None = None,
                 hooks: WriterHooks | None = None) -> None:
        self.store = store
        self.limits = limits or WriterLimits()
        self._hooks = hooks or WriterHooks()
        self._send, self._receive = anyio.create_memory_object_stream[list[_Pending]](
            self.limits.queue_size)
        self._unacked: collections.deque[_Pending] = collections.deque()
        self._failure: BaseException | None = None
        self._closed = False
        self._task_group: anyio.abc.TaskGroup | None = None
        self._latencies: collections.deque[float] = collections.deque(maxlen=2048)
        self._counts = collections.Counter[str]()
        self._histogram = dict.fromkeys(_BUCKETS, 0)
        self._interner = _apply.Interner()
        with map_sqlite_errors(store.db_path):
            self._head = load_head(store.connection)

    # --- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Writer:
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._task_group.start_soon(self._run)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: object) -> bool | None:
        """Graceful close: stop accepting, drain and commit what is queued, then return.

        An ordinary exception from the ``async with`` body propagates as itself (after the
        drain), not wrapped in an exception group; cancellation is left to the task group.
        """
        self._closed = True
        self._send.close()
        assert self._task_group is not None
        if isinstance(exc, Exception):
            await self._task_group.__aexit__(None, None, None)
            return None
        return await self._task_group.__aexit__(exc_type, exc, tb)  # type: ignore[arg-type]

    # --- submitting --------------------------------------------------------------------

    async def submit(self, message: Message) -> Ack:
        """Queue one message and wait until its batch has committed; return its ack.

        Raises ``CommitError`` when the batch did not commit (redeliver), and
        ``WriterClosedError`` after close or an unrecoverable failure.
        """
        [ack] = await self.submit_group([message])
        return ack

    async def submit_group(self, messages: Sequence[Message]) -> list[Ack]:
        """Submit messages that must commit in one transaction (each still fails alone).

        A crawler's page result (its attempt, its links, its frontier mark) is a group, so
        a crash can never leave a page marked done without its links.
        """
        if self._closed or self._failure is not None:
            raise WriterClosedError("the writer is closed", cause=self._failure)
        now = time.monotonic()
        group = [self._prepare(message, now) for message in messages]
        if not group:
            return []
        self._unacked.extend(group)
        try:
            await self._send.send(group)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            for pending in group:
                pending.done.set()
            raise WriterClosedError("the writer is closed", cause=self._failure) from exc
        for pending in group:
            await pending.done.wait()
        for pending in group:
            if pending.error is not None:
                raise pending.error
        return [pending.ack for pending in group]  # type: ignore[misc]

    @staticmethod
    def _prepare(message: Message, now: float) -> _Pending:
        # msgspec validates constraints only when decoding, so a message built in Python is
        # checked by a round trip through the strict decoder: whatever is committed must be
        # exactly what decode_message accepts (verify re-decodes every ledger entry).
        try:
            encoded = canonical_encode(message)
        except (TypeError, ValueError, OverflowError, UnicodeEncodeError) as exc:
            raise MessageError(f"message {getattr(message, 'message_id', '?')!r} cannot be "
                               f"encoded: {exc}", hint="fix the producer") from exc
        if len(encoded) > MAX_MESSAGE_BYTES:
            raise MessageError(
                f"message {message.message_id} encodes to {len(encoded)} bytes, over the "
                f"limit of {MAX_MESSAGE_BYTES}", message_id=message.message_id,
                hint="store large payloads in the artifact store and reference them")
        decode_message(encoded)  # raises MessageError naming the field
        return _Pending(message, encoded, payload_hash(encoded), now,
                        _apply.fetch_keys(message))

    async def submit_bytes(self, data: bytes, *,
                           format: Literal["msgpack", "json"] = "msgpack") -> Ack:
        """Decode strictly (a defect raises ``MessageError``, nothing written), then submit."""
        return await self.submit(decode_message(data, format=format))

    # --- the writer task ---------------------------------------------------------------

    async def _run(self) -> None:
        async with self._receive:
            batch: list[_Pending] = []
            while True:
                if not batch:
                    try:
                        first = await self._receive.receive()
                    except anyio.EndOfStream:
                        return
                    batch = await self._collect(first)
                batch = await self._commit(batch)

    async def _collect(self, first: list[_Pending]) -> list[_Pending]:
        """Take what is queued, up to the bounds; linger up to max_batch_delay for more.

        Groups are taken whole, so a group may carry a batch a little over its bounds.
        """
        batch = list(first)
        size = sum(len(p.encoded) for p in first)
        deadline = time.monotonic() + self.limits.max_batch_delay
        while len(batch) < self.limits.max_batch_messages and size < self.limits.max_batch_bytes:
            try:
                group = self._receive.receive_nowait()  # 3.6x faster than async-for batching
            except anyio.WouldBlock:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                with anyio.move_on_after(remaining):
                    group = await self._receive.receive()
                    batch.extend(group)
                    size += sum(len(p.encoded) for p in group)
                continue
            except anyio.EndOfStream:
                break
            batch.extend(group)
            size += sum(len(p.encoded) for p in group)
        return batch

    def _collect_nowait(self) -> list[_Pending]:
        """What is queued right now, up to the bounds, without yielding to other tasks."""
        batch: list[_Pending] = []
        size = 0
        while len(batch) < self.limits.max_batch_messages and size < self.limits.max_batch_bytes:
            try:
                group = self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
            batch.extend(group)
            size += sum(len(p.encoded) for p in group)
        return batch

    async def _commit(self, batch: list[_Pending]) -> list[_Pending]:
        """Commit one batch; return the next one, already taken from the queue.

        The next batch is taken *before* this one's acks resolve, so the commit thread starts
        on it while the event loop wakes this batch's producers (a pipeline: without it the
        commit thread sat idle about a third of the time).
        """
        started = time.monotonic()
        following: list[_Pending] = []
        try:
            acks = await anyio.to_thread.run_sync(self._commit_batch, batch)
        except CommitError as exc:
            self._counts["commit_errors"] += 1
            for pending in batch:
                pending.error = exc
        except BaseException as exc:  # unrecoverable: fail this batch and every later submit
            self._failure = exc
            error = WriterClosedError(f"the writer failed: {exc}", cause=exc)
            for pending in batch:
                pending.error = error
            self._fail_queued(error)
            raise
        else:
            self._record(len(batch), time.monotonic() - started, acks)
            for pending, ack in zip(batch, acks, strict=True):
                pending.ack = ack
            following = self._collect_nowait()
        finally:
            for pending in batch:
                pending.done.set()
            while self._unacked and self._unacked[0].done.is_set():
                self._unacked.popleft()
        return following

    def _fail_queued(self, error: BaseException) -> None:
        self._send.close()
        while True:
            try:
                group = self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return
            for pending in group:
                pending.error = error
                pending.done.set()

    # --- one batch, in a worker thread -------------------------------------------------

    def _commit_batch(self, batch: list[_Pending]) -> list[Ack]:
        committed = False
        try:
            acks, committed = self._write_batch(batch)
            return acks
        finally:
            self._interner.batch_done(committed)  # cached ids survive only a clean COMMIT

    def _write_batch(self, batch: list[_Pending]) -> tuple[list[Ack], bool]:
        store = self.store
        conn = store.connection
        head = self._head
        batch_seq = head.batch_seq + 1
        tree = head.tree.copy()
        first_index = tree.size
        self._begin(conn)
        wrote = False
        try:
            received_at = now_text()
            acks = []
            for pending in batch:
                ack, leaf, wrote_row = self._apply_one(conn, pending, tree.size, batch_seq,
                                                       received_at)
                if leaf is not None:
                    tree.append(leaf)
                wrote = wrote or wrote_row
                acks.append(ack)
            if not wrote:  # only duplicates: nothing to commit, no outcome to doubt
                self._rollback(conn)
                return acks, False
            root = tree.root()
            chain = entry_hash(head.entry_hash, batch_seq, first_index, tree.size, root,
                               received_at)
            conn.execute(
                "INSERT INTO commit_log (batch_seq, committed_at, first_index, tree_size, "
                "root, frontier, prev_hash, entry_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (batch_seq, received_at, first_index, tree.size, root, tree.to_bytes(),
                 head.entry_hash, chain))
            if self._hooks.before_commit:
                self._hooks.before_commit(batch_seq)
        except apsw.Error as exc:  # an I/O or disk-full error before COMMIT: rolled back
            self._rollback(conn)
            raise CommitError(
                f"batch {batch_seq} failed before commit ({exc}); nothing of it was written",
                hint="redeliver the messages; if the disk is full, free space first",
                batch_seq=batch_seq, sqlite_code=getattr(exc, "extendedresult", None),
            ) from exc
        except BaseException:
            self._rollback(conn)
            raise
        try:
            conn.execute("COMMIT")
        except apsw.Error as exc:
            return self._recover(batch_seq, acks, exc), False
        self._head = type(head)(tree, batch_seq, chain)
        if self._hooks.after_commit:
            self._hooks.after_commit(batch_seq)
        self._checkpoint(conn)
        return acks, True

    def _checkpoint(self, conn: apsw.Connection) -> None:
        """Keep the WAL bounded: a passive checkpoint once it is large, then a truncate.

        SQLite's own auto-checkpoint copies frames back but never shrinks the file, and a
        long reader stops it from restarting the WAL, which then grows. Once a passive
        checkpoint has copied every frame (no reader holds an old snapshot), a TRUNCATE
        resets the file to zero; with a zero busy timeout it never waits on a reader.
        """
        if self.store.wal_size() <= self.limits.checkpoint_wal_bytes:
            return
        try:
            frames, copied = conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
            self._counts["checkpoints"] += 1
            if frames == copied:
                conn.set_busy_timeout(0)
                try:
                    conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
                    self._counts["wal_truncations"] += 1
                finally:
                    conn.set_busy_timeout(self.store.busy_timeout_ms)
        except apsw.BusyError:
            pass  # a reader is still using the WAL: the next commit tries again
        except apsw.Error as exc:
            # The batch is committed and must be acked; a checkpoint that fails (an I/O error,
            # a full disk) leaves the WAL as it was, which is safe. Count it; retry later.
            self._counts["checkpoint_errors"] += 1
            log.warning("WAL checkpoint failed after batch commit: %s", exc)

    def _rollback(self, conn: apsw.Connection) -> None:
        """Roll back the open transaction; a connection that cannot is replaced."""
        try:
            if not conn.get_autocommit():
                conn.execute("ROLLBACK")
        except apsw.Error:
            self.store.reopen_connection()

    def _begin(self, conn: apsw.Connection) -> None:
        """BEGIN IMMEDIATE with a bounded retry on SQLITE_BUSY (each try waits busy_timeout)."""
        for attempt in range(self.limits.busy_retries + 1):
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except apsw.BusyError as exc:
                self._counts["busy_retries"] += 1
                if attempt == self.limits.busy_retries:
                    raise CommitError(
                        f"the database stayed locked through {attempt + 1} attempts to begin "
                        "a write transaction; nothing was written",
                        hint="another process is writing this store; stop it",
                        sqlite_code=exc.extendedresult) from exc
                time.sleep(min(0.05 * 2**attempt, 1.0))

    def _recover(self, batch_seq: int, acks: list[Ack], exc: apsw.Error) -> list[Ack]:
        """COMMIT failed: outcome unknown. Reopen and ask the commit log what happened."""
        self.store.reopen_connection()  # raises StoreError if the database is gone
        conn = self.store.connection
        committed = conn.execute(
            "SELECT 1 FROM commit_log WHERE batch_seq = ?", (batch_seq,)).fetchall()
        self._head = load_head(conn)
        if committed:
            return acks
        raise CommitError(
            f"batch {batch_seq} did not commit ({exc}); none of its messages were acked",
            hint="redeliver the messages; if the disk is full, free space first",
            batch_seq=batch_seq, sqlite_code=getattr(exc, "extendedresult", None))

    def _apply_one(self, conn: apsw.Connection, pending: _Pending, log_index: int,
                   batch_seq: int, received_at: str) -> tuple[Ack, bytes | None, bool]:
        """Dedup, validate and append one message; returns (ack, new leaf, wrote anything)."""
        message = pending.message
        mid = message.message_id
        conn.execute("SAVEPOINT message")
        try:
            leaf = leaf_hash(pending.encoded)
            inserted = conn.execute(
                "INSERT INTO ingest_ledger (log_index, message_id, kind, payload_hash, "
                "leaf_hash, payload, batch_seq, received_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (message_id) DO NOTHING RETURNING 1",
                (log_index, mid, type(message).__struct_config__.tag, pending.payload_hash,
                 leaf, pending.encoded, batch_seq, received_at)).fetchall()
            if inserted:
                _apply.apply(conn, self.store, message, log_index, self._interner,
                             pending.keys, verify_artifacts=self.limits.verify_artifacts)
        except _apply.Rejected as exc:
            self._undo_message(conn)
            if exc.duplicate:
                return Ack(message_id=mid, status="duplicate", reason=str(exc)), None, False
            status: Literal["conflict", "rejected"] = "conflict" if exc.conflict else "rejected"
            self._quarantine(conn, pending, status, str(exc), received_at)
            return Ack(message_id=mid, status=status, reason=str(exc)), None, True
        except apsw.ConstraintError as exc:
            self._undo_message(conn)
            reason = f"violates a store constraint: {exc}"
            self._quarantine(conn, pending, "rejected", reason, received_at)
            return Ack(message_id=mid, status="rejected", reason=reason), None, True
        except BaseException:
            self._undo_message(conn)
            raise
        if not inserted:  # a redelivery: the ledger decides duplicate or conflict
            self._undo_message(conn)
            return self._redelivered(conn, pending, received_at)
        conn.execute("RELEASE message")
        self._interner.message_done(keep=True)
        ack = Ack(message_id=mid, status="committed", log_index=log_index, batch_seq=batch_seq)
        return ack, leaf, True

    def _redelivered(self, conn: apsw.Connection, pending: _Pending,
                     received_at: str) -> tuple[Ack, bytes | None, bool]:
        """A message id the ledger already has: same payload hash is a duplicate (acked with
        the original position); another hash is a conflict, quarantined whole (rule 4)."""
        mid = pending.message.message_id
        stored_hash, stored_index = conn.execute(
            "SELECT payload_hash, log_index FROM ingest_ledger WHERE message_id = ?",
            (mid,)).fetchall()[0]
        if stored_hash == pending.payload_hash:
            return Ack(message_id=mid, status="duplicate", log_index=stored_index), None, False
        reason = (f"message_id {mid} is already recorded with payload hash "
                  f"{stored_hash}; this delivery hashes to {pending.payload_hash}")
        self._quarantine(conn, pending, "conflict", reason, received_at)
        return Ack(message_id=mid, status="conflict", reason=reason), None, True

    def _undo_message(self, conn: apsw.Connection) -> None:
        """Roll back one message's savepoint: its rows, and the ids it cached, are gone."""
        conn.execute("ROLLBACK TO message")
        conn.execute("RELEASE message")
        self._interner.message_done(keep=False)

    @staticmethod
    def _quarantine(conn: apsw.Connection, pending: _Pending, code: str, reason: str,
                    received_at: str) -> None:
        conn.execute(
            "INSERT INTO quarantine (received_at, message_id, kind, reason_code, reason, "
            "payload_hash, payload) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (received_at, pending.message.message_id,
             type(pending.message).__struct_config__.tag, code, reason,
             pending.payload_hash, pending.encoded))

    # --- metrics -------------------------------------------------------------------------

    def _record(self, size: int, latency: float, acks: list[Ack]) -> None:
        self._latencies.append(latency)
        self._histogram[next(b for b in _BUCKETS if size <= b)] += 1
        self._counts["batches"] += 1
        for ack in acks:
            self._counts[ack.status] += 1

    def statistics(self) -> WriterStatistics:
        """A snapshot of queue, batch and outcome metrics (DESIGN.md writer rule 10)."""
        while self._unacked and self._unacked[0].done.is_set():
            self._unacked.popleft()
        oldest = time.monotonic() - self._unacked[0].submitted_at if self._unacked else 0.0
        ordered = sorted(self._latencies)

        def quantile(q: float) -> float:
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0

        return WriterStatistics(
            queue_depth=self._send.statistics().current_buffer_used,
            oldest_pending_age=oldest,
            batches=self._counts["batches"],
            batch_sizes={("inf" if b == math.inf else str(b)): n
                         for b, n in self._histogram.items()},
            commit_latency_p50=quantile(0.5),
            commit_latency_p99=quantile(0.99),
            commit_latency_max=ordered[-1] if ordered else 0.0,
            busy_retries=self._counts["busy_retries"],
            committed=self._counts["committed"],
            duplicates=self._counts["duplicate"],
            conflicts=self._counts["conflict"],
            rejections=self._counts["rejected"],
            commit_errors=self._counts["commit_errors"],
            checkpoints=self._counts["checkpoints"],
            checkpoint_errors=self._counts["checkpoint_errors"],
            wal_truncations=self._counts["wal_truncations"],
            tree_size=self._head.tree.size,
        )
