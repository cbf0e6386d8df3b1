"""The store: a directory holding ``evidence.db`` (SQLite, WAL) and ``artifacts/``.

This module owns opening a store: the SQLite version gate, every pragma we set and why,
schema migrations, the one write connection and short-lived read-only connections.
Invariants:
  - every write transaction is ``BEGIN IMMEDIATE`` (``Store.write_transaction``), so a
    writer learns it cannot write before it has done any work, never at COMMIT;
  - a new database reaches WAL mode under ``synchronous=EXTRA`` (DESIGN.md writer rule 12),
    then runs at ``FULL`` (default) or ``NORMAL`` (explicit opt-in);
  - no checkpoint runs where its error goes unseen (``connection_checkpoints_seen``), and a
    store marked after a failed fsync is resynced before it is opened for writing
    (``_resync``);
  - migrations are applied in order, each in its own transaction, and recorded with a
    SHA-256 checksum; an edited or unknown migration is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import apsw

from .._errors import (
    CorruptStoreError,
    EvidenceError,
    MigrationError,
    SQLiteVersionError,
    StoreError,
    SyncError,
)
from .._model.messages import new_id, now_text
from .artifacts import ArtifactStore, FileOps
from .resync import SYNC_MARKER, describe, is_sync_failure, mark_sync_failed, resync

__all__ = ["DB_NAME", "Store", "check_sqlite_version", "map_sqlite_errors"]

DB_NAME = "evidence.db"
ARTIFACTS_DIR = "artifacts"
DEFAULT_BUSY_TIMEOUT_MS = 5_000

Sync = Literal["full", "normal"]

# The WAL-reset bug (fixed in 3.51.3, backported to 3.44.6 and 3.50.7): a database
# that is checkpointed and reset while another connection writes can lose commits.
_MIN_VERSION = (3, 51, 3)
_BACKPORTS = {(3, 44): (3, 44, 6), (3, 50): (3, 50, 7)}


def check_sqlite_version(version: str | None = None) -> tuple[int, int, int]:
    """Refuse an SQLite library with the WAL-reset bug. ``version`` defaults to the linked one."""
    text = version if version is not None else apsw.sqlite_lib_version()
    parts = tuple(int(p) for p in text.split(".")[:3])
    parts = (*parts, 0, 0, 0)[:3]
    floor = _BACKPORTS.get(parts[:2], _MIN_VERSION)
    if parts < floor:
        raise SQLiteVersionError(
            f"SQLite {text} is too old: versions before 3.51.3 (or the backports 3.44.6 "
            "and 3.50.7) have the WAL-reset bug, which can silently lose committed "
            "transactions",
            hint="upgrade apsw (pip install -U apsw); its wheels bundle a current SQLite",
            sqlite_version=text,
        )
    return parts  # type: ignore[return-value]


@contextlib.contextmanager
def map_sqlite_errors(path: os.PathLike[str] | str) -> Iterator[None]:
    """Translate apsw errors at the store boundary, keeping the SQLite codes."""
    try:
        yield
    except EvidenceError:
        raise
    except (apsw.CorruptError, apsw.NotADBError) as exc:
        raise CorruptStoreError(
            f"{path}: the database is damaged or not an evidence store ({exc})",
            hint="'evidence verify STORE --full' says what is damaged; then restore the "
            "store from a backup (evidence restore) or an archive",
            path=str(path), sqlite_code=getattr(exc, "extendedresult", None),
        ) from exc
    except apsw.FullError as exc:
        raise StoreError(
            f"{path}: the disk is full ({exc})", hint="free disk space and retry",
            path=str(path), sqlite_code=getattr(exc, "extendedresult", None),
        ) from exc
    except apsw.Error as exc:
        raise StoreError(
            f"{path}: {exc}", path=str(path), sqlite_code=getattr(exc, "extendedresult", None),
        ) from exc


# --- SQLite policy: every pragma we set, and why -------------------------------------

def connection_busy_timeout(conn: apsw.Connection, ms: int) -> None:
    """Bounded waiting on locks; set before anything else touches the file (even WAL)."""
    conn.set_busy_timeout(ms)


def connection_foreign_keys(conn: apsw.Connection) -> None:
    """Foreign keys are off by default in SQLite; our references must hold."""
    conn.execute("PRAGMA foreign_keys = ON")


def connection_wal(conn: apsw.Connection, sync: Sync) -> None:
    """WAL so readers never block the writer; EXTRA until WAL so the switch is durable.

    Under FULL the rollback journal of the switch to WAL is deleted without syncing its
    directory: power loss can undo the switch and every commit after it (DESIGN.md rule 12).
    """
    mode = conn.execute("PRAGMA journal_mode").fetchall()[0][0]
    if mode != "wal":
        conn.execute("PRAGMA synchronous = EXTRA")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchall()[0][0]
        if mode != "wal":
            raise StoreError(f"could not switch the database to WAL (mode is {mode!r})")
    # FULL: a commit is durable when COMMIT returns. NORMAL: survives a process crash,
    # may lose the last commits on power loss (the WAL is synced only at checkpoints).
    conn.execute(f"PRAGMA synchronous = {'FULL' if sync == 'full' else 'NORMAL'}")


def connection_cache(conn: apsw.Connection, mib: int = 64) -> None:
    """A page cache for the writer's indexes: SQLite's default (2 MiB) makes inserts into a
    growing store's unique indexes read pages back from the OS on almost every message."""
    conn.execute(f"PRAGMA cache_size = {-mib * 1024}")


def connection_temp_memory(conn: apsw.Connection) -> None:
    """Savepoint journals and sorts in memory: a savepoint per message costs 1.1x, not 1.3x."""
    conn.execute("PRAGMA temp_store = MEMORY")


AUTOCHECKPOINT_FRAMES = 1000  # SQLite's default wal_autocheckpoint, kept by the writer


class WalFrames:
    """The WAL hook of a write connection: notes the frames in the WAL after each commit.

    Installing a WAL hook replaces SQLite's auto-checkpoint, whose errors SQLite drops; the
    writer checkpoints itself once ``frames`` reaches ``AUTOCHECKPOINT_FRAMES`` (as the
    auto-checkpoint did) and sees every error.
    """

    __slots__ = ("frames",)

    def __init__(self) -> None:
        self.frames = 0

    def __call__(self, conn: apsw.Connection, name: str, frames: int) -> int:
        self.frames = frames
        return apsw.SQLITE_OK


def connection_checkpoints_seen(conn: apsw.Connection, hook: WalFrames | None = None) -> None:
    """No checkpoint whose error nobody sees.

    SQLite's auto-checkpoint ignores its own errors, and so does the checkpoint a connection
    runs when it closes. After an fsync of the database file fails, that silence loses
    data: a checkpoint that runs later and succeeds resets the WAL, although pages an
    earlier (partial) checkpoint wrote were dropped by the failed fsync and never reached
    the disk. So a write connection checkpoints only when the writer or ``Store.close``
    asks, and both look at the result (docs/design.md, "The writer").
    """
    conn.set_wal_hook(hook or WalFrames())
    conn.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1)


def _connect_writer(db_path: Path, sync: Sync, busy_timeout_ms: int, *,
                    create: bool = False, vfs: str | None = None,
                    wal_frames: WalFrames | None = None) -> apsw.Connection:
    """A read-write connection with the whole policy applied, in the order that matters."""
    flags = apsw.SQLITE_OPEN_READWRITE | (apsw.SQLITE_OPEN_CREATE if create else 0)
    conn = apsw.Connection(str(db_path), flags=flags, vfs=vfs)
    try:
        connection_busy_timeout(conn, busy_timeout_ms)  # before WAL: the switch takes locks
        connection_wal(conn, sync)
        connection_foreign_keys(conn)
        connection_temp_memory(conn)
        connection_cache(conn)
        connection_checkpoints_seen(conn, wal_frames)
    except BaseException:
        conn.close()
        raise
    return conn


def _connect_reader(db_path: Path, busy_timeout_ms: int, *,
                    vfs: str | None = None) -> apsw.Connection:
    """A read-only connection (``mode=ro``, ``query_only``) that never writes the store.

    A reader of a WAL database needs the WAL index (``-shm``): SQLite uses the existing
    one (read-only is enough: it then keeps a private copy), or creates it where the
    directory allows. On read-only media, or in someone else's directory, after the writer
    closed cleanly there is neither a WAL nor an index and none can be made: then the
    database file holds everything, and it is opened ``immutable=1`` (no WAL, no locks:
    see docs/store.md for what that assumes). A WAL that still holds commits, without an
    index that can be read or made, is refused: immutable would silently skip them.
    """
    uri = "file:" + urllib.parse.quote(str(db_path.absolute())) + "?mode=ro"
    flags = apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI
    try:
        return _probe(apsw.Connection(uri, flags=flags, vfs=vfs), busy_timeout_ms)
    except (apsw.CantOpenError, apsw.ReadOnlyError) as exc:
        wal = Path(f"{db_path}-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise StoreError(
                f"{db_path.parent}: cannot read this store read-only: its WAL holds commits "
                f"and its index ({DB_NAME}-shm) can neither be read nor created here ({exc})",
                hint="copy the store directory somewhere you can write (cp -a) and read the "
                "copy, or have its owner open and close it once", path=str(db_path.parent),
            ) from exc
    return _probe(apsw.Connection(uri + "&immutable=1", flags=flags, vfs=vfs), busy_timeout_ms)


def _probe(conn: apsw.Connection, busy_timeout_ms: int) -> apsw.Connection:
    """Apply the reader policy and read once (that is when SQLite opens the WAL index)."""
    try:
        connection_busy_timeout(conn, busy_timeout_ms)
        conn.execute("PRAGMA query_only = ON")
        conn.execute("SELECT count(*) FROM sqlite_schema").fetchall()
    except BaseException:
        conn.close()
        raise
    return conn


# --- migrations ----------------------------------------------------------------------

_MIGRATION_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")


def schema_dir() -> Path:
    """Migrations ship inside the wheel as ``evidence/schema``; in a checkout, ``schema/``."""
    package = Path(__file__).parent.parent
    packaged = package / "schema"
    return packaged if packaged.is_dir() else package.parent / "schema"


def load_migrations(directory: Path | None = None) -> list[tuple[int, str, str, str]]:
    """(version, name, checksum, sql) for each ``NNN_name.sql``, ordered and gap-free."""
    directory = directory or schema_dir()
    found = []
    for path in sorted(directory.glob("*.sql")):
        match = _MIGRATION_NAME.match(path.name)
        if not match:
            raise MigrationError(f"{path}: migration names are NNN_name.sql", path=str(path))
        sql = path.read_bytes()
        found.append((int(match[1]), match[2], hashlib.sha256(sql).hexdigest(), sql.decode()))
    for expected, (version, *_rest) in enumerate(found, start=1):
        if version != expected:
            raise MigrationError(f"migration {expected:03d} is missing from {directory}")
    return found


def apply_migrations(conn: apsw.Connection, migrations: list[tuple[int, str, str, str]]) -> int:
    """Check applied migrations, apply the new ones; return the schema version."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migration (version INTEGER PRIMARY KEY, "
        "name TEXT NOT NULL, checksum TEXT NOT NULL, applied_at TEXT NOT NULL) STRICT"
    )
    applied = {v: (n, c) for v, n, c in conn.execute(
        "SELECT version, name, checksum FROM schema_migration ORDER BY version")}
    known = {v: (n, c) for v, n, c, _ in migrations}
    newest_known = max(known, default=0)
    if applied and max(applied) > newest_known:
        raise MigrationError(
            f"the store has schema version {max(applied)}, newer than this program "
            f"supports ({newest_known})",
            hint="upgrade evidence to open this store", schema_version=max(applied),
        )
    for version, (name, checksum) in applied.items():
        if known[version][1] != checksum:
            raise MigrationError(
                f"migration {version:03d}_{name} was edited after it was applied "
                f"(store has checksum {checksum[:12]}, file has {known[version][1][:12]})",
                hint="never edit an applied migration; add a new NNN_name.sql instead",
                schema_version=version,
            )
    for version, name, checksum, sql in migrations:
        if version in applied:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(sql)
            conn.execute(
                "INSERT INTO schema_migration VALUES (?, ?, ?, ?)",
                (version, name, checksum, now_text()),
            )
            conn.execute(f"PRAGMA user_version = {version}")
            conn.execute("COMMIT")
        except BaseException:
            if not conn.get_autocommit():  # an I/O error at COMMIT has rolled back already
                conn.execute("ROLLBACK")
            raise
    return newest_known


def applied_version(conn: apsw.Connection, migrations: list[tuple[int, str, str, str]]) -> int:
    """The schema version of a store opened read-only (nothing is applied); a store newer
    than this program is refused. Edited migrations are not refused here: ``verify``
    reports every schema object that differs from its migration."""
    # Each migration sets user_version in its own transaction; it lives in the header, so
    # a damaged schema_migration page cannot hide the version (verify checks that table).
    version = conn.execute("PRAGMA user_version").fetchall()[0][0]
    newest_known = max((v for v, *_ in migrations), default=0)
    if (version or 0) > newest_known:
        raise MigrationError(
            f"the store has schema version {version}, newer than this program supports "
            f"({newest_known})", hint="upgrade evidence to open this store",
            schema_version=version)
    return version or 0


# --- the store -----------------------------------------------------------------------

class Store:
    """An open store: one write connection (owned by the writer) and its artifact store.

    Use ``Store.open(path)`` (or ``Store.create(path)``), and close it when done; it is a
    context manager. Not thread-safe for concurrent writes: exactly one ``Writer`` uses
    ``connection``; readers call ``reader()`` for their own short-lived connections.
    """

    def __init__(self, path: Path, connection: apsw.Connection, artifacts: ArtifactStore,
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
        self.sync_failed: str | None = None  # why, once an fsync failed in this process
        self.read_only = read_only  # opened with read_only=True: ``connection`` cannot write

    @classmethod
    def open(cls, path: os.PathLike[str] | str, *, create: bool = False, sync: Sync = "full",
             busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
             max_payload: int | None = None, vfs: str | None = None,
             sqlite_version: str | None = None, file_ops: FileOps | None = None,
             read_only: bool = False) -> Store:
        """Open (or with ``create=True``, create) the store at ``path``.

        ``read_only=True`` opens a store on read-only media or someone else's for reading:
        nothing is created, migrated, resynced or written (``_connect_reader``), the
        artifact store refuses puts, and a ``Writer`` refuses the store.

        ``sync="normal"`` survives a process crash but may lose the last commits on power
        loss. ``vfs`` names a registered SQLite VFS and ``file_ops`` replaces the file
        operations of the store's own files and its artifacts (the fault-injection tests
        use both). ``sqlite_version`` overrides the version checked (for tests of the gate).

        A store marked after a failed fsync (``sync-failed``) is resynced first; if that
        fails, ``SyncError`` and nothing is opened.
        """
        check_sqlite_version(sqlite_version)
        if sync not in ("full", "normal"):
            raise StoreError(f"sync must be 'full' or 'normal', not {sync!r}")
        root = Path(path)
        db_path = root / DB_NAME
        ops = file_ops or FileOps()
        _check_store_path(root, create=create and not read_only)
        if read_only:
            return cls._open_read_only(root, busy_timeout_ms=busy_timeout_ms,
                                       max_payload=max_payload, vfs=vfs)
        if create:
            for directory in ops.makedirs(root):  # each new entry durable in its parent
                ops.fsync_dir(directory.parent)
        elif not (root / ARTIFACTS_DIR).is_dir():
            raise CorruptStoreError(f"{root}: {ARTIFACTS_DIR}/ is missing", path=str(root))
        if (root / SYNC_MARKER).exists():
            resync(root, DB_NAME, file_ops=ops, busy_timeout_ms=busy_timeout_ms, vfs=vfs)
        hook = WalFrames()
        with _marking_sync_failures(root, ops), map_sqlite_errors(db_path):
            conn = _connect_writer(db_path, sync, busy_timeout_ms, create=create, vfs=vfs,
                                   wal_frames=hook)
            try:
                # Opening created the WAL. SQLite fsyncs its directory entry at its first
                # sync but ignores a failure there; this fsync's failure is seen.
                ops.fsync_dir(root)
                version = apply_migrations(conn, load_migrations())
                _ensure_store_id(conn)
            except BaseException:
                conn.close()
                raise
        kwargs = {} if max_payload is None else {"max_payload": max_payload}
        artifacts = ArtifactStore(root / ARTIFACTS_DIR, file_ops=ops, **kwargs)
        if create:
            ops.fsync_dir(root)  # evidence.db's and artifacts/'s entries, on purpose
        return cls(root, conn, artifacts, sync=sync, busy_timeout_ms=busy_timeout_ms,
                   schema_version=version, vfs=vfs, file_ops=ops, wal_frames=hook)

    @classmethod
    def _open_read_only(cls, root: Path, *, busy_timeout_ms: int, max_payload: int | None,
                        vfs: str | None) -> Store:
        if not (root / ARTIFACTS_DIR).is_dir():
            raise CorruptStoreError(f"{root}: {ARTIFACTS_DIR}/ is missing", path=str(root))
        db_path = root / DB_NAME
        with map_sqlite_errors(db_path):
            conn = _connect_reader(db_path, busy_timeout_ms, vfs=vfs)
            try:
                version = applied_version(conn, load_migrations())
            except BaseException:
                conn.close()
                raise
        kwargs = {} if max_payload is None else {"max_payload": max_payload}
        try:
            artifacts = ArtifactStore(root / ARTIFACTS_DIR, create=False, read_only=True,
                                      **kwargs)
        except BaseException:
            conn.close()
            raise
        return cls(root, conn, artifacts, sync="full", busy_timeout_ms=busy_timeout_ms,
                   schema_version=version, vfs=vfs, read_only=True)

    @classmethod
    def create(cls, path: os.PathLike[str] | str, **options: object) -> Store:
        """Create a store (or open an existing one) at ``path``."""
        return cls.open(path, create=True, **options)  # type: ignore[arg-type]

    @property
    def store_id(self) -> str:
        return self.meta("store_id")

    def meta(self, key: str) -> str:
        rows = self.connection.execute(
            "SELECT value FROM store_meta WHERE key = ?", (key,)).fetchall()
        return rows[0][0] if rows else ""

    @contextlib.contextmanager
    def write_transaction(self) -> Iterator[apsw.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` on the write connection; rollback on error."""
        self.check_writable()
        conn = self.connection
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            if not conn.get_autocommit():
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @contextlib.contextmanager
    def reader(self) -> Iterator[apsw.Connection]:
        """A read-only connection for one short snapshot; closed on exit."""
        with map_sqlite_errors(self.db_path):
            conn = _connect_reader(self.db_path, self.busy_timeout_ms, vfs=self.vfs)
        try:
            yield conn
        finally:
            conn.close()

    def check_writable(self) -> None:
        """Raise ``StoreError`` if the store was opened read-only."""
        if self.read_only:
            raise StoreError(f"{self.path} was opened read-only",
                             hint="open it without read_only to write", path=str(self.path))

    def reopen_connection(self) -> None:
        """Close and reopen the write connection (after a COMMIT whose outcome is unknown).

        Refused (``SyncError``) once an fsync failed: what a new connection reads is then
        no evidence of what is on the disk.
        """
        self.check_writable()
        with contextlib.suppress(apsw.Error):
            self.connection.close()  # never checkpoints on close (the policy)
        self.check_synced()
        with map_sqlite_errors(self.db_path):
            self.connection = _connect_writer(self.db_path, self.sync, self.busy_timeout_ms,
                                              vfs=self.vfs, wal_frames=self.wal_frames)

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

    def _sync_error(self) -> SyncError:
        return SyncError(
            f"{self.path}: an fsync of the store failed ({self.sync_failed}); nothing more is "
            "acknowledged from it until it is resynced",
            hint="check the disk (dmesg); once it works, open the store again (opening it "
            "for writing makes it durable first) and redeliver what was not acknowledged",
            path=str(self.path))

    def wal_size(self) -> int:
        """Bytes in the WAL file now (0 when absent)."""
        try:
            return (self.path / (DB_NAME + "-wal")).stat().st_size
        except FileNotFoundError:
            return 0

    def close(self) -> None:
        """Checkpoint (seeing the result), then close. The WAL is removed only after a
        checkpoint that copied all of it and fsynced the database file."""
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

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# What a store directory may hold before its database exists (a start that was cut short).
_STORE_ENTRIES = {ARTIFACTS_DIR, "crawl.lock", "live-stats.json", DB_NAME + "-journal",
                  DB_NAME + "-wal", DB_NAME + "-shm"}


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


def _ensure_store_id(conn: apsw.Connection) -> None:
    """Give a new store its identity (used in checkpoints and archives) once."""
    if conn.execute("SELECT 1 FROM store_meta WHERE key = 'store_id'").fetchall():
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "INSERT INTO store_meta (key, value) VALUES ('store_id', ?), ('created_at', ?), "
            "('created_on', ?) ON CONFLICT (key) DO NOTHING",
            (new_id("store-"), now_text(), socket.gethostname()),
        )
        conn.execute("COMMIT")
    except BaseException:
        if not conn.get_autocommit():
            conn.execute("ROLLBACK")
        raise
