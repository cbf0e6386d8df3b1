"""The PostgreSQL store backend: connections, the server's durability, migrations, the
writer's lock, snapshots, errors.

A PostgreSQL store is one database (its tables are the SQLite store's, mirrored by
``schema/postgresql/NNN_name.sql``) and an artifact directory named by the store's meta
(``artifacts``), given when the store is created. This module owns ``PostgresBackend``,
the second implementation of ``backend.StoreBackend``. Invariants:
  - the server owns durability, and the backend checks at every connection that it can:
    ``fsync`` and ``full_page_writes`` on, ``data_sync_retry`` off (a failed fsync makes
    the server PANIC and recover from its WAL, instead of retrying an fsync that can no
    longer fail: the "fsyncgate" rule docs/design.md states for SQLite), and the session's
    ``synchronous_commit`` set to ``on`` (a commit is flushed when COMMIT returns);
  - one writer per store: the writer's connection holds a session-level advisory lock
    (``WRITER_LOCK``) for its whole life; a second writer waits for it (a standby) or is
    refused, and every write transaction also takes the transaction-level form of the same
    lock, so any other write (a migration, ``evidence init``) waits for the writer;
  - the same messages make the same rows, ids included, as on SQLite: the migrations give
    the next id as SQLite's rowid does, and the hot statements are the SQLite ones, their
    ``?`` and ``:name`` placeholders translated once per statement text (``_translate``);
  - ``copy_snapshot`` writes one REPEATABLE READ snapshot into a private SQLite file made
    by the SQLite migrations of the store's version, which is what the canonical dump, the
    archives and verify read: both engines export the same bytes for the same evidence;
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
from pathlib import Path
from typing import Any, TypeVar

import apsw

from .._errors import (
    DatabaseUnreachable,
    EvidenceError,
    MigrationError,
    OutageTooLong,
    StoreError,
    WriterLockLost,
)
from .._model.messages import new_id, now_text
from .backend import Dialect, Progress
from .location import redact
from .sqlite import CLOSE_LEGACY_QUARANTINE, apply_migrations, load_migrations, schema_dir

try:
    import psycopg
    import psycopg.errors
    from psycopg.adapt import Loader
    from psycopg.pq import TransactionStatus
except ImportError:  # pragma: no cover - only without the postgresql extra
    psycopg = None  # type: ignore[assignment]
    Loader = object  # type: ignore[assignment,misc]

__all__ = ["POSTGRESQL", "PostgresBackend", "redact"]

log = logging.getLogger("evidence.postgresql")

# One writer per store. Advisory locks belong to one database, which is one store, so a
# fixed key is enough: ('evid', 1).
WRITER_LOCK = (0x65766964, 1)
_LOCK_ARGS = f"{WRITER_LOCK[0]}, {WRITER_LOCK[1]}"

POSTGRESQL = Dialect(
    name="postgresql",
    # The transaction-level form of the writer's lock: re-entrant for the writer's own
    # connection (it holds the session-level one), a wait for any other.
    begin_write=f"BEGIN ISOLATION LEVEL READ COMMITTED; SELECT pg_advisory_xact_lock({_LOCK_ARGS})",
    begin_read="BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
    list_member="{column} = ANY({param})",
    encode_list=list,
    returning=True,
)

DEFAULT_LOCK_TIMEOUT_MS = 5_000
OUTAGE_DEADLINE = 60.0  # seconds the server may stay out of reach before a command gives up
_FIRST_DELAY, _MAX_DELAY = 0.1, 1.0  # reconnect backoff: 0.1 s doubling to 1 s
MIN_SERVER_VERSION = 130000
_PG_MIGRATIONS = "postgresql"


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
        self._last = cursor
        if dml:
            self._changes = max(cursor.rowcount, 0)
            self._total += self._changes

    def _run_many(self, cursor: Any, statement: str, bindings: Any) -> None:
        sql, dml = self._statement(statement)
        try:
            cursor.executemany(sql, bindings)
        except psycopg.DataError as exc:
            _nul(exc)
            raise
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


# --- migrations ---------------------------------------------------------------------------

def pg_migrations() -> list[tuple[int, str, str, str]]:
    """(version, name, checksum, sql) of ``schema/postgresql``: one per SQLite migration,
    with the same number and name."""
    mine = load_migrations(schema_dir() / _PG_MIGRATIONS)
    canonical = load_migrations()
    if [(v, n) for v, n, _c, _s in mine] != [(v, n) for v, n, _c, _s in canonical]:
        raise MigrationError("schema/postgresql does not mirror schema/: every NNN_name.sql "
                             "needs its PostgreSQL twin")
    return mine


def _tables_exist(conn: PgConnection, *names: str) -> set[str]:
    return {n for (n,) in conn.raw.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = "
        "current_schema() AND table_name = ANY(%s)", (list(names),))}


def apply_pg_migrations(conn: PgConnection) -> int:
    """Check applied migrations, apply the new ones (each in its own transaction, under
    the writer's lock); return the schema version.

    ``schema_migration`` holds what a SQLite store holds (the canonical migration's name
    and checksum: its dump's schema is the SQLite one); ``postgresql_migration`` the
    checksum of the file applied here. An edit of either file after it was applied, or a
    store newer than the program, is refused as on SQLite.
    """
    canonical = load_migrations()
    mine = pg_migrations()
    raw = conn.raw
    raw.execute("CREATE TABLE IF NOT EXISTS schema_migration (version bigint PRIMARY KEY, "
                "name text NOT NULL, checksum text NOT NULL, applied_at text NOT NULL)")
    raw.execute("CREATE TABLE IF NOT EXISTS postgresql_migration (version bigint PRIMARY KEY,"
                " name text NOT NULL, checksum text NOT NULL, applied_at text NOT NULL)")
    applied = {v: (n, c) for v, n, c in raw.execute(
        "SELECT version, name, checksum FROM schema_migration ORDER BY version")}
    applied_pg = {v: c for v, c in raw.execute(
        "SELECT version, checksum FROM postgresql_migration")}
    newest = len(canonical)
    if applied and max(applied) > newest:
        raise MigrationError(
            f"the store has schema version {max(applied)}, newer than this program "
            f"supports ({newest})", hint="upgrade evidence to open this store",
            schema_version=max(applied))
    pairs = list(zip(canonical, mine, strict=True))
    for (version, name, checksum, _sql), (_v, _n, pg_checksum, _s) in pairs:
        stored = applied.get(version)
        if stored is not None and (stored[1] != checksum or
                                   applied_pg.get(version, pg_checksum) != pg_checksum):
            which = ("schema/postgresql/" if stored[1] == checksum else "schema/")
            raise MigrationError(
                f"migration {version:03d}_{name} was edited after it was applied "
                f"({which}{version:03d}_{name}.sql differs from what the store recorded)",
                hint="never edit an applied migration; add a new NNN_name.sql instead",
                schema_version=version)
    for (version, name, checksum, _sql), (_v, _n, pg_checksum, sql) in pairs:
        if version in applied:
            continue
        now = now_text()
        conn.execute(POSTGRESQL.begin_write)
        try:
            raw.execute(sql)
            raw.execute("INSERT INTO schema_migration VALUES (%s, %s, %s, %s)",
                        (version, name, checksum, now))
            raw.execute("INSERT INTO postgresql_migration VALUES (%s, %s, %s, %s)",
                        (version, name, pg_checksum, now))
            raw.execute("COMMIT")
        except BaseException:
            if not conn.broken and not conn.get_autocommit():
                raw.execute("ROLLBACK")
            raise
    return newest


def _create_schema(conn: PgConnection, version: int) -> None:
    """Inside the caller's transaction: the tables of migrations 001..``version`` and the
    postgresql_migration rows (restore writes schema_migration's rows from its archive)."""
    raw = conn.raw
    raw.execute("CREATE TABLE schema_migration (version bigint PRIMARY KEY, "
                "name text NOT NULL, checksum text NOT NULL, applied_at text NOT NULL)")
    raw.execute("CREATE TABLE postgresql_migration (version bigint PRIMARY KEY,"
                " name text NOT NULL, checksum text NOT NULL, applied_at text NOT NULL)")
    now = now_text()
    for number, name, pg_checksum, sql in pg_migrations()[:version]:
        raw.execute(sql)
        raw.execute("INSERT INTO postgresql_migration VALUES (%s, %s, %s, %s)",
                    (number, name, pg_checksum, now))


def restore_rows(location: str, source: Path, version: int, artifacts: str,
                 check: Callable[[Path], list[str]]) -> list[str]:
    """Load every row of the SQLite database ``source`` (a loaded, checked dump) into the
    empty database ``location``, with the schema of ``version``, in one transaction; before
    it commits, its snapshot is handed to ``check`` (which re-dumps it against the
    manifest): any problem rolls everything back, and the database is left empty.
    Returns the problems (empty: committed)."""
    conn = connect(location)
    try:
        if _tables_exist(conn, "schema_migration", "store_meta", "ingest_ledger"):
            where = redact(location)
            raise StoreError(f"{where} is not empty: it holds an evidence store already",
                             hint="restore into a new, empty database", path=where)
        src = apsw.Connection(str(source), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            conn.execute(POSTGRESQL.begin_write)
            raw = conn.raw
            _create_schema(conn, version)
            raw.execute("SET CONSTRAINTS ALL DEFERRED")  # whole tables, in the dump's order
            for (name,) in src.execute(
                    "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE "
                    "'sqlite\\_%' ESCAPE '\\' ORDER BY name").fetchall():
                columns = [c for _cid, c, *_ in src.execute(f"PRAGMA table_info({name})")]
                cols = ", ".join(columns)
                with raw.cursor().copy(f"COPY {name} ({cols}) FROM STDIN") as copy:
                    for row in src.execute(f"SELECT {cols} FROM {name}"):
                        copy.write_row(row)
            raw.execute("INSERT INTO store_meta (key, value) VALUES ('artifacts', %s) "
                        "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (artifacts,))
            raw.execute("SET CONSTRAINTS ALL IMMEDIATE")  # every reference checked, here
            with contextlib.ExitStack() as stack:
                scratch = Path(stack.enter_context(_scratch_dir(source.parent)))
                snapshot_into(conn, scratch / "check.db", version)
                problems = check(scratch / "check.db")
            raw.execute("ROLLBACK" if problems else "COMMIT")
            return problems
        except BaseException:
            if not conn.broken and not conn.get_autocommit():
                conn.raw.execute("ROLLBACK")
            raise
        finally:
            src.close()
    finally:
        conn.close()


@contextlib.contextmanager
def _scratch_dir(near: Path) -> Iterator[str]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix=".evidence-check-", dir=near) as path:
        yield path


def applied_version(conn: PgConnection) -> int:
    """The schema version of a store opened for reading (nothing applied); newer refused."""
    if "schema_migration" not in _tables_exist(conn, "schema_migration"):
        raise StoreError(f"{redact(conn.location)}: no evidence store in this database "
                         "(it has no schema_migration table)",
                         hint=f"create one with 'evidence init {redact(conn.location)} "
                         "--artifacts DIR'", path=redact(conn.location))
    version = conn.raw.execute(
        "SELECT coalesce(max(version), 0) FROM schema_migration").fetchall()[0][0]
    newest = len(load_migrations())
    if version > newest:
        raise MigrationError(
            f"the store has schema version {version}, newer than this program supports "
            f"({newest})", hint="upgrade evidence to open this store", schema_version=version)
    return int(version)


def ensure_store_id(conn: PgConnection, artifacts: str | None) -> None:
    """Give a new store its identity and its artifact location, once."""
    conn.execute(POSTGRESQL.begin_write)
    try:
        conn.raw.execute(
            "INSERT INTO store_meta (key, value) VALUES ('store_id', %s), ('created_at', %s),"
            " ('created_on', %s) ON CONFLICT (key) DO NOTHING",
            (new_id("store-"), now_text(), socket.gethostname()))
        conn.raw.execute(CLOSE_LEGACY_QUARANTINE)
        if artifacts is not None:
            conn.raw.execute("INSERT INTO store_meta (key, value) VALUES ('artifacts', %s) "
                             "ON CONFLICT (key) DO NOTHING", (artifacts,))
        conn.raw.execute("COMMIT")
    except BaseException:
        if not conn.broken and not conn.get_autocommit():
            conn.raw.execute("ROLLBACK")
        raise


# --- the writer's lock -----------------------------------------------------------------------

def lock_holder(conn: PgConnection) -> str | None:
    """Who holds the store's writer lock: its application name (pid and host) and since
    when; None if nobody does."""
    rows = conn.raw.execute(
        "SELECT a.application_name, a.client_addr::text, a.backend_start::text "
        "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = "
        "'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE "
        "datname = current_database()) AND l.classid = %s AND l.objid = %s AND "
        "l.objsubid = 2", WRITER_LOCK).fetchall()
    if not rows:
        return None
    name, addr, since = rows[0]
    return f"{name or 'a connection'}{f' from {addr}' if addr else ''}, connected since {since}"


def holder_pid(conn: PgConnection) -> tuple[int, str] | None:
    """(pid, host) of the process holding the writer lock, from its application name."""
    holder = lock_holder(conn)
    match = re.search(r"evidence pid=(\d+) host=(\S+)", holder or "")
    return (int(match[1]), match[2].rstrip(",")) if match else None


DEAD_HOLDER_WAIT_MS = 10_000  # a killed holder's server session ends within this


def take_writer_lock(conn: PgConnection, *, wait: bool,
                     on_wait: Callable[[str], None] | None = None) -> None:
    """Hold the store's writer lock on ``conn`` (session level: until it is released or
    the connection ends, however the process ends). ``wait``: as a standby, until the
    holder is gone; else refused at once, naming the holder, unless the holder is a
    process of this host that no longer exists (killed a moment ago: the server ends its
    session when it notices, and the lock with it), which is waited for, boundedly."""
    if conn.raw.execute(f"SELECT pg_try_advisory_lock({_LOCK_ARGS})").fetchall()[0][0]:
        return
    holder = lock_holder(conn) or "another connection"
    where = redact(conn.location)
    timeout = 0  # no bound: a standby waits as long as the holder lives
    if not wait:
        found = holder_pid(conn)
        if found is None or found[1] != socket.gethostname() or _alive(found[0]):
            raise StoreError(f"{where}: another writer holds this store ({holder})",
                             hint="stop it first (one writer per store), or start this one "
                             "as a standby that takes over when it ends", path=where)
        timeout = DEAD_HOLDER_WAIT_MS
    elif on_wait is not None:
        on_wait(holder)
    conn.raw.execute(f"SET lock_timeout = {timeout}")
    try:
        conn.raw.execute(f"SELECT pg_advisory_lock({_LOCK_ARGS})")
    finally:
        if not conn.broken:
            conn.raw.execute(f"SET lock_timeout = {DEFAULT_LOCK_TIMEOUT_MS}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def release_writer_lock(conn: PgConnection) -> None:
    if not conn.broken:
        conn.raw.execute(f"SELECT pg_advisory_unlock({_LOCK_ARGS})")


# --- snapshots into SQLite -------------------------------------------------------------------

# Keys of store_meta that say where a deployment keeps things, not what the store holds:
# a copy of the same store elsewhere exports the same bytes.
LOCAL_META = ("artifacts",)


def copy_snapshot(location: str, dest: Path, *, progress: Progress | None = None) -> int:
    """Copy one consistent snapshot of the store into the new SQLite file ``dest`` (with the
    SQLite schema of the store's version); return its size in pages.

    One REPEATABLE READ, READ ONLY transaction: the writer is never blocked (MVCC), and
    every table is read at the same instant.
    """
    conn = connect(location, read_only=True)
    try:
        conn.raw.execute(POSTGRESQL.begin_read)
        pages = snapshot_into(conn, dest, applied_version(conn), progress=progress)
        conn.raw.execute("COMMIT")
    finally:
        conn.close()
    return pages


def snapshot_into(conn: PgConnection, dest: Path, version: int, *,
                  progress: Progress | None = None) -> int:
    """What ``conn``'s transaction sees, written into the new SQLite file ``dest``: the
    schema SQLite migrations 001..``version`` make, then every row, ordered by primary key
    (the dump orders rows itself, so the file's order does not matter), columns by name.
    ``store_meta``'s local keys (``LOCAL_META``) are left out."""
    dst = apsw.Connection(str(dest), flags=apsw.SQLITE_OPEN_READWRITE
                          | apsw.SQLITE_OPEN_CREATE | apsw.SQLITE_OPEN_EXCLUSIVE)
    try:
        dst.execute("PRAGMA synchronous = OFF")  # fsynced by the caller when it keeps it
        apply_migrations(dst, load_migrations()[:version])
        dst.execute("DELETE FROM schema_migration")  # the store's own rows follow
        dst.execute("PRAGMA foreign_keys = OFF")
        dst.execute("PRAGMA ignore_check_constraints = ON")  # a copy of what is there
        tables = [(name, [c for _cid, c, *_ in dst.execute(f"PRAGMA table_info({name})")])
                  for (name,) in dst.execute(
                      "SELECT name FROM sqlite_schema WHERE type = 'table' AND "
                      "name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name")]
        raw = conn.raw
        total = sum(raw.execute(f"SELECT count(*) FROM {name}").fetchall()[0][0]
                    for name, _ in tables)
        done = 0
        dst.execute("BEGIN")
        for name, columns in tables:
            cols = ", ".join(columns)
            where = (" WHERE key <> ALL(%s)" if name == "store_meta" else "")
            insert = f"INSERT INTO {name} ({cols}) VALUES ({', '.join('?' * len(columns))})"
            with raw.cursor(name=f"snapshot_{name}") as cursor:  # server side: streamed
                cursor.itersize = 5000
                cursor.execute(f"SELECT {cols} FROM {name}{where} ORDER BY 1",
                               (list(LOCAL_META),) if where else None)
                while rows := cursor.fetchmany(5000):
                    dst.executemany(insert, rows)
                    done += len(rows)
                    if progress:
                        progress("snapshot", done, total)
        dst.execute("COMMIT")
        return dst.execute("PRAGMA page_count").fetchall()[0][0]
    finally:
        dst.close()


# --- the backend ---------------------------------------------------------------------------

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




# --- the server's objects against the migrations (verify) ------------------------------------

_REFERENCE = "evidence_verify_reference"


def _describe(raw: Any, schema: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(kind, name) -> (table, definition) of every table, column set, constraint, index,
    trigger (with whether it is enabled) and function in ``schema``, spelled without the
    schema's name so that two schemas made by the same migrations describe alike."""
    raw.execute("SELECT set_config('search_path', %s, true)", (schema,))
    found: dict[tuple[str, str], tuple[str, str]] = {}
    columns: dict[str, list[str]] = {}
    for table, column, kind, nullable, default in raw.execute(
            "SELECT table_name, column_name, data_type, is_nullable, "
            "coalesce(column_default, '') FROM information_schema.columns "
            "WHERE table_schema = %s ORDER BY table_name, ordinal_position", (schema,)):
        columns.setdefault(table, []).append(f"{column} {kind} {nullable} {default}")
    for table, spec in columns.items():
        found[("table", table)] = (table, "; ".join(spec))
    queries = (
        ("constraint", "SELECT c.relname, o.conname, pg_get_constraintdef(o.oid) FROM "
         "pg_constraint o JOIN pg_class c ON c.oid = o.conrelid JOIN pg_namespace n ON "
         "n.oid = o.connamespace WHERE n.nspname = %s"),
        ("index", "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE "
         "schemaname = %s"),
        ("trigger", "SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid) || ' ' || "
         "t.tgenabled::text FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN "
         "pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND NOT "
         "t.tgisinternal"),
        ("function", "SELECT '', p.proname, pg_get_functiondef(p.oid) FROM pg_proc p JOIN "
         "pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s"),
    )
    for kind, sql in queries:
        for table, name, definition in raw.execute(sql, (schema,)):
            text = definition.replace(f'"{schema}".', "").replace(f"{schema}.", "")
            found[(kind, f"{table}.{name}" if kind == "constraint" else name)] = (table, text)
    return found


def check_schema(location: str, add: Callable[..., None], version: int) -> int:
    """Compare the store's tables, constraints, indexes, triggers and functions with what
    schema/postgresql 001..``version`` creates, made again in a scratch schema inside a
    transaction that is rolled back (nothing is left; it needs the CREATE privilege on the
    database); and postgresql_migration's rows with the files. Findings go to ``add``."""
    conn = connect(location)
    raw = conn.raw
    try:
        raw.execute("BEGIN READ WRITE")
        try:
            home = raw.execute("SELECT current_schema()").fetchall()[0][0]
            have = _describe(raw, home)
            raw.execute(f"CREATE SCHEMA {_REFERENCE}")
            raw.execute(f"SET LOCAL search_path = {_REFERENCE}")
            for statement in (
                    "CREATE TABLE schema_migration (version bigint PRIMARY KEY, name text NOT "
                    "NULL, checksum text NOT NULL, applied_at text NOT NULL)",
                    "CREATE TABLE postgresql_migration (version bigint PRIMARY KEY, name text "
                    "NOT NULL, checksum text NOT NULL, applied_at text NOT NULL)"):
                raw.execute(statement)
            for _v, _n, _c, sql in pg_migrations()[:version]:
                raw.execute(sql)
            want = _describe(raw, _REFERENCE)
            recorded = {v: (n, c) for v, n, c in raw.execute(
                f'SELECT version, name, checksum FROM "{home}".postgresql_migration')}
        finally:
            raw.execute("ROLLBACK")
    finally:
        conn.close()
    for key in sorted(want.keys() | have.keys()):
        kind, name = key
        if key not in have:
            add("schema", f"{kind} {name} is missing (schema/postgresql creates it)",
                table=want[key][0] or None)
        elif key not in want:
            add("schema", f"{kind} {name} is not created by any migration",
                table=have[key][0] or None)
        elif want[key] != have[key]:
            add("schema", f"{kind} {name} differs from its migration"
                + ("" if kind != "trigger" or not have[key][1].endswith(" D")
                   else " (it is disabled)"), table=have[key][0] or None)
    files = {v: (n, c) for v, n, c, _s in pg_migrations()[:version]}
    for v in sorted(files.keys() | recorded.keys()):
        if recorded.get(v) != files.get(v):
            add("schema", f"postgresql_migration row {v} does not match "
                f"schema/postgresql/{v:03d}_{files.get(v, ('?',))[0]}.sql",
                table="postgresql_migration", row_id=v)
    return len(have)
