"""The PostgreSQL store backend: ``PostgresBackend``, the second implementation of
``backend.StoreBackend``.

A PostgreSQL store is one database (its tables are the SQLite store's, mirrored by
``schema/postgresql/NNN_name.sql``) and an artifact directory named by the store's meta
(``artifacts``), given when the store is created. The backend is built in parts, each a
module, lowest first:
  - ``pgconn``: a connection (``PgConnection``: apsw's surface over psycopg), the server's
    durability checked at every connection, psycopg errors translated at one boundary
    (``map_pg_errors``), and one outage clock for every connection of a backend;
  - ``pglock``: one writer per store (an advisory lock), and the dialect whose write
    transactions take it;
  - ``pgschema``: the migrations, a snapshot into a private SQLite file (what the archives
    and verify read: both engines export the same bytes for the same evidence), a restore
    from one, verify's schema check;
  - this module: the backend, which puts them together: the writer's connection, taken
    again with its lock after a lost connection (or refused for good: ``WriterLockLost``),
    readers and snapshots that ride through a restart of the server.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from .._errors import StoreError, WriterLockLost
from .backend import Progress
from .location import redact
from .pgconn import (
    DEFAULT_LOCK_TIMEOUT_MS,
    OUTAGE_DEADLINE,
    Outage,
    PgConnection,
    _BusyError,
    _ConstraintError,
    _Error,
    _need_driver,
    connect,
    is_disconnect,
    map_pg_errors,
)
from .pglock import _LOCK_ARGS, POSTGRESQL, lock_holder, take_writer_lock
from .pgschema import apply_pg_migrations, copy_snapshot

__all__ = ["PostgresBackend"]


class PostgresBackend:
    """A store's database as one PostgreSQL database (``backend.StoreBackend``)."""

    dialect = POSTGRESQL
    local = False
    Error = _Error
    BusyError = _BusyError
    ConstraintError = _ConstraintError

    def __init__(self, location: str, *, lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
                 outage_deadline: float = OUTAGE_DEADLINE) -> None:
        _need_driver()
        self.conninfo = location
        self.location = redact(location)
        self.lock_timeout_ms = lock_timeout_ms
        self.outage = Outage(location, outage_deadline)  # one clock for every connection
        self.writer_locked = False  # the write connection holds the writer lock
        # Set once the lock could not be taken again after a lost connection: from then
        # on this store's writer must never write (another one does).
        self.lock_lost: WriterLockLost | None = None

    def connect_writer(self, *, create: bool = False) -> PgConnection:
        return connect(self.conninfo, lock_timeout_ms=self.lock_timeout_ms)

    def try_begin_write(self, conn: PgConnection) -> bool:
        conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        if conn.execute(f"SELECT pg_try_advisory_xact_lock({_LOCK_ARGS})").fetchall()[0][0]:
            return True
        conn.execute("ROLLBACK")
        return False

    def reconnect_writer(self) -> PgConnection:
        """A new write connection after the last one was lost, made with bounded backoff
        while the server is out of reach (``Outage.retry``: until the outage deadline). If
        the old connection held the writer lock, the new one takes it again before anything
        is written; if another writer holds it by now (a standby took over when the old
        session ended), ``WriterLockLost``, now and at every later reconnect: this writer
        must not write again."""
        if self.lock_lost is not None:
            raise self.lock_lost
        conn = self.outage.retry(self.connect_writer)
        if self.writer_locked:
            try:
                take_writer_lock(conn, wait=False)
            except StoreError as exc:
                holder = None
                with contextlib.suppress(Exception):
                    holder = lock_holder(conn)
                conn.close()
                self.lock_lost = WriterLockLost(
                    f"{self.location}: the connection to PostgreSQL was lost, and with it "
                    f"the writer lock, held now by {holder or 'another writer'}; this "
                    "writer stops and writes nothing more", hint="nothing it acknowledged "
                    "is lost; the writer that has the lock (a standby that took over) goes "
                    "on", path=self.location)
                raise self.lock_lost from exc
            except BaseException:
                conn.close()
                raise
        return conn

    def migrate(self, conn: PgConnection) -> int:
        return apply_pg_migrations(conn)

    @contextlib.contextmanager
    def reader(self) -> Iterator[PgConnection]:
        """A read-only connection, made again when it is lost (``PgConnection``): a reader
        that was running rides through a restart of the server. One that cannot connect at
        first is refused at once."""
        with map_pg_errors(self.conninfo):
            conn = connect(self.conninfo, read_only=True, outage=self.outage)
        try:
            yield conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[PgConnection]:
        with self.reader() as conn, map_pg_errors(self.conninfo):
            conn.execute(POSTGRESQL.begin_read)  # on a new connection if this one was lost
            try:
                yield conn
            finally:
                if not conn.broken:
                    conn.raw.execute("ROLLBACK")

    def errors(self) -> contextlib.AbstractContextManager[None]:
        return map_pg_errors(self.conninfo)

    def is_sync_failure(self, exc: BaseException) -> bool:
        # The server owns durability: with data_sync_retry off (checked at connect) a failed
        # fsync makes it PANIC and recover from its WAL, so what a new connection reads is
        # what is durable. The client never sees an fsync error of its own.
        return False

    def is_disconnect(self, exc: BaseException) -> bool:
        return is_disconnect(exc)

    def describe(self, exc: BaseException) -> str:
        code = getattr(exc, "sqlstate", None)
        return f"{type(exc).__name__}{f' (SQLSTATE {code})' if code else ''}: {exc}"

    def after_commit(self, conn: PgConnection, *, wal_limit_bytes: int,
                     counted: Callable[[str], None]) -> None:
        """Nothing: the server checkpoints its own WAL."""

    def copy_snapshot(self, dest: Path, *, progress: Progress | None = None) -> int:
        with map_pg_errors(self.conninfo):
            return copy_snapshot(self.conninfo, dest, progress=progress)
