"""A connection to a PostgreSQL store's server: what the server must promise, the small
part of apsw's surface the write path and the readers use, the driver's errors translated,
and riding through an outage.

The PostgreSQL backend (``postgresql.py``) is built in parts, lowest first: this module
(``PgConnection``, ``connect``), ``pglock`` (the writer's lock and the dialect whose write
transactions take it), ``pgschema`` (migrations, snapshots into SQLite and restores from
one, verify's schema check) and ``postgresql`` (``PostgresBackend``). Invariants here:
  - the server owns durability, and every connection checks that it can (``check_server``):
    ``fsync`` and ``full_page_writes`` on, ``data_sync_retry`` off (a failed fsync makes
    the server PANIC and recover from its WAL, instead of retrying an fsync that can no
    longer fail: the "fsyncgate" rule docs/design.md states for SQLite), and the session's
    ``synchronous_commit`` set to ``on`` (a commit is flushed when COMMIT returns);
  - the hot statements are the SQLite ones, their ``?`` and ``:name`` placeholders
    translated once per statement text (``_translate``), and results typed as SQLite
    types them (``_IntLoader``);
  - a reader's connection is made again when it is lost, with bounded backoff, on one
    outage clock per backend (``Outage``); the writer's never is (it resolves a lost batch
    itself);
  - psycopg errors become ``StoreError`` and its kin at one boundary, ``map_pg_errors``.
"""

from __future__ import annotations

import contextlib
import decimal
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .._errors import (
    DatabaseUnreachable,
    EvidenceError,
    OutageTooLong,
    StoreError,
)
from .location import redact

try:
    import psycopg
    import psycopg.errors
    from psycopg.adapt import Loader
    from psycopg.pq import TransactionStatus
except ImportError:  # pragma: no cover - only without the postgresql extra
    psycopg = None  # type: ignore[assignment]
    Loader = object  # type: ignore[assignment,misc]

__all__ = ["DEFAULT_LOCK_TIMEOUT_MS", "OUTAGE_DEADLINE", "Outage", "PgConnection",
           "TextHoldsNul", "check_server", "connect", "is_disconnect", "map_pg_errors"]

log = logging.getLogger("evidence.postgresql")

DEFAULT_LOCK_TIMEOUT_MS = 5_000
OUTAGE_DEADLINE = 60.0  # seconds the server may stay out of reach before a command gives up
_FIRST_DELAY, _MAX_DELAY = 0.1, 1.0  # reconnect backoff: 0.1 s doubling to 1 s
MIN_SERVER_VERSION = 130000


def _need_driver() -> None:
    if psycopg is None:
        raise StoreError("a PostgreSQL store needs the psycopg driver, which is not installed",
                         hint="pip install 'evidence[postgresql]'")


# --- errors ----------------------------------------------------------------------------

class TextHoldsNul(Exception):
    """A text value holds U+0000, which PostgreSQL text cannot store (SQLite can): the
    message is refused, as a row the schema refuses is (``ConstraintError``)."""


def _error_classes() -> tuple[type[Exception], ...]:
    if psycopg is None:  # pragma: no cover
        return (Exception, Exception, Exception)
    constraint = type("ConstraintError", (psycopg.errors.IntegrityError, TextHoldsNul), {})
    return (psycopg.Error, psycopg.errors.LockNotAvailable, constraint)


_Error, _BusyError, _ConstraintError = _error_classes()


def is_disconnect(exc: BaseException) -> bool:
    """The connection to the server was lost (the server stopped, restarted or is out of
    reach): whatever the transaction had not committed is rolled back by the server."""
    if psycopg is None or not isinstance(exc, psycopg.Error):
        return False
    if isinstance(exc, (psycopg.errors.AdminShutdown, psycopg.errors.CrashShutdown,
                        psycopg.errors.CannotConnectNow)):
        return True
    return isinstance(exc, psycopg.OperationalError) and getattr(exc, "sqlstate", None) in (
        None, "08000", "08003", "08006", "57P01", "57P02", "57P03")


@contextlib.contextmanager
def map_pg_errors(location: str) -> Iterator[None]:
    """Translate psycopg errors at the store boundary, keeping the SQLSTATE."""
    try:
        yield
    except EvidenceError:
        raise
    except Exception as exc:
        if psycopg is None or not isinstance(exc, psycopg.Error):
            raise
        where = redact(location)
        if is_disconnect(exc):
            raise StoreError(f"{where}: the connection to PostgreSQL was lost ({exc})",
                             hint="check that the server runs and is reachable, then retry",
                             path=where, sqlstate=exc.sqlstate) from exc
        if isinstance(exc, psycopg.errors.DiskFull):
            raise StoreError(f"{where}: the server's disk is full ({exc})",
                             hint="free disk space on the database server and retry",
                             path=where, sqlstate=exc.sqlstate) from exc
        raise StoreError(f"{where}: {str(exc).strip()}", path=where,
                         sqlstate=getattr(exc, "sqlstate", None)) from exc


# --- outages: the server restarted, or out of reach ------------------------------------

_T = TypeVar("_T")


class Outage:
    """How long a store's server has been out of reach, shared by every connection of one
    backend (the writer's and the readers'), so that a crawl or a service has one clock for
    one outage, says once that it waits, and gives up once, past ``deadline`` seconds.

    The clock starts when a connection cannot be *made* (a session that broke is made again
    at once: after a restart, or after its session was terminated, that just works), and
    stops at the first connection made again. ``since`` (wall time) is what a progress line
    shows while it runs."""

    def __init__(self, location: str, deadline: float = OUTAGE_DEADLINE) -> None:
        self.location = location
        self.deadline = deadline
        self.since: float | None = None  # time.time() of the first failed connect
        self._started = 0.0  # time.monotonic() of the same
        self._lock = threading.Lock()

    def retry(self, attempt: Callable[[], _T]) -> _T:
        """``attempt()`` (a connect), again with bounded backoff while the server is out of
        reach (a refused or lost connection), until the outage is ``deadline`` seconds old:
        then ``StoreError`` saying so. Any other error is raised at once."""
        delay = _FIRST_DELAY
        while True:
            try:
                result = attempt()
            except Exception as exc:
                if not (isinstance(exc, DatabaseUnreachable) or is_disconnect(exc)):
                    raise
                left = self._lost(exc)
                if left <= 0:
                    raise self._expired(exc) from exc
                time.sleep(min(delay, left))
                delay = min(delay * 2, _MAX_DELAY)
                continue
            if self.since is not None:
                self._back()
            return result

    def _lost(self, exc: BaseException) -> float:
        with self._lock:
            if self.since is None:
                self.since, self._started = time.time(), time.monotonic()
                log.warning("database unreachable since %s (%s): retrying for up to %g s",
                            _clock(self.since), _first_line(exc), self.deadline,
                            extra={"event": "postgresql.unreachable"})
            return self._started + self.deadline - time.monotonic()

    def _back(self) -> None:
        with self._lock:
            if self.since is not None:
                log.warning("database reachable again after %.1f s (unreachable since %s)",
                            time.monotonic() - self._started, _clock(self.since),
                            extra={"event": "postgresql.reachable"})
                self.since = None

    def _expired(self, exc: BaseException) -> StoreError:
        where = redact(self.location)
        since = _clock(self.since or time.time())
        return OutageTooLong(
            f"{where}: the database has been unreachable since {since}, for longer than "
            f"the outage deadline of {self.deadline:g} s ({_first_line(exc.__cause__ or exc)})",
            hint="start the server (or mend the network), then run the command again "
            "(a crawl resumes where it stopped); --db-outage-deadline SECONDS waits longer",
            path=where)


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(when))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --- the connection: the small part of apsw's the write path and the readers use -------

_TOKEN = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|--[^\n]*|/\*.*?\*/|::|"""
                    r""":[A-Za-z_]\w*|\?|%""", re.S)
_DML = ("INSERT", "UPDATE", "DELETE")


def _translate(sql: str) -> str:
    """SQLite's ``?`` and ``:name`` placeholders as psycopg's, ``%`` escaped; quoted text,
    identifiers and comments untouched."""
    def one(match: re.Match[str]) -> str:
        token = match.group()
        if token[0] == "'":  # psycopg reads % in quoted text too
            return token.replace("%", "%%")
        if token == "?":
            return "%s"
        if token == "%":
            return "%%"
        if token[0] == ":" and token != "::":
            return f"%({token[1:]})s"
        return token
    return _TOKEN.sub(one, sql)


class _IntLoader(Loader):
    """numeric (sum, avg) and boolean results as SQLite gives them: a whole number as an
    int, a fraction as a float, true and false as 1 and 0."""

    def load(self, data: Any) -> Any:
        text = bytes(data).decode()
        if text in ("t", "f"):
            return int(text == "t")
        value = decimal.Decimal(text)
        if value.is_finite() and value == value.to_integral_value():
            return int(value)
        return float(value)


class PgCursor:
    """A cursor with apsw's surface: ``execute`` returns it, iterating gives tuples."""

    __slots__ = ("_conn", "_cursor")

    def __init__(self, conn: PgConnection) -> None:
        self._conn = conn
        self._cursor = conn.raw.cursor()

    def execute(self, statement: str, binding: Any = None) -> PgCursor:
        conn = self._conn
        if conn.outage is None:
            conn._run(self._cursor, statement, binding)
            return self
        while True:
            idle = conn.raw.info.transaction_status == TransactionStatus.IDLE
            try:
                conn._run(self._cursor, statement, binding)
                return self
            except psycopg.Error as exc:
                if not (idle and is_disconnect(exc)):
                    raise
            conn.reopen()  # a read on its own, outside a transaction: run it again
            self._cursor = conn.raw.cursor()

    def executemany(self, statement: str, sequenceofbindings: Any) -> PgCursor:
        self._conn._run_many(self._cursor, statement, sequenceofbindings)
        return self

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._cursor.pgresult is None or self._cursor.description is None:
            raise StopIteration
        row = self._cursor.fetchone()
        if row is None:
            raise StopIteration
        return row

    def fetchall(self) -> list[Any]:
        if self._cursor.description is None:
            return []
        return self._cursor.fetchall()

    def fetchone(self) -> Any:
        return None if self._cursor.description is None else self._cursor.fetchone()

    def close(self) -> None:
        self._cursor.close()


class PgConnection:
    """A psycopg connection behind ``backend.Connection``: SQLite-style statements, explicit
    BEGIN/COMMIT (the psycopg connection is in autocommit mode, as apsw's is until BEGIN),
    ``changes``/``total_changes`` from row counts, and ``last_insert_rowid`` from the
    ``RETURNING`` the PostgreSQL dialect adds to the two inserts that need it.

    A reader's connection (``outage`` given, opened read-only) rides through a restart of
    the server or the end of its session: a statement it runs outside a transaction (every
    count, frontier read and lookup, and the BEGIN of a snapshot) that finds the connection
    lost is run again on a new one, made with bounded backoff (``Outage.retry``). Reads are
    all it runs, so running one again changes nothing. Inside a transaction a lost
    connection is an error: what the transaction saw cannot be seen again. The writer's
    connection never does this: the writer resolves a lost batch itself."""

    def __init__(self, raw: Any, location: str, outage: Outage | None = None,
                 reopen: Callable[[], Any] | None = None) -> None:
        self.raw = raw
        self.location = location
        self.outage = outage
        self._reopen = reopen
        self._changes = 0
        self._total = 0
        self._last: Any = None  # the cursor of the last statement (for last_insert_rowid)
        self._sql: dict[str, tuple[str, bool]] = {}

    def _statement(self, statement: str) -> tuple[str, bool]:
        known = self._sql.get(statement)
        if known is None:
            if len(self._sql) > 2000:
                self._sql.clear()
            known = self._sql[statement] = (
                _translate(statement), statement.lstrip().upper().startswith(_DML))
        return known

    def _run(self, cursor: Any, statement: str, binding: Any) -> None:
        if binding is None or (not binding and not isinstance(binding, dict)):
            cursor.execute(statement)  # no placeholders: % is taken as it is
            dml = statement.lstrip().upper().startswith(_DML)
        else:
            sql, dml = self._statement(statement)
            try:
                cursor.execute(sql, binding)
            except psycopg.DataError as exc:
                _nul(exc)
                raise
        self._ran(cursor, dml)

    def _run_many(self, cursor: Any, statement: str, bindings: Any) -> None:
        sql, dml = self._statement(statement)
        try:
            cursor.executemany(sql, bindings)
        except psycopg.DataError as exc:
            _nul(exc)
            raise
        self._ran(cursor, dml)

    def _ran(self, cursor: Any, dml: bool) -> None:
        """After a statement: its cursor is the last, and a change counts (``changes()``)."""
        self._last = cursor
        if dml:
            self._changes = max(cursor.rowcount, 0)
            self._total += self._changes

    def execute(self, statement: str, binding: Any = None) -> PgCursor:
        return PgCursor(self).execute(statement, binding)

    def executemany(self, statement: str, sequenceofbindings: Any) -> PgCursor:
        return PgCursor(self).executemany(statement, sequenceofbindings)

    def cursor(self) -> PgCursor:
        return PgCursor(self)

    def changes(self) -> int:
        return self._changes

    def total_changes(self) -> int:
        return self._total

    def last_insert_rowid(self) -> int:
        row = self._last.fetchone() if self._last is not None else None
        if row is None:
            raise StoreError("no row id: the last statement returned none")
        return int(row[0])

    def get_autocommit(self) -> bool:
        return self.raw.info.transaction_status == TransactionStatus.IDLE

    def close(self) -> None:
        self.raw.close()

    def reopen(self) -> None:
        """Replace the lost connection with a new one (``Outage.retry``: waits for the
        server, up to the outage deadline)."""
        assert self.outage is not None and self._reopen is not None
        with contextlib.suppress(Exception):
            self.raw.close()
        self.raw = self.outage.retry(self._reopen)

    @property
    def broken(self) -> bool:
        return self.raw.closed or self.raw.broken


def _nul(exc: BaseException) -> None:
    if "NUL" in str(exc):
        raise _ConstraintError(
            "a text value holds U+0000 (NUL), which PostgreSQL text cannot store") from exc


# --- the server's policy: what a store requires of it ------------------------------------

def check_server(conn: PgConnection) -> None:
    """Refuse a server that cannot keep a commit: fsync or full_page_writes off, or fsync
    failures retried (``data_sync_retry``), or a version older than 13."""
    settings = dict(conn.raw.execute(
        "SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'full_page_writes', "
        "'data_sync_retry', 'server_version_num')").fetchall())
    where = redact(conn.location)
    if int(settings.get("server_version_num", "0")) < MIN_SERVER_VERSION:
        raise StoreError(f"{where}: PostgreSQL {settings.get('server_version_num')} is too old "
                         "(13 or newer is needed)", hint="use PostgreSQL 13 or newer",
                         path=where)
    wrong = [f"{name} is {settings.get(name)!r}, needs {want!r}" for name, want in
             (("fsync", "on"), ("full_page_writes", "on"), ("data_sync_retry", "off"))
             if name in settings and settings[name] != want]
    if wrong:
        raise StoreError(
            f"{where}: the server cannot guarantee that a commit survives a crash: "
            + "; ".join(wrong),
            hint="set fsync = on, full_page_writes = on and data_sync_retry = off in "
            "postgresql.conf and restart the server", path=where)


def connect(location: str, *, lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
            read_only: bool = False, outage: Outage | None = None) -> PgConnection:
    """A connection with the policy applied: checked server, synchronous commits, bounded
    lock waits, results typed as SQLite types them, and a name saying who holds it.
    ``outage`` (a reader's): the connection is made again when it is lost (``PgConnection``)."""
    def open_raw() -> Any:
        return _open_raw(location, lock_timeout_ms=lock_timeout_ms, read_only=read_only)

    return PgConnection(open_raw(), location, outage if read_only else None, open_raw)


def _open_raw(location: str, *, lock_timeout_ms: int, read_only: bool) -> Any:
    _need_driver()
    try:
        raw = psycopg.connect(location, autocommit=True,
                              application_name=f"evidence pid={os.getpid()} "
                                               f"host={socket.gethostname()}"[:63])
    except psycopg.OperationalError as exc:
        where = redact(location)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatabaseUnreachable(f"{where}: cannot connect to PostgreSQL ({first})",
                           hint="check the connection string, that the server runs, and that "
                           "it lets this user in", path=where) from exc
    try:
        for name in ("numeric", "bool"):
            raw.adapters.register_loader(name, _IntLoader)
        check_server(PgConnection(raw, location))
        raw.execute(f"SET lock_timeout = {int(lock_timeout_ms)}")
        raw.execute("SET synchronous_commit = on")  # durable when COMMIT returns
        raw.execute("SET idle_in_transaction_session_timeout = 0")
        # Every execution planned for its own parameters: a prepared statement's generic
        # plan, made while a table was small, kept scanning url_identity whole for each
        # batch's URL lookup once it was not (513 msgs/s instead of 2,500, measured).
        raw.execute("SET plan_cache_mode = force_custom_plan")
        if read_only:
            raw.execute("SET default_transaction_read_only = on")
    except BaseException:
        raw.close()
        raise
    return raw
