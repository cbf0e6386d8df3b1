"""The store: a directory holding ``evidence.db`` (SQLite, WAL) and ``artifacts/``.

This module owns opening a store: the SQLite version gate, every pragma we set and why,
schema migrations, the one write connection and short-lived read-only connections.
Invariants:
  - every write transaction is ``BEGIN IMMEDIATE`` (``Store.write_transaction``), so a
    writer learns it cannot write before it has done any work, never at COMMIT;
  - a new database reaches WAL mode under ``synchronous=EXTRA`` (DESIGN.md writer rule 12),
    then runs at ``FULL`` (default) or ``NORMAL`` (explicit opt-in);
  - migrations are applied in order, each in its own transaction, and recorded with a
    SHA-256 checksum; an edited or unknown migration is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import apsw

from ._artifacts import ArtifactStore
from ._errors import (
    CorruptStoreError,
    EvidenceError,
    MigrationError,
    SQLiteVersionError,
    StoreError,
)
from ._messages import new_id, now_text

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
            hint="run 'evidence verify' on a copy, or restore from a backup",
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


def _connect_writer(db_path: Path, sync: Sync, busy_timeout_ms: int, *,
                    create: bool = False, vfs: str | None = None) -> apsw.Connection:
    """A read-write connection with the whole policy applied, in the order that matters."""
    flags = apsw.SQLITE_OPEN_READWRITE | (apsw.SQLITE_OPEN_CREATE if create else 0)
    conn = apsw.Connection(str(db_path), flags=flags, vfs=vfs)
    try:
        connection_busy_timeout(conn, busy_timeout_ms)  # before WAL: the switch takes locks
        connection_wal(conn, sync)
        connection_foreign_keys(conn)
        connection_temp_memory(conn)
        connection_cache(conn)
    except BaseException:
        conn.close()
        raise
    return conn


# --- migrations ----------------------------------------------------------------------

_MIGRATION_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")


def schema_dir() -> Path:
    """Migrations ship inside the wheel as ``evidence/schema``; in a checkout, ``schema/``."""
    packaged = Path(__file__).parent / "schema"
    return packaged if packaged.is_dir() else Path(__file__).parent.parent / "schema"


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
            conn.execute("ROLLBACK")
            raise
    return newest_known


# --- the store -----------------------------------------------------------------------

class Store:
    """An open store: one write connection (owned by the writer) and its artifact store.

    Use ``Store.open(path)`` (or ``Store.create(path)``), and close it when done; it is a
    context manager. Not thread-safe for concurrent writes: exactly one ``Writer`` uses
    ``connection``; readers call ``reader()`` for their own short-lived connections.
    """

    def __init__(self, path: Path, connection: apsw.Connection, artifacts: ArtifactStore,
                 *, sync: Sync, busy_timeout_ms: int, schema_version: int,
                 vfs: str | None = None) -> None:
        self.path = path
        self.db_path = path / DB_NAME
        self.connection = connection
        self.artifacts = artifacts
        self.sync = sync
        self.busy_timeout_ms = busy_timeout_ms
        self.schema_version = schema_version
        self.vfs = vfs

    @classmethod
    def open(cls, path: os.PathLike[str] | str, *, create: bool = False, sync: Sync = "full",
             busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
             max_payload: int | None = None, vfs: str | None = None,
             sqlite_version: str | None = None) -> Store:
        """Open (or with ``create=True``, create) the store at ``path``.

        ``sync="normal"`` survives a process crash but may lose the last commits on power
        loss. ``vfs`` names a registered SQLite VFS (the fault-injection tests use one).
        ``sqlite_version`` overrides the version checked (for tests of the gate).
        """
        check_sqlite_version(sqlite_version)
        if sync not in ("full", "normal"):
            raise StoreError(f"sync must be 'full' or 'normal', not {sync!r}")
        root = Path(path)
        db_path = root / DB_NAME
        _check_store_path(root, create=create)
        new_dirs: list[Path] = []
        if create:
            missing = root
            while not missing.exists():
                new_dirs.append(missing)
                missing = missing.parent
            root.mkdir(parents=True, exist_ok=True)
            for directory in reversed(new_dirs):  # each new entry durable in its parent
                _fsync_dir(directory.parent)
        elif not (root / ARTIFACTS_DIR).is_dir():
            raise CorruptStoreError(f"{root}: {ARTIFACTS_DIR}/ is missing", path=str(root))
        with map_sqlite_errors(db_path):
            conn = _connect_writer(db_path, sync, busy_timeout_ms, create=create, vfs=vfs)
            try:
                version = apply_migrations(conn, load_migrations())
                _ensure_store_id(conn)
            except BaseException:
                conn.close()
                raise
        kwargs = {} if max_payload is None else {"max_payload": max_payload}
        artifacts = ArtifactStore(root / ARTIFACTS_DIR, **kwargs)
        if create:
            _fsync_dir(root)  # evidence.db's and artifacts/'s entries, on purpose
        return cls(root, conn, artifacts, sync=sync, busy_timeout_ms=busy_timeout_ms,
                   schema_version=version, vfs=vfs)

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
            conn = apsw.Connection(str(self.db_path), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            connection_busy_timeout(conn, self.busy_timeout_ms)
            conn.execute("PRAGMA query_only = ON")
            yield conn
        finally:
            conn.close()

    def reopen_connection(self) -> None:
        """Close and reopen the write connection (after a COMMIT whose outcome is unknown)."""
        with contextlib.suppress(apsw.Error):
            self.connection.close()
        with map_sqlite_errors(self.db_path):
            self.connection = _connect_writer(self.db_path, self.sync, self.busy_timeout_ms,
                                              vfs=self.vfs)

    def wal_size(self) -> int:
        """Bytes in the WAL file now (0 when absent)."""
        try:
            return (self.path / (DB_NAME + "-wal")).stat().st_size
        except FileNotFoundError:
            return 0

    def close(self) -> None:
        self.connection.close()

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


def _fsync_dir(path: Path) -> None:
    """Make a directory's entries durable (a new store must survive a power cut)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        conn.execute("ROLLBACK")
        raise
