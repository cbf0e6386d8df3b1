"""A store whose database is PostgreSQL: ``Store.open("postgresql://...")`` returns one.

It is a ``StoreBase``, and the one ``Store.open`` returns is a ``Store`` too (the writer,
the readers, the archives and verify take it as they take a SQLite one; ``_store/db.py``
makes that class, so that this module never imports the one that opens it). Its backend
is ``PostgresBackend``, and its artifacts live where the store's
meta says (``store_meta.artifacts``, set once by ``evidence init URL --artifacts PATH``;
an open may name another path for the same payloads, as a host mounts them). What differs
from a SQLite store, and why:
  - no store directory: nothing is kept next to the database (no ``crawl.lock``, no
    ``sync-failed`` marker, no WAL): the writer's lock is an advisory lock in the
    database, and the server owns durability (``pgconn.check_server``);
  - a lost connection is not a lost store: ``reopen_connection`` reconnects with bounded
    backoff and takes the writer's lock again before anything is written (or, if another
    writer took it meanwhile, stops this one for good: ``WriterLockLost``), so the writer
    can resolve an in-doubt COMMIT from the commit log and go on (docs/store.md,
    "PostgreSQL"); readers reconnect by themselves, and a standby waiting for the lock
    connects again and goes on waiting. All of them share one outage clock and deadline.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .._errors import DatabaseUnreachable, StoreError, SyncError
from . import artifactspec
from .backend import ArtifactBackend
from .fileops import FileOps
from .location import is_s3_url, redact
from .packs import Layout, packs_sync_failed, resync_packs
from .pgconn import DEFAULT_LOCK_TIMEOUT_MS, OUTAGE_DEADLINE, PgConnection, connect, map_pg_errors
from .pglock import holder_pid, lock_holder, release_writer_lock, take_writer_lock
from .pgschema import applied_version, ensure_store_id
from .postgresql import PostgresBackend
from .s3location import S3Location
from .storebase import StoreBase, unfinished_creation

__all__ = ["PostgresStore", "open_artifacts"]

log = logging.getLogger("evidence.postgresql")

HOLDER_BACK_SECONDS = 10.0  # a standby that reconnected waits this long for the writer


def open_artifacts(spec: str, *, create: bool, read_only: bool, max_payload: int | None,
                   layout: Layout | None = None, hold: bool = True) -> ArtifactBackend:
    """The artifact store a PostgreSQL store names: an ``s3://`` location (what several
    hosts share), or a local directory (packs for a new one, or the layout it has)."""
    if is_s3_url(spec):
        return artifactspec.open_artifacts(spec, local=os.devnull, create=create,
                                           read_only=read_only, max_payload=max_payload,
                                           hold=hold)
    if "://" in spec:
        raise StoreError(f"artifacts at {spec!r}: a directory path or an s3:// URL",
                         hint="give --artifacts DIR or --artifacts s3://BUCKET/PREFIX")
    root = Path(spec)
    if not create and not root.is_dir():
        raise StoreError(f"the store's artifact directory {root} does not exist",
                         hint="mount it there, or give its path with --artifacts PATH",
                         path=str(root))
    if not read_only and packs_sync_failed(root):
        # A pack fsync failed in an earlier process: what reads show of those packs may
        # not be on the disk. Rewrite and fsync them before anything is trusted again
        # (a store directory does this in its resync, with the store's own marker).
        try:
            resync_packs(root, FileOps())
        except OSError as exc:
            raise SyncError(f"{root}: resyncing the payload packs failed ({exc})",
                            hint="check the disk (dmesg), then open the store again",
                            path=str(root)) from exc
    return artifactspec.open_artifacts(None, local=root, create=create and not read_only,
                                       read_only=read_only, max_payload=max_payload,
                                       layout=layout)


def _to_record(artifacts: str) -> str:
    """What the store records of ``--artifacts``: an s3:// URL with its options and no
    credential, or a directory's absolute path."""
    return S3Location(artifacts).url if is_s3_url(artifacts) else str(Path(artifacts).absolute())


def _recorded_artifacts(conn: PgConnection) -> str | None:
    """The artifact directory a store in this database records (None: no store, or none)."""
    exists = conn.raw.execute("SELECT to_regclass('store_meta') IS NOT NULL").fetchall()[0][0]
    if not exists:
        return None
    rows = conn.raw.execute("SELECT value FROM store_meta WHERE key = 'artifacts'").fetchall()
    return rows[0][0] if rows else None


class PostgresStore(StoreBase):
    """An open PostgreSQL store: its write connection (unless read-only) and artifacts."""

    backend: PostgresBackend  # type: ignore[assignment]
    connection: PgConnection

    def __init__(self, backend: PostgresBackend, connection: PgConnection,
                 artifacts: ArtifactBackend, *, schema_version: int, read_only: bool) -> None:
        # Not Store.__init__: nothing here is a file. The attributes the rest of the package
        # reads are set to what they mean for a server database.
        self.backend = backend
        self.connection = connection
        self.artifacts = artifacts
        self.schema_version = schema_version
        self.read_only = read_only
        self.sync = "full"
        self.busy_timeout_ms = backend.lock_timeout_ms
        self.sync_failed = None
        self.path = None  # type: ignore[assignment]
        self.db_path = None  # type: ignore[assignment]
        self.vfs = None
        self._lock_depth = 0
        self._store_id = ""

    @property
    def location(self) -> str:
        return self.backend.location

    @classmethod
    def open_location(cls, location: str, *, create: bool = False, read_only: bool = False,
                      artifacts: str | None = None, sync: str = "full",
                      max_payload: int | None = None, artifact_layout: Layout = "packs",
                      lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
                      outage_deadline: float = OUTAGE_DEADLINE) -> PostgresStore:
        """Open (``create``: create) the store in the database ``location`` names.
        ``outage_deadline``: seconds the server may stay out of reach (a restart) while the
        store is open before its readers and writer give up (``pgconn.Outage``)."""
        if sync != "full":
            raise StoreError("a PostgreSQL store is always sync='full': the server flushes "
                             "every commit (synchronous_commit = on)",
                             hint="leave out --sync for a PostgreSQL store")
        if artifacts is not None and is_s3_url(artifacts) and not read_only:
            artifactspec.check_given(artifacts)  # before anything is created
        backend = PostgresBackend(location, lock_timeout_ms=lock_timeout_ms,
                                  outage_deadline=outage_deadline)
        with map_pg_errors(location):
            conn = (connect(location, lock_timeout_ms=lock_timeout_ms, read_only=True)
                    if read_only else backend.connect_writer())
            try:
                if read_only or not create:
                    version = applied_version(conn)
                elif artifacts is None and _recorded_artifacts(conn) is None:
                    # Refused before anything is written: a new store needs its directory.
                    raise StoreError(f"{backend.location}: a new PostgreSQL store needs a "
                                     "directory for its payloads",
                                     hint="give one: --artifacts DIR (it is recorded in the "
                                     "store; later commands find it)", path=backend.location)
                if not read_only:
                    version = backend.migrate(conn)
                    if create:
                        ensure_store_id(conn, None if artifacts is None
                                        else _to_record(artifacts))
                meta = dict(conn.raw.execute("SELECT key, value FROM store_meta").fetchall())
                if "store_id" not in meta:  # its identity is recorded after its migrations
                    raise unfinished_creation(
                        backend.location, "its tables are there, its identity and payload "
                        "location are not", init="evidence init with the same URL and "
                        "--artifacts")
            except BaseException:
                conn.close()
                raise
        spec = artifacts if artifacts is not None else meta.get("artifacts")
        try:
            if spec is None:
                raise StoreError(f"{backend.location}: the store names no artifact location",
                                 hint="give one: --artifacts PATH", path=backend.location)
            recorded = meta.get("artifacts")
            if artifacts is not None and (is_s3_url(artifacts) or (
                    recorded is not None and is_s3_url(recorded))):
                # The object store's rules: the same bucket and prefix, other options allowed.
                spec = artifactspec.choose(recorded, artifacts, create=recorded is None,
                                           where=backend.location) or spec
            elif create and recorded not in (None, _to_record(spec)):
                log.info("artifacts of %s are in %s; this open uses %s", backend.location,
                         recorded, spec, extra={"event": "store.artifacts_elsewhere"})
            store_artifacts = open_artifacts(spec, create=create, read_only=read_only,
                                             max_payload=max_payload, layout=artifact_layout)
        except BaseException:
            conn.close()
            raise
        store = cls(backend, conn, store_artifacts, schema_version=version,
                    read_only=read_only)
        store._store_id = meta["store_id"]
        return store

    # --- what differs from a SQLite store ---------------------------------------------

    @contextlib.contextmanager
    def write_transaction(self) -> Iterator[Any]:
        self.check_writable()
        conn = self.connection
        with self.errors():
            conn.execute(self.backend.dialect.begin_write)
            try:
                yield conn
            except BaseException:
                if not conn.broken and not conn.get_autocommit():
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def reopen_connection(self) -> None:
        """A new write connection after the last one failed or was lost: reconnect with
        bounded backoff, and hold the writer lock again if the old one did."""
        self.check_writable()
        with contextlib.suppress(Exception):
            if self.backend.writer_locked:  # released now, not when the server notices
                release_writer_lock(self.connection)
        with contextlib.suppress(Exception):
            self.connection.close()
        with self.errors():
            self.connection = self.backend.reconnect_writer()

    def check_connection(self) -> None:
        """Make sure the write connection is alive, and so still holds the writer lock:
        the writer calls this while idle, so that a session the server ended (a restart,
        ``pg_terminate_backend``) is made again, and its lock taken again, at once, not at
        the next write, while a standby could take over meanwhile. Raises what
        ``reopen_connection`` raises (``WriterLockLost``: another writer has the lock)."""
        try:
            with self.errors():
                self.connection.raw.execute("SELECT 1")
            return
        except StoreError as exc:
            if not self.backend.is_disconnect(exc.__cause__ or exc):
                raise
        log.warning("the write connection to %s was lost while idle; connecting again",
                    self.location, extra={"event": "postgresql.connection_lost"})
        self.reopen_connection()

    def mark_sync_failed(self, reason: str) -> SyncError:
        """An fsync of a payload pack failed (the database's own fsyncs are the server's,
        which recovers from them by itself): nothing of the batch is acknowledged and the
        writer stops. The pack directory lists the pack (``PACKS/SYNC-FAILED``), so the
        next open for writing resyncs the packs before anything is trusted again."""
        if self.sync_failed is None:
            self.sync_failed = reason
        return self._sync_error()

    def check_synced(self) -> None:
        """Raise ``SyncError`` once a payload fsync failed in this process (the next open
        resyncs); the database itself needs no check: the server recovers by itself."""
        if self.sync_failed is not None:
            raise self._sync_error()

    def wal_size(self) -> int:
        return 0

    def close(self) -> None:
        """Close the artifact store first (packs: this process's pack is sealed and its
        lock released), then the connection (the writer lock goes with it)."""
        try:
            self.artifacts.close()
        finally:
            with contextlib.suppress(Exception):
                self.connection.close()

    # --- one writer per store --------------------------------------------------------

    @contextlib.contextmanager
    def writer_lock(self, *, wait: bool = False,
                    on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
        """Hold the store's writer lock (re-entrant) on the write connection: one writer
        per store. ``wait``: as a standby, until the holder ends (``on_wait`` is told who
        holds it first); else ``StoreError`` at once, naming the holder."""
        self.check_writable()
        if self._lock_depth == 0:
            self._take_writer_lock(wait=wait, on_wait=on_wait)
            self.backend.writer_locked = True
            self.backend.lock_lost = None
        self._lock_depth += 1
        try:
            yield
        finally:
            self._lock_depth -= 1
            if self._lock_depth == 0:
                self.backend.writer_locked = False
                with contextlib.suppress(Exception):
                    release_writer_lock(self.connection)

    def _take_writer_lock(self, *, wait: bool, on_wait: Callable[[str], None] | None) -> None:
        """``take_writer_lock`` on the write connection; a standby (``wait``) whose
        connection is lost while it waits (the server restarted) connects again, with
        bounded backoff (``Outage.retry``), and goes on waiting: it stays a standby."""
        lost = False
        while True:
            try:
                with self.errors():
                    if lost:
                        with contextlib.suppress(Exception):
                            self.connection.close()
                        self.connection = self.backend.outage.retry(self.backend.connect_writer)
                        self._let_holder_back()
                    take_writer_lock(self.connection, wait=wait, on_wait=on_wait)
                return
            except StoreError as exc:
                if not wait or isinstance(exc, DatabaseUnreachable) or \
                        not self.backend.is_disconnect(exc.__cause__ or exc):
                    raise
            log.warning("standby: the connection to %s was lost while waiting for the "
                        "writer lock; connecting again", self.location,
                        extra={"event": "postgresql.standby_connection_lost"})
            lost, on_wait = True, None

    def _let_holder_back(self) -> None:
        """After a restart every session is new and the lock free: the writer this standby
        stood by takes its lock again as soon as it reconnects (within a second while idle;
        ``Writer``). Give it ``HOLDER_BACK_SECONDS`` to, so that a blip does not hand the
        store to the standby (and stop the writer, which would find its lock taken)."""
        deadline = time.monotonic() + HOLDER_BACK_SECONDS
        while lock_holder(self.connection) is None and time.monotonic() < deadline:
            time.sleep(0.1)

    def writer_claim(self) -> contextlib.AbstractContextManager[None]:
        return self.writer_lock(wait=False)

    def running_writer(self) -> tuple[int, str] | None:
        """(pid, host) of the process that holds the writer lock, if any."""
        with self.backend.reader() as conn, self.errors():
            return holder_pid(conn)

    def __repr__(self) -> str:
        return f"PostgresStore({redact(self.backend.conninfo)!r})"

