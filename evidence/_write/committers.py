"""Where a batch's transaction runs: on the commit thread, or on the event loop's thread.

``CommitThread`` is the one thread that runs batch transactions, for a store where a step
may wait on a server (PostgreSQL, an S3 object store): the event loop goes on serving
producers meanwhile. ``CommitInline`` applies a batch on the event loop's own thread, for
a store whose every step is local, and hands only what waits on the disk (its ``Tail``)
to a thread. Both run what ``commit.py`` makes of a batch and hand it back as a ``Job``;
the writer task (``writer.py``) decides what an outcome means.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import sniffio

from .._model.acks import Ack
from .pending import Pending

__all__ = ["CommitInline", "CommitThread", "Job", "Tail", "WouldWait"]

log = logging.getLogger("evidence.writer")


@dataclass(eq=False)
class Job:
    """One batch on its way through a commit (on the commit thread, or inline)."""

    batch: list[Pending]
    done: anyio.Event
    acks: list[Ack] = field(default_factory=list)
    error: BaseException | None = None
    seconds: float = 0.0  # the batch's transaction
    tail: Tail | None = None  # applied inline: its fsyncs, for the commit thread


def _threadsafe_caller() -> Callable[[Callable[[], object]], object]:
    """A non-blocking way for another thread to run a callback in the running event loop."""
    if sniffio.current_async_library() == "trio":
        import trio  # only when running under trio

        soon: Callable[[Callable[[], object]], object]
        soon = trio.lowlevel.current_trio_token().run_sync_soon
        return soon
    return asyncio.get_running_loop().call_soon_threadsafe


# What a committer runs for a batch: the acks, or what is left of it to run elsewhere.
_Commit = Callable[[list[Pending]], "list[Ack] | Tail"]


class CommitThread:
    """The one thread that runs batch transactions (one write thread, as Datasette keeps one).

    Jobs arrive on a thread-safe queue, so handing a batch over never yields to the event
    loop; each finished batch comes back as one non-blocking callback into the loop. The
    writer task keeps at most one job in flight and waits for it (shielded) before it exits,
    so ``stop`` never waits on a transaction.
    """

    def __init__(self, commit: _Commit) -> None:
        self._commit = commit
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._call_soon = _threadsafe_caller()
        self._thread = threading.Thread(target=self._main, name="evidence-writer-commit",
                                        daemon=True)
        self._thread.start()

    def start(self, batch: list[Pending]) -> Job:
        return self.finish(Job(batch, anyio.Event()))

    def finish(self, job: Job) -> Job:
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


class CommitInline:
    """Batches applied on the event loop's own thread, for a store whose every step is
    local (a SQLite database, payloads in local files): applying a batch is CPU work under
    the GIL, and on a thread each of its statements (about 60 per batch of a crawl) hands
    the GIL back and forth with a busy event loop, which made a 3 ms batch take 5-7 ms
    (docs/benchmarks.md). The event loop waits while a batch is applied, as its producers
    would; the next batch is taken only once this one's acks are out.

    What is left of a batch once applied is waiting on the disk: its payloads' fsync, the
    COMMIT's and a checkpoint's (``Tail``). That goes to a thread, which hands the GIL over
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
        self._commit_now = commit_now  # raises WouldWait, having done nothing
        self._commit = commit
        self._thread: CommitThread | None = None  # started at the first tail or wait

    def start(self, batch: list[Pending]) -> Job:
        job = Job(batch, anyio.Event())
        _run_job(self._commit_now, job)
        if isinstance(job.error, WouldWait):
            return self._helper().start(batch)
        if job.tail is not None:
            return self._helper().finish(job)
        job.done.set()
        return job

    def _helper(self) -> CommitThread:
        if self._thread is None:
            self._thread = CommitThread(self._commit)
        return self._thread

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.stop()


class Tail:
    """The rest of a batch applied on the event loop's thread: the fsyncs before and at
    its COMMIT, and the checkpoint after, run by the commit thread (``CommitInline``).
    ``settle`` is told whether it committed (the interner, as ``Transactions.commit_batch``
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

    def run_batch(self, batch: list[Pending]) -> list[Ack]:
        return self.run()


class WouldWait(Exception):
    """The write lock is held elsewhere: beginning the batch would wait (nothing done)."""


def _run_job(commit: _Commit, job: Job) -> None:
    started = time.monotonic()
    try:
        result = commit(job.batch)
        if isinstance(result, Tail):
            job.tail = result
        else:
            job.acks = result
    except BaseException as exc:  # relayed to the writer task, which decides
        job.error = exc
    job.seconds += time.monotonic() - started
