"""The serialized writer: the one place write transactions begin and end.

    async with Writer(store) as writer:
        ack = await writer.submit(message)

``submit`` puts the message on a bounded queue (a full queue makes it wait: backpressure)
and returns only after the message's batch has committed. One writer task drains the queue
into batches bounded by count, bytes and linger time and commits each: on the event loop's
own thread when every step is local (SQLite, payloads in local files), else on the commit
thread (one dedicated thread, fed by a thread-safe queue, while the event loop goes on
waiting for the server); then every ack resolves (one wakeup per submitted group).

The writer is in parts, each a module of ``_write/``:

    writer.py      submitting (encode, check, queue), the writer task (batches, acks,
                   pipelining, lingering), statistics
    pending.py     one submitted message on its way (Pending), and what its group waits on
    committers.py  where a batch runs: the commit thread, or inline with a Tail of fsyncs
    commit.py      one batch's transaction (Transactions): BEGIN, apply, commit log, COMMIT
    recovery.py    a COMMIT that failed or a server that went: what the batch left
    limits.py      WriterLimits and WriterHooks

Invariants (design rules 1-13, docs/design.md):
  - nothing is acked before COMMIT returned, and every committed message is acked;
  - a bad message fails alone (its savepoint is rolled back and it is quarantined whole);
  - an error at COMMIT means "outcome unknown": the writer reopens the database and reads
    the commit log to learn whether the batch is there, and acks from that, never guessing;
  - except after a failed fsync (at COMMIT or in a checkpoint): then reads are no evidence
    of what is on the disk, so nothing of that batch is acked, the store is marked for a
    resync and the writer stops (``_store.resync``; docs/design.md, "The writer");
  - SQLITE_BUSY at BEGIN gets a bounded number of retries, then the batch fails;
  - on a server database (PostgreSQL) a lost connection is made again with bounded backoff
    (``recovery.py``), and the writer lock taken again before anything is written (if a
    standby took it meanwhile, the writer stops). Nothing is acked before that. An idle
    writer checks its connection every ``idle_check`` seconds, so a session ended while
    idle is made again at once.

Where the time goes and what was measured: docs/benchmarks.md ("Where the time goes").
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Literal

import anyio
import sniffio

from .._errors import CommitError, MessageError, SyncError, WriterClosedError
from .._model.acks import Ack, WriterStatistics
from .._model.messages import Message, decode_message, encode_checked, payload_hash
from .._store.db import Store
from .._store.log import load_head
from . import apply as _apply
from .commit import Transactions
from .committers import CommitInline, CommitThread, Job, Tail
from .limits import WriterHooks, WriterLimits
from .pending import EventWaiter, Pending, Waiter, resolve
from .tally import COMMIT_SECONDS, Histogram, Tally

__all__ = ["Writer"]

log = logging.getLogger("evidence.writer")

_BUCKETS = (1, 10, 50, 100, 500, 1000, 5000, math.inf)
# URLs whose fetch keys the event loop remembers (links repeat): ~250 bytes each, so
# 20,000 hold ~5 MB; the memo is cleared when full (flat memory, docs/benchmarks.md).
_URL_KEYS_LIMIT = 20_000

# A submission on the queue: (encoded bytes, messages, flush: commit without lingering).
_Group = tuple[int, list[Pending], bool]


class Writer:
    """The one serialized writer of a store. Use as ``async with Writer(store) as w``."""

    def __init__(self, store: Store, *, limits: WriterLimits | None = None,
                 hooks: WriterHooks | None = None, commit_thread: bool | None = None) -> None:
        store.check_writable()
        store.check_synced()  # a store whose fsync failed is resynced by opening it again
        self.store = store
        self.limits = limits or WriterLimits()
        self._counts = collections.Counter[str]()
        # The write transactions, and the state they carry from batch to batch (the head
        # of the log, read here before anything that must be closed exists).
        self._transactions = Transactions(store, self.limits, hooks or WriterHooks(),
                                          self._counts)
        # Queue items are groups with their encoded size: (bytes, messages).
        self._send, self._receive = anyio.create_memory_object_stream[_Group](
            self.limits.queue_size)
        self._unacked: collections.deque[Pending] = collections.deque()
        # Lingering for a producer that says when nothing more is coming (``flush``): a
        # batch is committing (a flush said then is no news: the batch after it is taken
        # when it ends); the producer has said so before; what was queued when a batch
        # ended, held to be collected with a linger once that batch's acks are out.
        self._busy = False
        self._producer_flushes = False
        self._carry: _Group | None = None
        self._failure: BaseException | None = None
        self._closed = False
        self._task_group: anyio.abc.TaskGroup | None = None
        self._committer: CommitThread | CommitInline | None = None
        # Batches commit on a thread of their own where a step may wait on a server (the
        # event loop goes on meanwhile), else on the event loop's thread (CommitInline).
        # ``commit_thread=True``: always on the thread (a test that holds a commit open).
        self._commit_thread = (commit_thread if commit_thread is not None
                               else not (store.backend.local and store.artifacts.local))
        self._latencies: collections.deque[float] = collections.deque(maxlen=2048)
        self._histogram = dict.fromkeys(_BUCKETS, 0)
        self._commit_seconds = Histogram(COMMIT_SECONDS)
        self._tally = Tally()  # what committed messages recorded, for the crawl's metrics
        self._url_keys: dict[str, str] = {}  # URL -> fetch key, a memo of a pure function
        # What a submitter waits on: a bare asyncio future where the loop is asyncio (half
        # the cost of an anyio.Event per submit, measured), else an anyio.Event.
        self._new_waiter: Callable[[], Waiter] = EventWaiter

    # --- lifecycle ---------------------------------------------------------------------

    @property
    def url_keys(self) -> dict[str, str]:
        """The writer's memo of fetch keys (URL -> ``normalize_url(URL)``). A producer in
        this process that computed keys with ``normalize_url`` may add them here, so the
        writer does not compute them again at submit (the crawler's page workers do)."""
        return self._url_keys

    async def __aenter__(self) -> Writer:
        # One writer per store: on PostgreSQL the writer lock, held on the write connection
        # for the writer's life (re-entrant: a crawl or service that holds it already keeps
        # it); nothing on SQLite, where every write transaction is BEGIN IMMEDIATE. The head
        # is read again under it: another writer may have committed since __init__.
        self._claim = self.store.writer_claim()
        try:
            self._claim.__enter__()
        except BaseException:
            self._send.close()  # nothing was queued: the writer never started
            self._receive.close()
            raise
        try:
            with self.store.errors():
                self._transactions.head = load_head(self.store.connection)
        except BaseException:
            self._claim.__exit__(None, None, None)
            self._send.close()
            self._receive.close()
            raise
        # The commit thread calls _commit_batch through the instance, so a profiler (the
        # benchmark's) can wrap it.
        self._committer = (
            CommitThread(lambda batch: self._commit_batch(batch)) if self._commit_thread
            else CommitInline(lambda batch: self._commit_batch(batch, wait=False, tail=True),
                               lambda batch: self._commit_batch(batch)))
        if sniffio.current_async_library() == "asyncio":
            self._new_waiter = asyncio.get_running_loop().create_future
        self._task_group = anyio.create_task_group()
        try:
            await self._task_group.__aenter__()
        except BaseException:
            self._committer.stop()
            self._claim.__exit__(None, None, None)
            raise
        self._task_group.start_soon(self._run)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> bool | None:
        """Graceful close: stop accepting, drain and commit what is queued, then return.

        An ordinary exception from the ``async with`` body propagates as itself (after the
        drain), not wrapped in an exception group; cancellation is left to the task group.
        """
        self._closed = True
        self._send.close()
        assert self._task_group is not None and self._committer is not None
        try:
            if isinstance(exc, Exception):
                await self._task_group.__aexit__(None, None, None)
                return None
            return await self._task_group.__aexit__(exc_type, exc, tb)
        finally:
            self._committer.stop()  # idle by now: _run waited for its last batch
            self._claim.__exit__(None, None, None)

    # --- submitting --------------------------------------------------------------------

    async def submit(self, message: Message) -> Ack:
        """Queue one message and wait until its batch has committed; return its ack.

        Raises ``CommitError`` when the batch did not commit (redeliver), and
        ``WriterClosedError`` after close or an unrecoverable failure.
        """
        [ack] = await self.submit_group([message])
        return ack

    async def submit_group(self, messages: Sequence[Message], *,
                           decoded: bool = False, flush: bool = False,
                           submitter: str | None = None) -> list[Ack]:
        """Submit messages that must commit in one transaction (each still fails alone).

        A crawler's page result (its attempt, its links, its frontier mark) is a group, so
        a crash can never leave a page marked done without its links. ``decoded``: each
        message is what ``decode_message`` returned (the service's), so its constraints
        were checked then and it is not decoded again. ``flush``: the submitter knows
        nothing more is on its way, so the batch this lands in does not linger for more
        (``WriterLimits.max_batch_delay``); what is queued still joins it. ``submitter``:
        who sent them (a worker host's identity, recorded in ``ingest_ledger.submitter``
        and covered by each leaf: ``ledger_entry``); None for the store's own.
        """
        if self._closed or self._failure is not None:
            raise WriterClosedError("the writer is closed", cause=self._failure)
        now = time.monotonic()
        done = self._new_waiter()
        group = [self._prepare(message, now, done, decoded, submitter)
                 for message in messages]
        if not group:
            return []
        self._unacked.extend(group)
        item = (sum([len(p.encoded) for p in group]), group, flush and not self._busy)
        try:
            try:
                self._send.send_nowait(item)  # no extra trip through the event loop
            except anyio.WouldBlock:
                await self._send.send(item)  # the queue is full: backpressure
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            error = WriterClosedError("the writer is closed", cause=self._failure)
            for pending in group:
                pending.error = error
            resolve(done)
            raise error from exc
        await done
        for pending in group:
            if pending.error is not None:
                raise pending.error
        return [pending.ack for pending in group]  # type: ignore[misc]

    def _prepare(self, message: Message, now: float, done: Waiter,
                 decoded: bool = False, submitter: str | None = None) -> Pending:
        # msgspec validates constraints only when decoding, so a message built in Python is
        # checked by a round trip through the strict decoder: whatever is committed must be
        # exactly what decode_message accepts (verify re-decodes every ledger entry). One
        # that decode_message returned was checked then (``decoded``).
        try:
            encoded = encode_checked(message)  # over MAX_MESSAGE_BYTES: MessageError
        except (TypeError, ValueError, OverflowError, UnicodeEncodeError) as exc:
            raise MessageError(f"message {getattr(message, 'message_id', '?')!r} cannot be "
                               f"encoded: {exc}", hint="fix the producer") from exc
        if not decoded:
            decode_message(encoded)  # raises MessageError naming the field
        if len(self._url_keys) > _URL_KEYS_LIMIT:
            self._url_keys.clear()
        return Pending(message, encoded, payload_hash(encoded), now,
                        _apply.fetch_keys(message, self._url_keys), done, submitter)

    async def submit_bytes(self, data: bytes, *,
                           format: Literal["msgpack", "json"] = "msgpack") -> Ack:
        """Decode strictly (a defect raises ``MessageError``, nothing written), then submit."""
        return await self.submit(decode_message(data, format=format))

    # --- the writer task ---------------------------------------------------------------

    async def _run(self) -> None:
        """Take batches from the queue and commit them, in order.

        With a commit thread, a pipeline: when a batch has committed, the next one is taken
        from the queue and handed to the thread *before* this batch's acks resolve, so the
        thread commits it while the event loop wakes the producers (handing it over never
        yields to them first: ``anyio.to_thread`` yields twice before the thread starts,
        which left the commit thread idle about 40% of the time at B = 500). Committing
        inline, the producers run first, and what they submit joins the next batch.
        """
        committer = self._committer
        assert committer is not None  # started by __aenter__ before this task
        async with self._receive:
            job: Job | None = None
            while True:
                if job is None:
                    first, self._carry = self._carry, None
                    if first is None:
                        try:
                            first = await self._next_or_idle(committer)
                        except anyio.EndOfStream:
                            return
                    job = committer.start(await self._collect(first))
                    # Busy: a batch commits while producers run (on the thread, or its
                    # fsyncs there; not when it committed before any producer runs again).
                    self._busy = not job.done.is_set()
                job = await self._finish(job)

    async def _next_or_idle(self, committer: CommitThread | CommitInline) -> _Group:
        """The next submission. On a server database, each ``idle_check`` seconds that none
        comes, the commit thread checks the write connection (``Store.check_connection``):
        a session the server ended while the writer was idle (a restart, or terminated) is
        made again and its writer lock taken again now, not at the next write, which leaves
        no gap for a standby to take over. A lock that another writer took meanwhile
        (``WriterLockLost``) stops the writer, as at a batch."""
        every = self.limits.idle_check
        if not every or getattr(self.store, "check_connection", None) is None:
            return await self._receive.receive()
        while True:
            with anyio.move_on_after(every):
                return await self._receive.receive()
            job = committer.start([])  # an empty batch: the check (_commit_batch)
            with anyio.CancelScope(shield=True):
                await job.done.wait()
            if job.error is not None:
                self._failure = job.error
                self._fail_queued(WriterClosedError(f"the writer stopped: {job.error}",
                                                    cause=job.error))
                raise job.error

    async def _collect(self, first: _Group) -> list[Pending]:
        """Take what is queued, up to the bounds; linger up to max_batch_delay for more,
        unless a submission said nothing more is coming (``flush``).

        Groups are taken whole, so a group may carry a batch a little over its bounds.
        """
        size, group, flush = first
        batch = list(group)
        deadline = 0.0 if flush else time.monotonic() + self.limits.max_batch_delay
        while len(batch) < self.limits.max_batch_messages and size < self.limits.max_batch_bytes:
            try:
                nbytes, group, flush = self._receive.receive_nowait()  # 3.6x async-for
            except anyio.WouldBlock:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                with anyio.move_on_after(remaining):
                    nbytes, group, flush = await self._receive.receive()
                    batch.extend(group)
                    size += nbytes
                    if flush:
                        deadline = 0.0
                continue
            except anyio.EndOfStream:
                break
            batch.extend(group)
            size += nbytes
            if flush:
                deadline = 0.0
        if deadline == 0.0 and self.limits.max_batch_delay > 0:
            self._producer_flushes = True
        return batch

    def _collect_nowait(self) -> _Group:
        """What is queued right now, up to the bounds, without yielding to other tasks:
        (bytes, messages, whether a submission in it said nothing more is coming)."""
        batch: list[Pending] = []
        size = 0
        flushed = False
        while len(batch) < self.limits.max_batch_messages and size < self.limits.max_batch_bytes:
            try:
                nbytes, group, flush = self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
            batch.extend(group)
            size += nbytes
            flushed = flushed or flush
        return size, batch, flushed

    async def _finish(self, job: Job) -> Job | None:
        """Wait for one batch's commit, start the next one, then resolve this one's acks.

        Returns the next batch's job, already running on the commit thread (or None).
        """
        with anyio.CancelScope(shield=True):  # the outcome must be known before we go on
            await job.done.wait()
        self._busy = False
        batch = job.batch
        following: Job | None = None
        try:
            if isinstance(job.error, CommitError):
                self._counts["commit_errors"] += 1
                for pending in batch:
                    pending.error = job.error
            elif job.error is not None:  # unrecoverable: fail this batch and every later one
                exc = job.error
                self._failure = exc
                error = WriterClosedError(f"the writer failed: {exc}", cause=exc)
                for pending in batch:
                    pending.error = error
                self._fail_queued(error)
                raise exc
            else:
                acks = job.acks
                self._record(batch, job.seconds, acks)
                for pending, ack in zip(batch, acks, strict=True):
                    pending.ack = ack
                if self._transactions.stopping is None and self._committer is not None \
                        and self._committer.pipelines:
                    nxt = self._collect_nowait()
                    if nxt[1]:
                        if self._lingers(nxt):
                            self._carry = nxt  # _run collects it once the acks are out
                        else:
                            following = self._committer.start(nxt[1])
                            self._busy = True
        finally:
            for pending in batch:
                resolve(pending.done)
            self._drop_settled()
        stopping = self._transactions.stopping
        if stopping is not None:  # after this batch's outcome: its acks are durable
            self._stop(stopping)
        return following

    def _lingers(self, queued: _Group) -> bool:
        """Whether what was queued while a batch committed waits for more before it is
        committed: only for a producer that says when nothing more is coming (a crawl in
        this process), when it did not say so since, and the batch has room. Its pages
        that just committed come back soon (their next page rides each commit): taking
        them in the same batch keeps batches whole instead of splitting the producer's
        pages into two half-size batches that take turns (each batch costs fsyncs and a
        commit-log row whatever its size)."""
        size, pending, flushed = queued
        return (self._producer_flushes and not flushed and self.limits.max_batch_delay > 0
                and len(pending) < self.limits.max_batch_messages
                and size < self.limits.max_batch_bytes)

    def _stop(self, failure: SyncError) -> None:
        """An fsync failed: fail everything queued, and the writer, with the reason."""
        self._failure = failure
        self._fail_queued(WriterClosedError(f"the writer stopped: {failure}", cause=failure))
        raise failure

    def _drop_settled(self) -> None:
        """Forget the oldest submissions that have their outcome (for oldest_pending_age)."""
        unacked = self._unacked
        while unacked and (unacked[0].ack is not None or unacked[0].error is not None):
            unacked.popleft()

    def _fail_queued(self, error: BaseException) -> None:
        self._send.close()
        carried, self._carry = self._carry, None
        for pending in carried[1] if carried is not None else []:
            pending.error = error
            resolve(pending.done)
        while True:
            try:
                _, group, _ = self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return
            for pending in group:
                pending.error = error
                resolve(pending.done)

    def _commit_batch(self, batch: list[Pending], *, wait: bool = True,
                      tail: bool = False) -> list[Ack] | Tail:
        """One batch's transaction (``Transactions.commit_batch``), on the commit thread or
        inline; a method of the writer so that a profiler (the benchmarks') can wrap it."""
        return self._transactions.commit_batch(batch, wait=wait, tail=tail)

    # --- metrics -------------------------------------------------------------------------

    def _record(self, batch: list[Pending], latency: float, acks: list[Ack]) -> None:
        self._latencies.append(latency)
        self._commit_seconds.observe(latency)
        self._histogram[next(b for b in _BUCKETS if len(batch) <= b)] += 1
        self._counts["batches"] += 1
        for pending, ack in zip(batch, acks, strict=True):
            self._counts[ack.status] += 1
            if ack.status == "committed":
                self._tally.add(pending.message)

    def statistics(self) -> WriterStatistics:
        """A snapshot of queue, batch and outcome metrics (design rule 10)."""
        self._drop_settled()
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
            tree_size=self._transactions.head.tree.size,
            reconnects=self._counts["reconnects"],
            commit_latencies=self._commit_seconds.buckets(),
            commit_latency_sum=self._commit_seconds.sum,
            recorded=self._tally.snapshot(),
        )
