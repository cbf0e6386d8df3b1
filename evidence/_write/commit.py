"""One batch's write transaction: the only place the writer begins and ends one.

    BEGIN IMMEDIATE (a bounded retry on SQLITE_BUSY; an advisory lock on PostgreSQL)
    per message: the ledger row (also the dedup lookup), validation, the evidence rows
    the commit_log row (tree size and root, hash-chained to the previous row)
    the payloads referenced for the first time made durable (design rule 6), COMMIT
    the backend's upkeep (SQLite: the WAL checkpoint)

A batch is first applied without a savepoint per message, with its URLs and artifacts
interned and its ledger, edges and projection rows written many rows per statement. If any
message fails or is a redelivery, that whole attempt is rolled back (ROLLBACK, then a new
BEGIN IMMEDIATE) and the batch is applied again with a SAVEPOINT per message, so the bad
message fails alone and what commits is exactly what the per-message path alone commits;
the writer then stays on the per-message path until a batch comes through with no
rejection or conflict.

``Transactions`` runs on the commit thread or inline (``committers.py``), never on both at
once; what it returns is the batch's acks, or its ``Tail`` (a local store: the fsyncs left
to run on a thread). When a COMMIT fails or the server goes, ``recovery.py`` (its base)
finds out what the batch left. The queue, the batches and the acks are the writer task's
(``writer.py``).
"""

from __future__ import annotations

import collections
import itertools
import logging
import time
from typing import Literal

from .._errors import ArtifactError, CommitError, EvidenceError, SyncError, WriterLockLost
from .._model.acks import Ack
from .._model.merkle import CompactTree
from .._model.messages import now_text
from .._model.refs import ArtifactRef
from .._store import quarantine as _quarantine
from .._store.backend import Connection
from .._store.db import Store
from .._store.log import LogHead, entry_hash, load_head
from . import apply as _apply
from .committers import Tail, WouldWait
from .limits import WriterHooks, WriterLimits
from .pending import TAGS, Pending, leaf_of
from .recovery import MAX_LOSSES, Lost, Recovery

__all__ = ["Transactions"]

log = logging.getLogger("evidence.writer")


class Transactions(Recovery):
    """The write transactions of one writer, one per batch, and the state they carry from
    one batch to the next: the head of the log, the caches of row ids, the path (whole or
    one savepoint per message) the next batch tries first."""

    def __init__(self, store: Store, limits: WriterLimits, hooks: WriterHooks,
                 counts: collections.Counter[str]) -> None:
        self.store = store
        self._db = store.backend  # the database seam: dialect, errors, upkeep
        self.limits = limits
        self._hooks = hooks
        self._counts = counts  # the writer's: statistics() reports them
        # Read before anything that must be closed exists: a failing read (an I/O error on
        # a damaged disk) then leaves nothing behind.
        with store.errors():
            self.head = load_head(store.connection)
        self._interner = _apply.Interner()
        self._optimistic = True  # try a batch without per-message savepoints first
        self._time_floor = ""  # the latest commit time recorded: a batch never records less
        # Set on the commit thread when an fsync failed: the writer stops once the batch
        # in hand has its outcome (acked if its own COMMIT had succeeded).
        self.stopping: SyncError | None = None
        self._records = _quarantine.BatchRecords()  # reset at the start of every batch
        self._idle_failure = ""  # what the last idle check could not do (said once)

    def commit_batch(self, batch: list[Pending], *, wait: bool = True,
                      tail: bool = False) -> list[Ack] | Tail:
        """Commit ``batch``; ``wait=False``: raise ``WouldWait`` (nothing done) where the
        write lock is held elsewhere, instead of waiting for it. ``tail`` (a local store,
        ``CommitInline``): apply it, and return what is left to run elsewhere."""
        if not batch:  # not a batch: the idle check of Writer._next_or_idle
            self._check_connection()
            return []
        committed: bool | None = False
        try:
            for losses in itertools.count(1):
                try:
                    result = self._write_batch(batch, wait=wait, tail=tail)
                    if isinstance(result, Tail):
                        committed = None  # the tail settles the interner
                        return result
                    acks, committed = result
                    return acks
                except Lost as lost:  # the database connection: reconnect, then resolve
                    self._interner.batch_done(committed=False)
                    resolved = self._reconnect(lost, last=losses == MAX_LOSSES)
                    if resolved is not None:
                        committed = True
                        return resolved
            raise AssertionError("unreachable: itertools.count() never ends")
        finally:
            if committed is not None:  # cached ids survive only a clean COMMIT
                self._interner.batch_done(committed)

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

    def _write_batch(self, batch: list[Pending], *, wait: bool, tail: bool = False
                     ) -> tuple[list[Ack], bool] | Tail:
        store = self.store
        conn = store.connection
        head = self.head
        batch_seq = head.batch_seq + 1
        first_index = head.tree.size
        try:
            if wait:
                self._begin(conn)
            elif not self._db.try_begin_write(conn):
                raise WouldWait
        except self._db.Error as exc:
            if self._lost(exc):
                raise Lost(batch_seq, exc) from exc
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
                raise Lost(batch_seq, exc) from exc
            self._rollback(conn)
            # No fsync runs before COMMIT in WAL mode; if one did:
            if self._db.is_sync_failure(exc):
                self.stopping = self.store.mark_sync_failed(
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

        return Tail(finish, self._interner.batch_done) if tail else finish()

    def _commit(self, conn: Connection, head: LogHead, tree: CompactTree, batch_seq: int,
                acks: list[Ack], chain: bytes) -> tuple[list[Ack], bool]:
        """COMMIT the batch applied, then the backend's upkeep; (acks, committed)."""
        try:
            conn.execute("COMMIT")
        except self._db.Error as exc:
            if self._lost(exc):
                raise Lost(batch_seq, exc, acks, chain) from exc
            return self._recover(batch_seq, acks, exc, chain), False
        self.head = type(head)(tree, batch_seq, chain)
        if self._hooks.after_commit:
            self._hooks.after_commit(batch_seq)
        self._checkpoint(conn, batch_seq)
        return acks, True

    def _apply_optimistic(self, applier: _apply.Applier, batch: list[Pending],
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
        tree = self.head.tree.copy()
        first_index = tree.size
        leaves = [leaf_of(pending) for pending in batch]
        try:
            before = conn.total_changes()
            applier.sql.ledger.write(applier.cursor, [
                (log_index, pending.message.message_id, TAGS[type(pending.message)],
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

    def _apply_isolated(self, applier: _apply.Applier, batch: list[Pending], batch_seq: int,
                        received_at: str) -> tuple[list[Ack], CompactTree, bool]:
        """Apply a batch with a savepoint per message: a bad message fails alone (rule 7)."""
        conn = applier.conn
        tree = self.head.tree.copy()
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
                self.stopping = self.store.mark_sync_failed(
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
                self.stopping = self.store.mark_sync_failed(
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

    def _apply_one(self, conn: Connection, applier: _apply.Applier, pending: Pending,
                   log_index: int, batch_seq: int,
                   received_at: str) -> tuple[Ack, bytes | None, bool]:
        """Dedup, validate and append one message; returns (ack, new leaf, wrote anything)."""
        message = pending.message
        mid = message.message_id
        cursor = applier.cursor
        cursor.execute("SAVEPOINT message")
        try:
            leaf = leaf_of(pending)
            # The ledger insert is also the dedup lookup: nothing inserted, a redelivery.
            cursor.execute(applier.sql.ledger.single, (log_index, mid, TAGS[type(message)],
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

    def _redelivered(self, conn: Connection, pending: Pending,
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

    def _quarantine(self, conn: Connection, pending: Pending, code: str, reason: str,
                    received_at: str) -> None:
        """Keep the message whole: a new record, or one more delivery of the same content
        refused for the same reason (counted, not another row); noted for the commit log."""
        _quarantine.record(conn, self._records, message_id=pending.message.message_id,
                           kind=TAGS[type(pending.message)], reason_code=code, reason=reason,
                           payload_hash_hex=pending.payload_hash, payload=pending.encoded,
                           received_at=received_at)
