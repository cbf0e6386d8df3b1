"""The store, and the one place a location becomes one: ``Store.open``.

A location is a store directory (``evidence.db``, SQLite's, and ``artifacts/``) or a
database (a PostgreSQL connection string: ``_store/pgstore.py``); which one is told by
``_store/location.py`` alone, and opened here alone. ``Store.open`` gives the store: its
database backend (``backend``, a ``StoreBackend``) and its artifact store (``artifacts``,
in the store's directory or at the ``s3://`` location it records: ``artifactspec``);
``Store.backends`` gives a reader the two without a store around them (the archives'
snapshots). An archive or any other URL is refused with what to do instead. Everything
else asks ``location`` what a location is (``is_server_database``, ``label``), never which
kind, so another database is one more kind there and one more opening here.

What every store shares is ``_store/storebase.py``. This module owns the store directory:
opening and closing it, and ``write_transaction()``; the contexts everything else reads it
through (``snapshot()``, ``errors()``) are the base's. What is particular to SQLite
(pragmas, migrations, connections, error codes) is in the backend, ``_store/sqlite.py``;
the payload files are ``_store/artifacts.py`` and ``_store/packs.py``. Invariants:
  - a store marked after a failed fsync is resynced before it is opened for writing
    (``_store/resync.py``), and an fsync that fails while opening marks it;
  - nothing is written to a path that is not (and cannot become) a store: a file, an
    archive, a directory of other things (``_check_store_path``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import apsw

from .._errors import CorruptStoreError, MigrationError, StoreError, SyncError
from . import artifactspec
from .backend import ArtifactBackend, StoreBackend
from .fileops import FileOps
from .location import database_kind, is_server_database
from .packs import Layout, resync_packs
from .resync import SYNC_MARKER, describe, is_sync_failure, mark_sync_failed, resync
from .runlock import crawl_lock, running_pid, stop
from .sqlite import (
    DB_NAME,
    DEFAULT_BUSY_TIMEOUT_MS,
    SQLiteBackend,
    Sync,
    WalFrames,
    applied_version,
    check_sqlite_version,
    connect_reader,
    load_migrations,
    map_sqlite_errors,
)
from .storebase import StoreBase, unfinished_creation

if TYPE_CHECKING:
    from .pgstore import PostgresStore

ARTIFACTS_DIR = "artifacts"

__all__ = ["ARTIFACTS_DIR", "DB_NAME", "Store", "stop_writer"]

# --- the store -----------------------------------------------------------------------

class Store(StoreBase):
    """An open store: one write connection (owned by the writer) and its artifact store.

    Use ``Store.open(path)`` (or ``Store.create(path)``), and close it when done; it is a
    context manager. Not thread-safe for concurrent writes: exactly one ``Writer`` uses
    ``connection``; readers call ``reader()`` for their own short-lived connections.
    """

    def __init__(self, path: Path, connection: apsw.Connection, artifacts: ArtifactBackend,
                 *, sync: Sync, busy_timeout_ms: int, schema_version: int,
                 vfs: str | None = None, file_ops: FileOps | None = None,
                 wal_frames: WalFrames | None = None, read_only: bool = False) -> None:
        self.path = path
        self.db_path = path / DB_NAME
        self.connection = connection
        self.artifacts = artifacts
        self.sync = sync
        self.busy_timeout_ms = busy_timeout_ms
        self.schema_version = schema_version
        self.vfs = vfs
        self.file_ops = file_ops or FileOps()
        self.wal_frames = wal_frames or WalFrames()  # frames in the WAL after the last commit
        # The database seam (backend.StoreBackend): what differs by engine goes through it.
        self.backend = SQLiteBackend(self.db_path, sync=sync, busy_timeout_ms=busy_timeout_ms,
                                     vfs=vfs, wal_frames=self.wal_frames)
        self.sync_failed: str | None = None  # why, once an fsync failed in this process
        self.read_only = read_only  # opened with read_only=True: ``connection`` cannot write
        self._store_id = self.meta("store_id")  # here, before any writer uses ``connection``

    @classmethod
    def open(cls, path: os.PathLike[str] | str, *, create: bool = False, sync: Sync = "full",
             busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
             max_payload: int | None = None, vfs: str | None = None,
             sqlite_version: str | None = None, file_ops: FileOps | None = None,
             read_only: bool = False, artifacts: str | None = None,
             artifact_layout: Layout = "packs", db_outage_deadline: float = 60.0) -> Store:
        """Open (or with ``create=True``, create) the store at ``path``.

        ``read_only=True`` opens a store on read-only media or someone else's for reading:
        nothing is created, migrated, resynced or written (``sqlite.connect_reader``), the
        artifact store refuses puts, and a ``Writer`` refuses the store.

        ``sync="normal"`` survives a process crash but may lose the last commits on power
        loss. ``vfs`` names a registered SQLite VFS and ``file_ops`` replaces the file
        operations of the store's own files and its artifacts (the fault-injection tests
        use both). ``sqlite_version`` overrides the version checked (for tests of the gate).

        A store marked after a failed fsync (``sync-failed``) is resynced first; if that
        fails, ``SyncError`` and nothing is opened.

        A new store keeps its payloads in packs (``artifact_layout="packs"``, the default)
        or one file each (``"files"``, the layout of stores made before packs). An
        existing store is opened in the layout it has, whatever this says: it is never
        converted silently (``evidence convert`` does that, when asked).

        ``artifacts``: an ``s3://bucket/prefix`` URL for a new store's payloads, recorded in
        the store; later opens find it there (``_store/artifactspec.py`` has the rules).
        Without one, payloads live in the store's ``artifacts/`` directory.

        ``path`` may also be a PostgreSQL connection string (``postgresql://...``, or libpq's
        ``host=... dbname=...``): the store is that database (``_store/pgstore.py``), its
        payloads in the directory or ``s3://`` location ``artifacts`` names (recorded when
        it is created). ``db_outage_deadline``: seconds such a server may stay out of reach
        (a restart, a dropped session) while the store is open before its reads and writes
        give up; until then they wait and go on (``pgconn.Outage``).
        """
        if isinstance(path, str) and re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", path) \
                and not is_server_database(path):
            raise StoreError(f"{path}: a store is a directory or a PostgreSQL database, not "
                             "a URL", path=path, hint="keep the store in a directory and its "
                             "payloads in S3: Store.create(DIR, artifacts='s3://BUCKET/PREFIX')")
        if database_kind(path) == "postgresql":
            store = _postgres_store().open_location(
                str(path), create=create, read_only=read_only, artifacts=artifacts, sync=sync,
                max_payload=max_payload, artifact_layout=artifact_layout,
                outage_deadline=db_outage_deadline)
            assert isinstance(store, Store)
            return store
        check_sqlite_version(sqlite_version)
        if sync not in ("full", "normal"):
            raise StoreError(f"sync must be 'full' or 'normal', not {sync!r}")
        root = Path(path)
        db_path = root / DB_NAME
        ops = file_ops or FileOps()
        _check_store_path(root, create=create and not read_only)
        if not read_only:
            _check_writable(root)
        if artifacts is not None and not read_only:
            artifactspec.check_given(artifacts)  # before anything is created
        if read_only:
            return cls._open_read_only(root, busy_timeout_ms=busy_timeout_ms,
                                       max_payload=max_payload, vfs=vfs, artifacts=artifacts)
        if create:
            # A new store's payload directory comes before its database (each new entry
            # durable in its parent): a creation cut short leaves no database (no store
            # here) or one beside its artifacts/, which an open finishes, never a database
            # whose payload directory is missing (the sign of a damaged store).
            local = artifacts is None and not db_path.exists()
            for directory in ops.makedirs(root / ARTIFACTS_DIR if local else root):
                ops.fsync_dir(directory.parent)
        if (root / SYNC_MARKER).exists():
            resync(root, DB_NAME, file_ops=ops, busy_timeout_ms=busy_timeout_ms, vfs=vfs,
                   also=lambda: resync_packs(root / ARTIFACTS_DIR, ops))
        hook = WalFrames()
        backend = SQLiteBackend(db_path, sync=sync, busy_timeout_ms=busy_timeout_ms, vfs=vfs,
                                wal_frames=hook)
        with _marking_sync_failures(root, ops), backend.errors():
            conn = backend.connect_writer(create=create)
            try:
                # Opening created the WAL. SQLite fsyncs its directory entry at its first
                # sync but ignores a failure there; this fsync's failure is seen.
                ops.fsync_dir(root)
                version = backend.migrate(conn)
            except BaseException:
                conn.close()
                raise
        try:
            with backend.errors():
                spec = artifactspec.choose(
                    artifactspec.recorded(conn), artifacts,
                    create=create and artifactspec.is_new(conn), where=str(root))
                if spec is not None and create:
                    artifactspec.record(conn, spec)
            if spec is None and not create and not (root / ARTIFACTS_DIR).is_dir():
                raise _no_payload_place(root, conn)
            payloads = artifactspec.open_artifacts(
                spec, local=root / ARTIFACTS_DIR, create=True, read_only=False,
                max_payload=max_payload, file_ops=ops, layout=artifact_layout,
                store_marker=root / SYNC_MARKER, hold=True)
        except BaseException:
            conn.close()
            raise
        if create:
            ops.fsync_dir(root)  # evidence.db's and artifacts/'s entries, on purpose
        return cls(root, conn, payloads, sync=sync, busy_timeout_ms=busy_timeout_ms,
                   schema_version=version, vfs=vfs, file_ops=ops, wal_frames=hook)

    @classmethod
    def _open_read_only(cls, root: Path, *, busy_timeout_ms: int, max_payload: int | None,
                        vfs: str | None, artifacts: str | None = None) -> Store:
        db_path = root / DB_NAME
        with map_sqlite_errors(db_path):
            conn = connect_reader(db_path, busy_timeout_ms, vfs=vfs)
            try:
                version = applied_version(conn, load_migrations())
                spec = artifactspec.choose(artifactspec.recorded(conn), artifacts,
                                           create=False, where=str(root))
                if spec is None and not (root / ARTIFACTS_DIR).is_dir():
                    raise _no_payload_place(root, conn)
            except BaseException:
                conn.close()
                raise
        try:
            payloads = artifactspec.open_artifacts(
                spec, local=root / ARTIFACTS_DIR, create=False, read_only=True,
                max_payload=max_payload)
        except BaseException:
            conn.close()
            raise
        return cls(root, conn, payloads, sync="full", busy_timeout_ms=busy_timeout_ms,
                   schema_version=version, vfs=vfs, read_only=True)

    @classmethod
    @contextlib.contextmanager
    def backends(cls, source: Store | os.PathLike[str] | str
                 ) -> Iterator[tuple[StoreBackend, ArtifactBackend]]:
        """(database backend, artifact store) of a Store, a store directory or a database
        location, read-only, open for the ``with`` block and closed when it ends (the
        archives read through these: ``_archive/snapshot.py``); an archive is refused.

        Nothing is handed out whose owner is already closed: what this opens (a PostgreSQL
        store's connection, an object store's client) lives exactly as long as the block. A
        ``Store`` passed in is its caller's, and stays open.
        """
        if isinstance(source, Store):
            yield source.backend, source.artifacts
            return
        if is_server_database(source):  # the version is checked at open
            with cls.open(source, read_only=True) as store:
                yield store.backend, store.artifacts
            return
        root = Path(source)
        if not (root / DB_NAME).is_file():
            if (root / "manifest.json").is_file():
                raise StoreError(f"{root} is an archive, not a store", path=str(root),
                                 hint=f"restore it first: evidence restore {root} --store NEW")
            raise StoreError(f"{root}: no evidence store here ({DB_NAME} not found)",
                             hint="pass a store directory (or a backup of one)", path=str(root))
        backend = SQLiteBackend(root / DB_NAME)
        _check_schema_version(backend)
        with backend.snapshot() as conn:
            spec = artifactspec.recorded(conn)
        artifacts = artifactspec.open_artifacts(spec, local=root / ARTIFACTS_DIR, create=False,
                                                read_only=True)
        try:
            yield backend, artifacts
        finally:
            artifacts.close()

    @classmethod
    def create(cls, path: os.PathLike[str] | str, **options: Any) -> Store:
        """Create a store (or open an existing one) at ``path``."""
        return cls.open(path, create=True, **options)

    @property
    def location(self) -> str:
        """What messages and reports call the store: its directory, or a connection string
        (without its password)."""
        return str(self.path)

    @contextlib.contextmanager
    def write_transaction(self) -> Iterator[apsw.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` on the write connection; rollback on error."""
        self.check_writable()
        conn = self.connection
        conn.execute(self.backend.dialect.begin_write)
        try:
            yield conn
        except BaseException:
            if not conn.get_autocommit():
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def reopen_connection(self) -> None:
        """Close and reopen the write connection (after a COMMIT whose outcome is unknown).

        Refused (``SyncError``) once an fsync failed: what a new connection reads is then
        no evidence of what is on the disk.
        """
        self.check_writable()
        with contextlib.suppress(apsw.Error):
            self.connection.close()  # never checkpoints on close (the policy)
        self.check_synced()
        with self.errors():
            self.connection = self.backend.connect_writer()

    def mark_sync_failed(self, reason: str) -> SyncError:
        """An fsync of this store failed: mark it (``sync-failed``) so that nothing is
        acknowledged from it until it is resynced; return the error that says so."""
        if self.sync_failed is None:
            self.sync_failed = reason
            mark_sync_failed(self.path, self.file_ops, reason)
        return self._sync_error()

    def check_synced(self) -> None:
        """Raise ``SyncError`` if an fsync of this store failed and it is not resynced yet
        (in this process, or in another one that left the marker)."""
        if self.sync_failed is not None or (self.path / SYNC_MARKER).exists():
            self.sync_failed = self.sync_failed or "the store is marked sync-failed"
            raise self._sync_error()

    def wal_size(self) -> int:
        """Bytes in the WAL file now (0 when absent)."""
        try:
            return (self.path / (DB_NAME + "-wal")).stat().st_size
        except FileNotFoundError:
            return 0

    def writer_lock(self, *, wait: bool = False,
                    on_wait: Callable[[str], None] | None = None
                    ) -> contextlib.AbstractContextManager[None]:
        """One writer per store: held by a crawl or a writer service for its whole run.
        Here the ``crawl.lock`` flock (refused at once when held: ``wait`` is for a
        PostgreSQL store's standby); a PostgreSQL store's is an advisory lock."""
        return crawl_lock(self.path)

    def writer_claim(self) -> contextlib.AbstractContextManager[None]:
        """What a ``Writer`` holds for its life: nothing here (every write transaction is
        BEGIN IMMEDIATE, and a crawl or service holds ``writer_lock``); on PostgreSQL the
        writer lock, so that no two writers of one store ever interleave batches."""
        return contextlib.nullcontext()

    def running_writer(self) -> tuple[int, str] | None:
        """(pid, host) of the crawl or service holding the writer lock, if any."""
        pid = running_pid(self.path)
        return None if pid is None else (pid, socket.gethostname())

    def close(self) -> None:
        """Checkpoint (seeing the result), then close. The WAL is removed only after a
        checkpoint that copied all of it and fsynced the database file. The artifact store
        is closed first (packs: this process's pack is sealed)."""
        self.artifacts.close()
        conn = self.connection
        if self.sync_failed is None and not self.read_only:
            try:
                frames, copied = conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
            except apsw.ConnectionClosedError:
                return
            except apsw.Error as exc:  # busy (a reader), full disk: the WAL stays, safely
                if is_sync_failure(exc):
                    self.mark_sync_failed(f"the checkpoint at close: {describe(exc)}")
            else:
                if frames == copied:  # all of it, fsynced: the close may delete the WAL
                    conn.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 0)
        conn.close()

def stop_writer(location: os.PathLike[str] | str, *, sig: int = signal.SIGTERM) -> int | None:
    """Ask the crawl or service writing the store at ``location`` to stop (``evidence
    stop``); its pid, or None when none runs. A store directory's is the pid in its
    ``crawl.lock``; a database's, the holder of its writer lock, which on another host is
    named, not signalled."""
    if not is_server_database(location):
        return stop(Path(location), sig=sig)
    with Store.open(location, read_only=True) as store:
        holder = store.running_writer()
    if holder is None:
        return None
    pid, host = holder
    if host != socket.gethostname():
        raise StoreError(f"{store.location}: the writer runs on host {host} (pid {pid})",
                         hint=f"stop it there: evidence stop STORE on {host}, or kill {pid}")
    os.kill(pid, sig)
    return pid


def _check_schema_version(backend: StoreBackend) -> None:
    """Refuse a store written by a newer program, as opening it for status or verify does:
    its dump could not be restored by this one, and its rows may mean other things."""
    newest = len(load_migrations())
    with backend.snapshot() as conn:  # read-only: works on read-only media
        version = conn.execute("PRAGMA user_version").fetchall()[0][0]
    if version > newest:
        raise MigrationError(f"the store has schema version {version}, newer than this "
                             f"program supports ({newest})", schema_version=version,
                             hint="upgrade evidence to export this store")


@functools.cache
def _postgres_store() -> type[PostgresStore]:
    """The class of a PostgreSQL store: ``pgstore.PostgresStore``, which is a ``StoreBase``,
    made a ``Store`` too (what the writer, readers and archives take). Made on the first
    open of one: a store directory never imports the PostgreSQL driver."""
    from .pgstore import PostgresStore

    class PostgresDatabaseStore(PostgresStore, Store):
        """A store in a PostgreSQL database (``_store/pgstore.py`` has all of it)."""

    return PostgresDatabaseStore


# What a store directory may hold before its database exists (a start that was cut short).
_STORE_ENTRIES = {ARTIFACTS_DIR, "crawl.lock", "live-stats.json", DB_NAME + "-journal",
                  DB_NAME + "-wal", DB_NAME + "-shm"}


def _check_writable(root: Path) -> None:
    """Refuse, before anything is written, to write a store where this process cannot:
    read-only media (``access`` says EROFS, for root too) or another user's files."""
    existing = next(p for p in (root, *root.absolute().parents) if p.exists())
    if existing != root:  # a new store: its nearest existing parent must take a directory
        if not os.access(existing, os.W_OK | os.X_OK):
            raise StoreError(f"cannot create a store at {root}: {existing} is read-only "
                             "here (read-only media, or not this user's)", path=str(root),
                             hint="choose a directory on storage this user can write")
        return
    problems = [p for p in (root, root / DB_NAME, root / f"{DB_NAME}-wal")
                if p.exists() and not os.access(p, os.W_OK)]
    if problems:
        raise StoreError(f"{root} cannot be written here (read-only media, or not this "
                         f"user's: {problems[0]})", path=str(root),
                         hint=f"reading commands (status, verify, export, replay, show) work "
                         f"on it as it is; to crawl or write, copy it to writable storage "
                         f"first: evidence backup {root} --out NEW")


def _no_payload_place(root: Path, conn: Any) -> StoreError:
    """The error for a store with neither an ``artifacts/`` nor a recorded payload location.
    With nothing committed, its creation did not finish (one whose payloads go to an object
    store records that location after its database is made): ``evidence init`` again
    finishes it. With evidence in it, the directory is missing: the store is damaged."""
    if artifactspec.is_new(conn):
        return unfinished_creation(
            str(root), f"no {ARTIFACTS_DIR}/, no payload location recorded, nothing committed",
            init=f"evidence init {root} (with the same --artifacts s3://... if its payloads "
            "go to an object store)")
    return CorruptStoreError(f"{root}: {ARTIFACTS_DIR}/ is missing", path=str(root))


def _check_store_path(root: Path, *, create: bool) -> None:
    """Refuse, before anything is written, a path that is not (and cannot become) a store:
    a file, an archive (following "evidence init" there would put a database inside it), a
    directory of other things, or a missing store when not creating one."""
    if root.exists() and not root.is_dir():
        raise StoreError(f"{root} is a file, not a store directory", path=str(root),
                         hint="give the store's directory (a new one is created by "
                         "'evidence init DIR')")
    if (root / DB_NAME).exists():
        return
    if (root / "manifest.json").exists():
        raise StoreError(f"{root} is an archive written by 'evidence export', not a store",
                         path=str(root), hint=f"restore it into a new store first: "
                         f"evidence restore {root} --store NEW")
    if not create:
        raise StoreError(f"{root}: no evidence store here ({DB_NAME} not found)",
                         hint=f"check the path, or create a store with 'evidence init {root}'",
                         path=str(root))
    other = sorted(p.name for p in root.iterdir() if p.name not in _STORE_ENTRIES) \
        if root.is_dir() else []
    if other:
        raise StoreError(f"{root} holds other files ({', '.join(other[:3])}"
                         f"{', ...' if len(other) > 3 else ''}), not a store",
                         path=str(root), hint="give a new or empty directory for a new store")


@contextlib.contextmanager
def _marking_sync_failures(root: Path, ops: FileOps) -> Iterator[None]:
    """An fsync failure while opening (a migration's COMMIT, the WAL's directory) marks the
    store, as one in the writer does, and is raised as ``SyncError``."""
    try:
        yield
    except OSError as exc:
        mark_sync_failed(root, ops, f"fsync of {root} failed while opening it: {exc}")
        raise SyncError(f"{root}: an fsync failed while opening the store ({exc})",
                        hint="check the disk (dmesg), then open the store again",
                        path=str(root)) from exc
    except StoreError as exc:
        cause = exc.__cause__
        if cause is None or not is_sync_failure(cause):
            raise
        mark_sync_failed(root, ops, f"opening the store: {describe(cause)}")
        raise SyncError(f"{root}: an fsync failed while opening the store ({describe(cause)})",
                        hint="check the disk (dmesg), then open the store again",
                        path=str(root)) from cause


def _check_protocols() -> None:  # pragma: no cover - for the type checker only
    """Each implementation is what its seam says (``_store/backend.py``): checked here, where
    locations become stores, so that the seam module imports none of them."""
    from .artifacts import ArtifactStore
    from .packs import PackStore
    from .s3 import S3ArtifactStore

    store: ArtifactBackend = ArtifactStore(os.devnull)
    packs: ArtifactBackend = PackStore(os.devnull)
    objects: ArtifactBackend = S3ArtifactStore.__new__(S3ArtifactStore)
    backend: StoreBackend = SQLiteBackend(Path(os.devnull))
    del store, packs, objects, backend
