"""What the writer does when a COMMIT fails or the database server goes: find out what
the batch left, from the commit log, and never guess (design rules 11 and 13).

``Recovery`` is the part of the transaction (``commit.py`` ``Transactions``, which builds
on it) that runs only after something failed: it reads and sets the same state (the head
of the log, the stop after a failed fsync), so it is a base of that class rather than a
helper it passes state to, and lives apart because how an unknown outcome is resolved is
a subject of its own (docs/design.md, "The writer").

  - an error at COMMIT: reopen the database and read the commit log; the batch's row with
    the chain hash this writer computed means it committed (acked), else ``CommitError``;
  - a failed fsync at COMMIT: no read is evidence of what is on the disk, so nothing is
    acked, the store is marked for a resync and the writer stops;
  - a lost connection to a server database (``Lost``): reconnect with bounded backoff,
    take the writer lock again, and apply the batch again unless the commit log shows it
    committed; past ``MAX_LOSSES`` losses in one batch, ``CommitError``.
"""

from __future__ import annotations

import collections
import logging

from .._errors import CommitError, EvidenceError, SyncError, WriterLockLost
from .._model.acks import Ack
from .._store.backend import StoreBackend
from .._store.db import Store
from .._store.log import LogHead, load_head

__all__ = ["MAX_LOSSES", "Lost", "Recovery"]

log = logging.getLogger("evidence.writer")

MAX_LOSSES = 10  # lost connections while writing one batch before it fails


class Lost(Exception):
    """The connection to the database server was lost during a batch (``acks``: during its
    COMMIT, with what would be acknowledged and the chain hash that says it committed)."""

    def __init__(self, batch_seq: int, error: BaseException, acks: list[Ack] | None = None,
                 chain: bytes = b"") -> None:
        super().__init__(f"batch {batch_seq}: connection lost")
        self.batch_seq = batch_seq
        self.error = error
        self.acks = acks
        self.chain = chain


class Recovery:
    """Resolving a batch whose outcome a failure left unknown (a base of ``Transactions``)."""

    store: Store
    _db: StoreBackend  # the store's database backend
    head: LogHead
    stopping: SyncError | None
    _counts: collections.Counter[str]  # the writer's counters

    def _lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the connection to a database server was lost (the server
        then rolls back whatever was not committed); never on SQLite."""
        is_disconnect = getattr(self._db, "is_disconnect", None)
        return bool(is_disconnect is not None and is_disconnect(exc))

    def _reconnect(self, lost: Lost, *, last: bool = False) -> list[Ack] | None:
        """The connection was lost during batch ``lost.batch_seq``: reconnect (with bounded
        backoff, ``Store.reopen_connection``; the writer lock is taken again) and find out
        what the batch left. Before COMMIT: nothing (the server rolled it back), so it is
        applied again. During COMMIT the outcome is unknown until the commit log says: the
        batch's row with the chain hash this writer computed means it committed (its acks
        are returned), no row means it did not (applied again). The head is read again
        either way. Past the backoff's bound, or at the ``last`` of ``MAX_LOSSES`` losses
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
                self.head = load_head(conn)
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
                f"batch {batch_seq}: the database connection was lost {MAX_LOSSES} times "
                "while writing it; it did not commit and none of its messages were "
                "acknowledged", hint="redeliver the messages once the database is stable",
                batch_seq=batch_seq)
        if lost.acks is not None:
            log.warning("batch %d: its COMMIT %s", batch_seq, "had committed: acknowledged"
                        if committed else "had not committed: applying it again",
                        extra={"event": "writer.commit_uncertain"})
        return lost.acks if committed else None

    def _recover(self, batch_seq: int, acks: list[Ack], exc: Exception,
                 chain: bytes) -> list[Ack]:
        """COMMIT failed: outcome unknown. Reopen and ask the commit log what happened.

        Unless an fsync failed: then the commit log read back may be the page cache's,
        never written, so nothing of the batch is acked and the writer stops (design
        rule 11 cannot hold after a failed fsync: design rule 13).
        """
        if self._db.is_sync_failure(exc):
            self.stopping = self.store.mark_sync_failed(
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
        self.head = load_head(conn)
        if row and bytes(row[0][0]) == chain:  # this batch's row, not another writer's
            return acks
        raise CommitError(
            f"batch {batch_seq} did not commit ({self._db.describe(exc)}); none of its "
            "messages were acked",
            hint="redeliver the messages; if the disk is full, free space first",
            batch_seq=batch_seq, sqlite_code=getattr(exc, "extendedresult", None))
