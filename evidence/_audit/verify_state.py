"""Working state rebuilt from the ledger, for verify: the frontier and what is known of hosts.

``frontier`` and ``host_state`` rows change as a crawl moves, so no one message wrote a
row, and they cannot be compared field by field with a ledger entry as the evidence rows
are. But every change was made by the writer applying a ``frontier`` or ``host`` message,
in log order, and later steps rely on the result: a resumed crawl fetches what the
frontier says is queued, a completed session's record of documents (the next session's
baseline) is what the frontier says is done, a host's robots.txt in force is the attempt
``host_state`` names. So verify applies those messages again with the writer's own code
(``_write.apply``), in log order, to a private scratch database that holds nothing but the
sessions and runs they need, and compares the result with the store's rows. A row edited,
deleted or inserted by hand is found and located: by session and ``frontier_id`` (the
discovery order, which the replay reproduces), or by host.

The scratch database is a temporary file SQLite deletes on close (it spills to disk for a
large frontier instead of holding it in memory).
"""

from __future__ import annotations

import apsw

from .._model.messages import (
    FrontierUpdate,
    HostUpdate,
    Message,
    RunEnded,
    RunStarted,
    SessionEnded,
    SessionStarted,
)
from .._model.urls import NORMALIZER_VERSION
from .._store.sqlite import SQLITE, copy_migrated, load_migrations
from .._write.apply import Applier, Interner, Rejected, fetch_keys

__all__ = ["WorkingState"]

_REPLAYED = (SessionStarted, SessionEnded, RunStarted, RunEnded, FrontierUpdate, HostUpdate)
_FRONTIER_COLUMNS = ("session_id", "url", "state", "depth", "via", "source_attempt_id",
                     "attempts", "reason", "not_before", "claimed_run_id", "claimed_at",
                     "updated_log_index")
_FRONTIER_SQL = (
    f"SELECT f.frontier_id, {', '.join('f.' + c for c in _FRONTIER_COLUMNS)}, "
    "u.normalizer_version, u.fetch_key FROM frontier f "
    "LEFT JOIN url_identity u ON u.url_id = f.url_id ORDER BY f.frontier_id")
_HOST_COLUMNS = ("robots_attempt_id", "robots_expires_at", "crawl_delay", "backoff_until",
                 "reason", "updated_log_index")
_HOST_SQL = f"SELECT host, {', '.join(_HOST_COLUMNS)} FROM host_state ORDER BY host"


class _NoFiles:
    """Frontier and host messages name no artifact; nothing is checked on disk."""

    def check(self, ref: object) -> None:
        return None

    verify = check


class _ScratchDatabase:
    dialect = SQLITE  # the scratch database is an in-memory SQLite one


class _Scratch:
    artifacts = _NoFiles()
    backend = _ScratchDatabase()


class _ReplayApplier(Applier):
    """The writer's applier, except that an attempt (named by a host message as its robots
    fetch) is looked up in the store being verified: attempts are not replayed, they are
    checked against the ledger row by row."""

    __slots__ = ("_store_conn",)

    def __init__(self, conn: apsw.Connection, store_conn: apsw.Connection,
                 interner: Interner) -> None:
        super().__init__(conn, _Scratch(), interner)  # type: ignore[arg-type]
        self._store_conn = store_conn

    def attempt_seq(self, attempt_id: str, run_id: str, what: object) -> int:
        rows = self._store_conn.execute(
            "SELECT attempt_seq, run_id FROM fetch_attempt WHERE attempt_id = ?",
            (attempt_id,)).fetchall()
        if not rows:
            raise Rejected(f"{what}: attempt {attempt_id} is not recorded")
        if rows[0][1] != run_id:
            raise Rejected(f"{what}: attempt {attempt_id} belongs to run {rows[0][1]}, "
                           f"not {run_id}")
        return rows[0][0]


class WorkingState:
    """Replays frontier and host messages as ``verify`` reads the ledger; then compares."""

    def __init__(self, store_conn: apsw.Connection, schema_version: int) -> None:
        self.store_conn = store_conn
        self.scratch = apsw.Connection("")  # a private temporary database
        copy_migrated(self.scratch, load_migrations()[:schema_version])
        self.scratch.execute("PRAGMA foreign_keys = OFF")  # attempts, artifacts are not here
        # Nothing survives the scratch database: its rollback journal (each message's
        # savepoint) need not be a file.
        self.scratch.execute("PRAGMA journal_mode = MEMORY")
        self.scratch.execute("BEGIN")
        self.interner = Interner()
        self.applier = _ReplayApplier(self.scratch, store_conn, self.interner)
        self.replayed = 0
        self.keys: dict[str, str] = {}  # URL -> fetch key: a crawl queues the same links again

    def apply(self, message: Message, log_index: int) -> str | None:
        """Apply one ledger entry if it changes working state; the reason if it cannot be
        applied again (its rows were changed before it, or it was never valid)."""
        if not isinstance(message, _REPLAYED):
            return None
        self.replayed += 1
        self.scratch.execute("SAVEPOINT message")
        try:
            self.applier.apply(message, log_index, fetch_keys(message, self.keys))
        except (Rejected, apsw.ConstraintError) as exc:
            self.scratch.execute("ROLLBACK TO message")
            return str(exc)
        finally:
            self.scratch.execute("RELEASE message")
            self.interner.message_done(keep=True)
            if self.replayed % 10_000 == 0:
                self.interner.batch_done(committed=True)  # keeps the caches bounded
                self.keys.clear()
        return None

    def compare(self, add) -> None:
        """Every frontier and host_state row of the store against the replay."""
        try:
            self._compare_frontier(add)
            self._compare_hosts(add)
        finally:
            self.scratch.close()

    def _compare_frontier(self, add) -> None:
        have = self.store_conn.execute(_FRONTIER_SQL)
        want = self.scratch.execute(_FRONTIER_SQL)
        for fid, row, expected in _merge(have, want):
            where = {"table": "frontier", "row_id": fid}
            if expected is None:
                add("row_unlogged", f"frontier row {fid} ({row[2]!r} in session {row[1]}) was "
                    "made by no frontier message", **where)
                continue
            where["log_index"] = expected[12]
            if row is None:
                add("row_missing", f"frontier row {fid} ({expected[2]!r} in session "
                    f"{expected[1]}, last changed by log index {expected[12]}) is missing",
                    **where)
                continue
            for name, value, wanted in zip(_FRONTIER_COLUMNS, row[1:13], expected[1:13],
                                           strict=True):
                if value != wanted:
                    add("row_mismatch", f"frontier row {fid}: {name} is {value!r}, its "
                        f"frontier messages say {wanted!r}", **where)
            version, key = row[13], row[14]
            if version in (None, NORMALIZER_VERSION) and key != expected[14]:
                add("row_mismatch", f"frontier row {fid}: its URL key is {key!r}, its "
                    f"frontier messages say {expected[14]!r}", **where)

    def _compare_hosts(self, add) -> None:
        have = self.store_conn.execute(_HOST_SQL)
        want = self.scratch.execute(_HOST_SQL)
        for host, row, expected in _merge(have, want):
            where = {"table": "host_state", "row_id": host}
            if expected is None:
                add("row_unlogged", f"host_state row {host} was made by no host message",
                    **where)
                continue
            where["log_index"] = expected[-1]
            if row is None:
                add("row_missing", f"host_state row {host} (last changed by log index "
                    f"{expected[-1]}) is missing", **where)
                continue
            for name, value, wanted in zip(_HOST_COLUMNS, row[1:], expected[1:], strict=True):
                if value != wanted:
                    add("row_mismatch", f"host_state row {host}: {name} is {value!r}, its host "
                        f"messages say {wanted!r}", **where)


def _merge(have, want):
    """(key, store row or None, replayed row or None), in key order."""
    a, b = next(have, None), next(want, None)
    while a is not None or b is not None:
        if b is None or (a is not None and a[0] < b[0]):
            yield a[0], a, None
            a = next(have, None)
        elif a is None or b[0] < a[0]:
            yield b[0], None, b
            b = next(want, None)
        else:
            yield a[0], a, b
            a, b = next(have, None), next(want, None)
