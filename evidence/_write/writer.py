"""The serialized writer: the one place write transactions begin and end.

    async with Writer(store) as writer:
        ack = await writer.submit(message)

``submit`` puts the message on a bounded queue (a full queue makes it wait: backpressure)
and returns only after the message's batch has committed. One writer task drains the queue
into batches bounded by count, bytes and linger time and commits each: on the event loop's
own thread when every step is local (SQLite, payloads in local files), else on the commit
thread (one dedicated thread, fed by a thread-safe queue, while the event loop goes on
waiting for the server): ``BEGIN IMMEDIATE``; per message the
ledger insert (which is also the dedup lookup), validation, appends and the projection;
the commit-log row; ``COMMIT``; then every ack resolves (one wakeup per submitted group).

A batch is first applied without a savepoint per message, with its URLs and artifacts
interned and its ledger, edges and projection rows written many rows per statement. If any
message fails or is a redelivery, that whole attempt is rolled back (ROLLBACK, then a new
BEGIN IMMEDIATE) and the batch is applied again with a SAVEPOINT per message, so the bad
message fails alone and what commits is exactly what the per-message path alone commits;
the writer then stays on the per-message path until a batch comes through with no
rejection or conflict.

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
    (``_reconnect``), and the writer lock taken again before anything is written (if a
    standby took it meanwhile, the writer stops): a batch cut before its COMMIT is applied
    again (the server rolled it back); one cut during its COMMIT is acked only if the
    commit log holds its row with the chain hash this writer computed, else applied again.
    Nothing is acked before that. An idle writer checks its connection every
    ``idle_check`` seconds, so a session ended while idle is made again at once.

Where the time goes and what was measured: docs/benchmarks.md ("Where the time goes").
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

import anyio
import sniffio

from .._errors import (
    ArtifactError,
    CommitError,
    EvidenceError,
    MessageError,
    SyncError,
    WriterClosedError,
    WriterLockLost,
)
from .._model.acks import Ack, WriterStatistics
from .._model.merkle import CompactTree, leaf_hash
from .._model.messages import (
    Message,
    decode_message,
    encode_checked,
    ledger_entry,
    now_text,
    payload_hash,
)
from .._model.refs import ArtifactRef
from .._store import quarantine as _quarantine
from .._store.backend import Connection
from .._store.db import Store
from .._store.log import LogHead, entry_hash, load_head
from . import apply as _apply
from .tally import COMMIT_SECONDS, Histogram, Tally

__all__ = ["Writer", "WriterHooks", "WriterLimits"]

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
    # A checkpoint once the WAL holds this many bytes of frames (4 MiB at most under
    # sync=normal), and the WAL truncated past it: docs/store.md, "The write path".
    checkpoint_wal_bytes: int = 128 * 1024 * 1024
    # A server database (PostgreSQL): while no batch comes for this long, the write
    # connection is checked, so that a session the server ended is made again, and the
    # writer lock taken again, at once (Store.check_connection). None: never.
    idle_check: float | None = 1.0


_BUCKETS = (1, 10, 50, 100, 500, 1000, 5000, math.inf)
_MAX_LOSSES = 10  # lost connections while writing one batch before it fails
# URLs whose fetch keys the event loop remembers (links repeat): ~250 bytes each, so
# 20,000 hold ~5 MB; the memo is cleared when full (flat memory, docs/benchmarks.md).
_URL_KEYS_LIMIT = 20_000
_TAGS = {kind: kind.__struct_config__.tag  # the ledger's kind column, per message type
         for kind in Message.__args__}


class _Pending:
    """One submitted message on its way to the ledger (a plain class: one per message)."""

    __slots__ = ("ack", "done", "encoded", "error", "keys", "message",
                 "payload_hash", "submitted_at", "submitter")

    def __init__(self, message: Message, encoded: bytes, payload_hash: str,
                 submitted_at: float, keys: dict[str, str], done: _Waiter,
                 submitter: str | None = None) -> None:
        self.message = message
        self.encoded = encoded
        self.submitter = submitter  # a worker host's identity (ledger_entry), or None
        self.payload_hash = payload_hash
        self.submitted_at = submitted_at
        self.keys = keys  # fetch keys of its URLs, computed at submit, off the commit thread
        self.done = done  # shared by its group: a group commits in one batch
        self.ack: Ack | None = None
        self.error: BaseException | None = None


def _leaf(pending: _Pending) -> bytes:
    """The message's Merkle leaf hash: of its bytes, and its submitter if it has one."""
    return leaf_hash(ledger_entry(pending.encoded, pending.submitter))


# A submission on the queue: (encoded bytes, messages, flush: commit without lingering).
_Group = tuple[int, list[_Pending], bool]


@dataclass(eq=False)
class _Job:
    """One batch on its way through a commit (on the commit thread, or inline)."""

    batch: list[_Pending]
    done: anyio.Event
    acks: list[Ack] = field(default_factory=list)
    error: BaseException | None = None
    seconds: float = 0.0  # the batch's transaction
    tail: _Tail | None = None  # applied inline: its fsyncs, for the commit thread


class _EventWaiter:
    """An ``anyio.Event`` behind the small part of the future API the writer uses."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = anyio.Event()

    def done(self) -> bool:
        return self._event.is_set()

    def set_result(self, result: None) -> None:
        self._event.set()

    def __await__(self) -> Generator[object, None, None]:
        return self._event.wait().__await__()


_Waiter = asyncio.Future[None] | _EventWaiter


def _resolve(waiter: _Waiter) -> None:
    """Wake a group's submitter (once: a group's messages share one waiter)."""
    if not waiter.done():  # an asyncio future is also done when its waiter was cancelled
        waiter.set_result(None)


def _threadsafe_caller() -> Callable[[Callable[[], object]], object]:
    """A non-blocking way for another thread to run a callback in the running event loop."""
    if sniffio.current_async_library() == "trio":
        import trio  # only when running under trio

        soon: Callable[[Callable[[], object]], object]
        soon = trio.lowlevel.current_trio_token().run_sync_soon
        return soon
    return asyncio.get_running_loop().call_soon_threadsafe


# What a committer runs for a batch: the acks, or what is left of it to run elsewhere.
_Commit = Callable[[list[_Pending]], "list[Ack] | _Tail"]


class _CommitThread:
    """The one thread that runs batch transactions (Datasette's write thread, STYLE.md 8).

    Jobs arrive on a thread-safe queue, so handing a batch over never yields to the event
    loop; each finished batch comes back as one non-blocking callback into the loop. The
    writer task keeps at most one job in flight and waits for it (shielded) before it exits,
    so ``stop`` never waits on a transaction.
    """

    def __init__(self, commit: _Commit) -> None:
        self._commit = commit
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._call_soon = _threadsafe_caller()
        self._thread = threading.Thread(target=self._main, name="evidence-writer-commit",
                                        daemon=True)
        self._thread.start()

    def start(self, batch: list[_Pending]) -> _Job:
        return self.finish(_Job(batch, anyio.Event()))

    def finish(self, job: _Job) -> _Job:
        """Run ``job`` here: its batch, or its ``tail`` when it was applied inline."""
        self._jobs.put(job)
        return job

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join()

    pipelines = True  # the next batch may be handed over before this one's acks resolve

    def _main(self) -> None:
        while (job := self._jobs.get()) is not None:
            tail, job.tail = job.tail, None
            _run_job(self._commit if tail is None else tail.run_batch, job)
            try:
                self._call_soon(job.done.set)
            except RuntimeError:  # the event loop is gone: nobody is waiting any more
                log.error("writer event loop closed with a batch in flight",
                          extra={"event": "writer.closed_in_flight"})


class _CommitInline:
    """Batches applied on the event loop's own thread, for a store whose every step is
    local (a SQLite database, payloads in local files): applying a batch is CPU work under
    the GIL, and on a thread each of its statements (about 60 per batch of a crawl) hands
    the GIL back and forth with a busy event loop, which made a 3 ms batch take 5-7 ms
    (docs/benchmarks.md). The event loop waits while a batch is applied, as its producers
    would; the next batch is taken only once this one's acks are out.

    What is left of a batch once applied is waiting on the disk: its payloads' fsync, the
    COMMIT's and a checkpoint's (``_Tail``). That goes to a thread, which hands the GIL over
    once or twice, while the loop goes on with its producers (on one core the loop was
    otherwise idle for those fsyncs: a sixth of a crawl's time, docs/benchmarks.md).

    And a batch begins only if the write lock is free at once. Another process holding
    it (an operator's command, a second writer being refused) would otherwise stall the
    event loop for the whole busy timeout, and with it every fetch, read loop and health
    check; that batch is handed to the thread whole, which waits for the lock while the
    loop goes on, and the batches after it are inline again.
    """

    pipelines = False

    def __init__(self, commit_now: _Commit, commit: _Commit) -> None:
        self._commit_now = commit_now  # raises _WouldWait, having done nothing
        self._commit = commit
        self._thread: _CommitThread | None = None  # started at the first tail or wait

    def start(self, batch: list[_Pending]) -> _Job:
        job = _Job(batch, anyio.Event())
        _run_job(self._commit_now, job)
        if isinstance(job.error, _WouldWait):
            return self._helper().start(batch)
        if job.tail is not None:
            return self._helper().finish(job)
        job.done.set()
        return job

    def _helper(self) -> _CommitThread:
        if self._thread is None:
            self._thread = _CommitThread(self._commit)
        return self._thread

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.stop()


class _Tail:
    """The rest of a batch applied on the event loop's thread: the fsyncs before and at
    its COMMIT, and the checkpoint after, run by the commit thread (``_CommitInline``).
    ``settle`` is told whether it committed (the writer's interner, as ``_commit_batch``
    tells it for a batch run whole)."""

    __slots__ = ("run",)

    def __init__(self, finish: Callable[[], tuple[list[Ack], bool]],
                 settle: Callable[[bool], None]) -> None:
        def run() -> list[Ack]:
            committed = False
            try:
                acks, committed = finish()
                return acks
            finally:
                settle(committed)

        self.run = run

    def run_batch(self, batch: list[_Pending]) -> list[Ack]:
        return self.run()


class _WouldWait(Exception):
    """The write lock is held elsewhere: beginning the batch would wait (nothing done)."""


def _run_job(commit: _Commit, job: _Job) -> None:
    started = time.monotonic()
    try:
        result = commit(job.batch)
        if isinstance(result, _Tail):
            job.tail = result
        else:
            job.acks = result
    except BaseException as exc:  # relayed to the writer task, which decides
        job.error = exc
    job.seconds += time.monotonic() - started


class _Lost(Exception):
    """The connection to the database server was lost during a batch (``acks``: during its
    COMMIT, with what would be acknowledged and the chain hash that says it committed)."""

    def __init__(self, batch_seq: int, error: BaseException, acks: list[Ack] | None = None,
                 chain: bytes = b"") -> None:
        super().__init__(f"batch {batch_seq}: connection lost")
        self.batch_seq = batch_seq
        self.error = error
        self.acks = acks
        self.chain = chain


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


class Writer:
    """The one serialized writer of a store. Use as ``async with Writer(store) as w``."""

    def __init__(self, store: Store, *, limits: WriterLimits | None = None,
                 hooks: WriterHooks | None = None, commit_thread: bool | None = None) -> None:
        store.check_writable()
        store.check_synced()  # a store whose fsync failed is resynced by opening it again
        self.store = store
        self._db = store.backend  # the database seam: dialect, errors, upkeep
        self.limits = limits or WriterLimits()
        self._hooks = hooks or WriterHooks()
        # Read before anything that must be closed exists: a failing read (an I/O error on
        # a damaged disk) then leaves nothing behind.
        with store.errors():
            self._head = load_head(store.connection)
        # Queue items are groups with their encoded size: (bytes, messages).
        self._send, self._receive = anyio.create_memory_object_stream[_Group](
            self.limits.queue_size)
        self._unacked: collections.deque[_Pending] = collections.deque()
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
        self._committer: _CommitThread | _CommitInline | None = None
        # Batches commit on a thread of their own where a step may wait on a server (the
        # event loop goes on meanwhile), else on the event loop's thread (_CommitInline).
        # ``commit_thread=True``: always on the thread (a test that holds a commit open).
        self._commit_thread = (commit_thread if commit_thread is not None
                               else not (store.backend.local and store.artifacts.local))
        self._latencies: collections.deque[float] = collections.deque(maxlen=2048)
        self._counts = collections.Counter[str]()
        self._histogram = dict.fromkeys(_BUCKETS, 0)
        self._commit_seconds = Histogram(COMMIT_SECONDS)
        self._tally = Tally()  # what committed messages recorded, for the crawl's metrics
        self._interner = _apply.Interner()
        self._url_keys: dict[str, str] = {}  # URL -> fetch key, a memo of a pure function
        self._optimistic = True  # try a batch without per-message savepoints first
        self._time_floor = ""  # the latest commit time recorded: a batch never records less
        # What a submitter waits on: a bare asyncio future where the loop is asyncio (half
        # the cost of an anyio.Event per submit, measured), else an anyio.Event.
        self._new_waiter: Callable[[], _Waiter] = _EventWaiter
        # Set on the commit thread when an fsync failed: the writer stops once the batch
        # in hand has its outcome (acked if its own COMMIT had succeeded).
        self._stopping: SyncError | None = None
        self._records = _quarantine.BatchRecords()  # reset at the start of every batch
        self._idle_failure = ""  # what the last idle check could not do (said once)

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
                self._head = load_head(self.store.connection)
        except BaseException:
            self._claim.__exit__(None, None, None)
            self._send.close()
            self._receive.close()
            raise
        # The commit thread calls _commit_batch through the instance, so a profiler (the
        # benchmark's) can wrap it.
        self._committer = (
            _CommitThread(lambda batch: self._commit_batch(batch)) if self._commit_thread
            else _CommitInline(lambda batch: self._commit_batch(batch, wait=False, tail=True),
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
            _resolve(done)
            raise error from exc
        await done
        for pending in group:
            if pending.error is not None:
                raise pending.error
        return [pending.ack for pending in group]  # type: ignore[misc]

    def _prepare(self, message: Message, now: float, done: _Waiter,
                 decoded: bool = False, submitter: str | None = None) -> _Pending:
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
        return _Pending(message, encoded, payload_hash(encoded), now,
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
            job: _Job | None = None
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

    async def _next_or_idle(self, committer: _CommitThread | _CommitInline) -> _Group:
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

    def _check_connection(self) -> None:
        """On the commit thread, while idle: ``Store.check_connection``. A server still out
        of reach past the outage deadline is said once and tried again at the next check
        (the next batch tries too, and fails if it still is): only a lost lock is fatal."""
        try:
            self.store.check_connection()  # type: ignore[attr-defined]
            self._idle_failure = ""
        except WriterLockLost:
            raise
        except EvidenceError as exc:
            if str(exc) != self._idle_failure:
                log.warning("the write connection could not be made again while idle: %s",
                            exc, extra={"event": "writer.reconnect_failed"})
            self._idle_failure = str(exc)

    async def _collect(self, first: _Group) -> list[_Pending]:
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
        batch: list[_Pending] = []
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

    async def _finish(self, job: _Job) -> _Job | None:
        """Wait for one batch's commit, start the next one, then resolve this one's acks.

        Returns the next batch's job, already running on the commit thread (or None).
        """
        with anyio.CancelScope(shield=True):  # the outcome must be known before we go on
            await job.done.wait()
        self._busy = False
        batch = job.batch
        following: _Job | None = None
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
                if self._stopping is None and self._committer is not None \
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
                _resolve(pending.done)
            self._drop_settled()
        if self._stopping is not None:  # after this batch's outcome: its acks are durable
            self._stop(self._stopping)
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
            _resolve(pending.done)
        while True:
            try:
                _, group, _ = self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return
            for pending in group:
                pending.error = error
                _resolve(pending.done)

    # --- one batch, on the commit thread -------------------------------------------------

    def _commit_batch(self, batch: list[_Pending], *, wait: bool = True,
                      tail: bool = False) -> list[Ack] | _Tail:
        """Commit ``batch``; ``wait=False``: raise ``_WouldWait`` (nothing done) where the
        write lock is held elsewhere, instead of waiting for it. ``tail`` (a local store,
        ``_CommitInline``): apply it, and return what is left to run elsewhere."""
        if not batch:  # not a batch: the idle check of _next_or_idle
            self._check_connection()
            return []
        committed: bool | None = False
        try:
            for losses in itertools.count(1):
                try:
                    result = self._write_batch(batch, wait=wait, tail=tail)
                    if isinstance(result, _Tail):
                        committed = None  # the tail settles the interner
                        return result
                    acks, committed = result
                    return acks
                except _Lost as lost:  # the database connection: reconnect, then resolve
                    self._interner.batch_done(committed=False)
                    resolved = self._reconnect(lost, last=losses == _MAX_LOSSES)
                    if resolved is not None:
                        committed = True
                        return resolved
            raise AssertionError("unreachable: itertools.count() never ends")
        finally:
            if committed is not None:  # cached ids survive only a clean COMMIT
                self._interner.batch_done(committed)

    def _lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the connection to a database server was lost (the server
        then rolls back whatever was not committed); never on SQLite."""
        is_disconnect = getattr(self._db, "is_disconnect", None)
        return bool(is_disconnect is not None and is_disconnect(exc))

    def _reconnect(self, lost: _Lost, *, last: bool = False) -> list[Ack] | None:
        """The connection was lost during batch ``lost.batch_seq``: reconnect (with bounded
        backoff, ``Store.reopen_connection``; the writer lock is taken again) and find out
        what the batch left. Before COMMIT: nothing (the server rolled it back), so it is
        applied again. During COMMIT the outcome is unknown until the commit log says: the
        batch's row with the chain hash this writer computed means it committed (its acks
        are returned), no row means it did not (applied again). The head is read again
        either way. Past the backoff's bound, or at the ``last`` of ``_MAX_LOSSES`` losses
        in one batch: ``CommitError``, nothing acked."""
        batch_seq = lost.batch_seq
        self._counts["reconnects"] += 1
        log.warning("batch %d: the connection to the database was lost %s (%s); "
                    "reconnecting", batch_seq, "during COMMIT" if lost.acks is not None
                    else "before COMMIT", self._db.describe(lost.error),
                    extra={"event": "writer.reconnect"})
        try:
            self.store.reopen_connection()
            conn = self.store.connection
            with self.store.errors():
                self._head = load_head(conn)
                row = [] if lost.acks is None else conn.execute(
                    "SELECT entry_hash FROM commit_log WHERE batch_seq = ?",
                    (batch_seq,)).fetchall()
        except WriterLockLost:
            raise  # another writer has the store: this one stops (nothing of it acked)
        except EvidenceError as exc:
            raise CommitError(
                f"batch {batch_seq}: the database connection was lost and could not be made "
                f"again ({exc}); none of its messages were acknowledged",
                hint="redeliver the messages once the database is reachable",
                batch_seq=batch_seq) from exc
        committed = bool(row) and bytes(row[0][0]) == lost.chain
        if not committed and last:
            raise CommitError(
                f"batch {batch_seq}: the database connection was lost {_MAX_LOSSES} times "
                "while writing it; it did not commit and none of its messages were "
                "acknowledged", hint="redeliver the messages once the database is stable",
                batch_seq=batch_seq)
        if lost.acks is not None:
            log.warning("batch %d: its COMMIT %s", batch_seq, "had committed: acknowledged"
                        if committed else "had not committed: applying it again",
                        extra={"event": "writer.commit_uncertain"})
        return lost.acks if committed else None

    def _write_batch(self, batch: list[_Pending], *, wait: bool, tail: bool = False
                     ) -> tuple[list[Ack], bool] | _Tail:
        store = self.store
        conn = store.connection
        head = self._head
        batch_seq = head.batch_seq + 1
        first_index = head.tree.size
        try:
            if wait:
                self._begin(conn)
            elif not self._db.try_begin_write(conn):
                raise _WouldWait
        except self._db.Error as exc:
            if self._lost(exc):
                raise _Lost(batch_seq, exc) from exc
            raise
        try:
            # Commit times never go back (verify checks it, _store.log.check_times): a
            # clock stepped back records the latest time already committed instead.
            received_at = max((self._hooks.batch_time or now_text)(), head.committed_at,
                              self._time_floor)
            self._time_floor = received_at
            self._records = _quarantine.BatchRecords()  # what this batch quarantines
            verify = self.limits.verify_artifacts
            applied = None
            if self._optimistic:
                applier = _apply.Applier(conn, store, self._interner, verify_artifacts=verify,
                                         defer=True)
                applied = self._apply_optimistic(applier, batch, batch_seq, received_at)
                if applied is None:  # a message failed: undo the attempt, isolate each one
                    # The transaction holds nothing but this attempt, so a ROLLBACK and a
                    # new BEGIN undo it. A batch savepoint would too, but while one is open
                    # SQLite's in-memory sub-journal keeps a copy of every page the batch
                    # touches, and releasing each statement journal (the url_current
                    # upsert has one) gets slower as it grows: 39 us per upsert instead of
                    # 6.5 at B = 500 (benchmarks.md, "Third round").
                    self._interner.batch_done(committed=False)
                    conn.execute("ROLLBACK")
                    self._begin(conn)
            if applied is None:
                applier = _apply.Applier(conn, store, self._interner, verify_artifacts=verify)
                applied = self._apply_isolated(applier, batch, batch_seq, received_at)
                # Stay careful while batches carry bad messages; try the fast path again
                # after a clean one.
                self._optimistic = not any(a.status in ("rejected", "conflict")
                                           for a in applied[0])
            acks, tree, wrote = applied
            if not wrote:  # only duplicates: nothing to commit, no outcome to doubt
                self._rollback(conn)
                return acks, False
            root = tree.root()
            quarantined = self._records.encode()
            chain = entry_hash(head.entry_hash, batch_seq, first_index, tree.size, root,
                               received_at, quarantined)
            conn.execute(
                "INSERT INTO commit_log (batch_seq, committed_at, first_index, tree_size, "
                "root, frontier, prev_hash, entry_hash, quarantined) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (batch_seq, received_at, first_index, tree.size, root, tree.to_bytes(),
                 head.entry_hash, chain, quarantined))
            if self._hooks.after_apply:
                self._hooks.after_apply(batch_seq)
        except self._db.Error as exc:  # an I/O or disk-full error before COMMIT: rolled back
            if self._lost(exc):
                raise _Lost(batch_seq, exc) from exc
            self._rollback(conn)
            # No fsync runs before COMMIT in WAL mode; if one did:
            if self._db.is_sync_failure(exc):
                self._stopping = self.store.mark_sync_failed(
                    f"batch {batch_seq}, before its COMMIT: {self._db.describe(exc)}")
            raise CommitError(
                f"batch {batch_seq} failed before commit ({self._db.describe(exc)}); "
                "nothing of it was written",
                hint="redeliver the messages; if the disk is full, free space first",
                batch_seq=batch_seq, sqlite_code=getattr(exc, "extendedresult", None),
            ) from exc
        except ArtifactError as exc:
            # The artifact store did not answer a reference check (an object store down):
            # not the messages' fault, unlike a missing payload, which is a rejection.
            self._rollback(conn)
            raise CommitError(
                f"batch {batch_seq}: the artifact store could not check its payloads ({exc}); "
                "nothing of it was written", hint="redeliver the messages once the artifact "
                "store answers again", batch_seq=batch_seq) from exc
        except BaseException:
            self._rollback(conn)
            raise
        new_refs = applier.new_refs

        def finish() -> tuple[list[Ack], bool]:
            # Durable before referenced (design rule 6): whatever payloads the batch references
            # for the first time are synced before its COMMIT (a no-op for a store whose
            # put is durable when it returns; artifact packs sync here, once per batch).
            try:
                self._sync_payloads(new_refs, batch_seq)
                if self._hooks.before_commit:
                    self._hooks.before_commit(batch_seq)
            except BaseException:
                self._rollback(conn)
                raise
            return self._commit(conn, head, tree, batch_seq, acks, chain)

        return _Tail(finish, self._interner.batch_done) if tail else finish()

    def _commit(self, conn: Connection, head: LogHead, tree: CompactTree, batch_seq: int,
                acks: list[Ack], chain: bytes) -> tuple[list[Ack], bool]:
        """COMMIT the batch applied, then the backend's upkeep; (acks, committed)."""
        try:
            conn.execute("COMMIT")
        except self._db.Error as exc:
            if self._lost(exc):
                raise _Lost(batch_seq, exc, acks, chain) from exc
            return self._recover(batch_seq, acks, exc, chain), False
        self._head = type(head)(tree, batch_seq, chain)
        if self._hooks.after_commit:
            self._hooks.after_commit(batch_seq)
        self._checkpoint(conn, batch_seq)
        return acks, True

    def _apply_optimistic(self, applier: _apply.Applier, batch: list[_Pending],
                          batch_seq: int, received_at: str
                          ) -> tuple[list[Ack], CompactTree, bool] | None:
        """Apply a batch as if every message were new and valid; None if one is not.

        The caller then rolls the whole attempt back and applies the batch again with
        ``_apply_isolated``, where a bad message fails alone and a redelivery is sorted out
        as a duplicate or a conflict: what commits is exactly what the isolated path alone
        would commit. Nearly every batch is clean, and this path skips what isolation costs:
        a savepoint per message (SQLite copies every page a message first touches into a
        sub-journal) and a statement per ledger, URL, edge and projection row. The ledger
        rows go first, many per statement (the evidence rows reference them; a row the
        insert skipped is a redelivery), then the batch's URLs and its artifacts are interned
        at once, in the order its messages would intern them; its edges and url_current
        upserts are written last, many rows per statement (``Applier.flush``).
        """
        conn = applier.conn
        tree = self._head.tree.copy()
        first_index = tree.size
        leaves = [_leaf(pending) for pending in batch]
        try:
            before = conn.total_changes()
            applier.sql.ledger.write(applier.cursor, [
                (log_index, pending.message.message_id, _TAGS[type(pending.message)],
                 pending.payload_hash, leaf, pending.encoded, batch_seq, received_at,
                 pending.submitter)
                for log_index, pending, leaf in zip(itertools.count(first_index), batch,
                                                    leaves)])
            if conn.total_changes() - before != len(batch):
                return None  # a redelivery: the ledger insert is also the dedup lookup
            applier.intern_urls(key for pending in batch for key in pending.keys.values())
            applier.intern_artifacts(ref for pending in batch
                                     for ref in _apply.artifact_refs(pending.message))
            apply = applier.apply
            for log_index, pending in enumerate(batch, first_index):
                apply(pending.message, log_index, pending.keys)
            applier.flush()
        except (_apply.Rejected, self._db.ConstraintError):
            return None
        self._interner.message_done(keep=True)  # the batch's ids, kept if it commits
        tree.extend(leaves)
        acks = [Ack(message_id=pending.message.message_id, status="committed",
                    log_index=log_index, batch_seq=batch_seq)
                for log_index, pending in enumerate(batch, first_index)]
        return acks, tree, True

    def _apply_isolated(self, applier: _apply.Applier, batch: list[_Pending], batch_seq: int,
                        received_at: str) -> tuple[list[Ack], CompactTree, bool]:
        """Apply a batch with a savepoint per message: a bad message fails alone (rule 7)."""
        conn = applier.conn
        tree = self._head.tree.copy()
        acks = []
        wrote = False
        for pending in batch:
            ack, leaf, wrote_row = self._apply_one(conn, applier, pending, tree.size,
                                                   batch_seq, received_at)
            if leaf is not None:
                tree.append(leaf)
            wrote = wrote or wrote_row
            acks.append(ack)
        return acks, tree, wrote

    def _checkpoint(self, conn: Connection, batch_seq: int) -> None:
        """The backend's upkeep after a commit (SQLite: the WAL checkpoint that replaces
        its auto-checkpoint, ``SQLiteBackend.after_commit``), with every error seen."""
        db = self._db
        try:
            db.after_commit(conn, wal_limit_bytes=self.limits.checkpoint_wal_bytes,
                            counted=self._count)
        except db.BusyError:
            pass  # a reader is still using the WAL: the next commit tries again
        except db.Error as exc:
            # The batch is committed and is acked either way (sync=full: its COMMIT synced
            # the WAL; sync=normal acks inside its documented window).
            self._counts["checkpoint_errors"] += 1
            if db.is_sync_failure(exc):
                # The database file's fsync failed: pages an earlier partial checkpoint
                # wrote may be lost though reads show them, and the next checkpoint that
                # succeeds would reset the WAL that still holds them. Stop; resync first.
                self._stopping = self.store.mark_sync_failed(
                    f"the checkpoint after batch {batch_seq}: {db.describe(exc)}")
                return
            # A full disk or a failed write leaves the WAL as it was, which is safe: retry
            # at a later commit.
            log.warning("WAL checkpoint failed after batch commit: %s", exc,
                        extra={"event": "writer.checkpoint_failed"})

    def _sync_payloads(self, refs: list[ArtifactRef], batch_seq: int) -> None:
        try:
            self.store.artifacts.sync(refs)
        except ArtifactError as exc:
            if getattr(exc, "sync_failed", False):
                # A pack's fsync failed: what it holds past its last good fsync may be lost
                # though reads show it. The same rule as a failed fsync of the database:
                # nothing of this batch is acked, the store is marked, the writer stops,
                # and the next open for writing resyncs the packs too.
                self._stopping = self.store.mark_sync_failed(
                    f"batch {batch_seq}, before its COMMIT: {exc}")
            raise CommitError(
                f"batch {batch_seq}: its payloads could not be made durable ({exc}); nothing "
                "of it was written", hint="redeliver the messages once the artifact store "
                "works again", batch_seq=batch_seq) from exc

    def _count(self, name: str) -> None:
        self._counts[name] += 1

    def _rollback(self, conn: Connection) -> None:
        """Roll back the open transaction; a connection that cannot is replaced."""
        try:
            if not conn.get_autocommit():
                conn.execute("ROLLBACK")
        except self._db.Error:
            self.store.reopen_connection()

    def _begin(self, conn: Connection) -> None:
        """BEGIN IMMEDIATE with a bounded retry on SQLITE_BUSY (each try waits busy_timeout)."""
        for attempt in range(self.limits.busy_retries + 1):
            try:
                conn.execute(self._db.dialect.begin_write)
                return
            except self._db.BusyError as exc:
                self._counts["busy_retries"] += 1
                if attempt == self.limits.busy_retries:
                    raise CommitError(
                        f"the database stayed locked through {attempt + 1} attempts to begin "
                        "a write transaction; nothing was written",
                        hint="another process is writing this store; stop it",
                        sqlite_code=getattr(exc, "extendedresult", None)) from exc
                time.sleep(min(0.05 * 2**attempt, 1.0))

    def _recover(self, batch_seq: int, acks: list[Ack], exc: Exception,
                 chain: bytes) -> list[Ack]:
        """COMMIT failed: outcome unknown. Reopen and ask the commit log what happened.

        Unless an fsync failed: then the commit log read back may be the page cache's,
        never written, so nothing of the batch is acked and the writer stops (design
        rule 11 cannot hold after a failed fsync: design rule 13).
        """
        if self._db.is_sync_failure(exc):
            self._stopping = self.store.mark_sync_failed(
                f"batch {batch_seq}'s COMMIT: {self._db.describe(exc)}")
            raise CommitError(
                f"batch {batch_seq}: an fsync failed at COMMIT ({self._db.describe(exc)}); "
                "none of its messages "
                "were acknowledged, and whether they reached the disk is known only once the "
                "store is resynced",
                hint="check the disk (dmesg); once it works, open the store again (it is "
                "resynced first) and redeliver these messages",
                batch_seq=batch_seq, sqlite_code=getattr(exc, "extendedresult", None)
            ) from exc
        self.store.reopen_connection()  # raises StoreError if the database is gone
        conn = self.store.connection
        row = conn.execute(
            "SELECT entry_hash FROM commit_log WHERE batch_seq = ?", (batch_seq,)).fetchall()
        self._head = load_head(conn)
        if row and bytes(row[0][0]) == chain:  # this batch's row, not another writer's
            return acks
        raise CommitError(
            f"batch {batch_seq} did not commit ({self._db.describe(exc)}); none of its "
            "messages were acked",
            hint="redeliver the messages; if the disk is full, free space first",
            batch_seq=batch_seq, sqlite_code=getattr(exc, "extendedresult", None))

    def _apply_one(self, conn: Connection, applier: _apply.Applier, pending: _Pending,
                   log_index: int, batch_seq: int,
                   received_at: str) -> tuple[Ack, bytes | None, bool]:
        """Dedup, validate and append one message; returns (ack, new leaf, wrote anything)."""
        message = pending.message
        mid = message.message_id
        cursor = applier.cursor
        cursor.execute("SAVEPOINT message")
        try:
            leaf = _leaf(pending)
            # The ledger insert is also the dedup lookup: nothing inserted, a redelivery.
            cursor.execute(applier.sql.ledger.single, (log_index, mid, _TAGS[type(message)],
                                          pending.payload_hash, leaf, pending.encoded,
                                          batch_seq, received_at, pending.submitter))
            inserted = conn.changes()
            if inserted:
                applier.apply(message, log_index, pending.keys)
        except _apply.Rejected as exc:
            self._undo_message(conn)
            if exc.duplicate:
                return Ack(message_id=mid, status="duplicate", reason=str(exc)), None, False
            status: Literal["conflict", "rejected"] = "conflict" if exc.conflict else "rejected"
            self._quarantine(conn, pending, status, str(exc), received_at)
            return Ack(message_id=mid, status=status, reason=str(exc)), None, True
        except self._db.ConstraintError as exc:
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
        cursor.execute("RELEASE message")
        self._interner.message_done(keep=True)
        ack = Ack(message_id=mid, status="committed", log_index=log_index, batch_seq=batch_seq)
        return ack, leaf, True

    def _redelivered(self, conn: Connection, pending: _Pending,
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

    def _undo_message(self, conn: Connection) -> None:
        """Roll back one message's savepoint: its rows, and the ids it cached, are gone."""
        conn.execute("ROLLBACK TO message")
        conn.execute("RELEASE message")
        self._interner.message_done(keep=False)

    def _quarantine(self, conn: Connection, pending: _Pending, code: str, reason: str,
                    received_at: str) -> None:
        """Keep the message whole: a new record, or one more delivery of the same content
        refused for the same reason (counted, not another row); noted for the commit log."""
        _quarantine.record(conn, self._records, message_id=pending.message.message_id,
                           kind=_TAGS[type(pending.message)], reason_code=code, reason=reason,
                           payload_hash_hex=pending.payload_hash, payload=pending.encoded,
                           received_at=received_at)

    # --- metrics -------------------------------------------------------------------------

    def _record(self, batch: list[_Pending], latency: float, acks: list[Ack]) -> None:
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
            tree_size=self._head.tree.size,
            reconnects=self._counts["reconnects"],
            commit_latencies=self._commit_seconds.buckets(),
            commit_latency_sum=self._commit_seconds.sum,
            recorded=self._tally.snapshot(),
        )
