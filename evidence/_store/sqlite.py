"""The SQLite store backend: every pragma we set and why, migrations, connections, errors.

This module owns how a store's database is opened and read (``SQLiteBackend``, the one
implementation of ``backend.StoreBackend`` today). Invariants:
  - every write transaction is ``BEGIN IMMEDIATE`` (``SQLITE.begin_write``), so a writer
    learns it cannot write before it has done any work, never at COMMIT;
  - a new database reaches WAL mode under ``synchronous=EXTRA`` (design rule 12),
    then runs at ``FULL`` (default) or ``NORMAL`` (explicit opt-in);
  - no checkpoint runs where its error goes unseen (``connection_checkpoints_seen``);
  - migrations are applied in order, each in its own transaction, and recorded with a
    SHA-256 checksum; an edited or unknown migration is refused;
  - apsw errors become ``StoreError`` and its kin at one boundary, ``map_sqlite_errors``
    (``SQLiteBackend.errors``), keeping the SQLite codes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import apsw

from .._errors import (
    CorruptStoreError,
    EvidenceError,
    MigrationError,
    SQLiteVersionError,
    StoreError,
)
from .._model.messages import new_id, now_text
from .artifactspec import LOCAL_META
from .backend import Dialect, Progress
from .resync import describe, is_sync_failure

__all__ = ["DB_NAME", "SQLITE", "SQLiteBackend", "apply_migrations", "check_sqlite_version",
           "copy_migrated", "copy_snapshot", "load_migrations", "map_sqlite_errors"]

SQLITE = Dialect(name="sqlite", begin_write="BEGIN IMMEDIATE", begin_read="BEGIN")

DB_NAME = "evidence.db"
DEFAULT_BUSY_TIMEOUT_MS = 5_000

Sync = Literal["full", "normal"]

# The WAL-reset bug (fixed in 3.51.3, backported to 3.44.6 and 3.50.7): a database
# that is checkpointed and reset while another connection writes can lose commits.
_MIN_VERSION = (3, 51, 3)
_BACKPORTS = {(3, 44): (3, 44, 6), (3, 50): (3, 50, 7)}


def check_sqlite_version(version: str | None = None) -> tuple[int, int, int]:
    """Refuse an SQLite library with the WAL-reset bug. ``version`` defaults to the linked one."""
    text = version if version is not None else apsw.sqlite_lib_version()
    major, minor, patch = (*(int(p) for p in text.split(".")[:3]), 0, 0, 0)[:3]
    parts = (major, minor, patch)
    floor = _BACKPORTS.get((major, minor), _MIN_VERSION)
    if parts < floor:
        raise SQLiteVersionError(
            f"SQLite {text} is too old: versions before 3.51.3 (or the backports 3.44.6 "
            "and 3.50.7) have the WAL-reset bug, which can silently lose committed "
            "transactions",
            hint="upgrade apsw (pip install -U apsw); its wheels bundle a current SQLite",
            sqlite_version=text,
        )
    return parts


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


PAGE_SIZE = 1024  # bytes: the page size of a new store (connection_page_size)


def connection_page_size(conn: apsw.Connection) -> None:
    """Small pages for a new database: most of what a crawl's batch rewrites is pages it
    touches for one row (an index keyed by a digest or a URL puts each new entry in a
    random leaf), and each such page is written whole to the WAL, then again by the
    checkpoint. At 1 KiB instead of SQLite's 4 KiB a 5,000-page crawl wrote 0.65x the
    bytes, the rest of the write path alike (docs/store.md, "The write path"). SQLite
    takes the size only before the first table exists: an older store keeps its own."""
    conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")


def connection_wal(conn: apsw.Connection, sync: Sync) -> None:
    """WAL so readers never block the writer; EXTRA until WAL so the switch is durable.

    Under FULL the rollback journal of the switch to WAL is deleted without syncing its
    directory: power loss can undo the switch and every commit after it (design rule 12).
    """
    mode = conn.execute("PRAGMA journal_mode").fetchall()[0][0]
    if mode != "wal":
        connection_page_size(conn)  # the switch writes the header: the size is fixed then
        conn.execute("PRAGMA synchronous = EXTRA")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchall()[0][0]
        if mode != "wal":
            raise StoreError(f"could not switch the database to WAL (mode is {mode!r})")
    # FULL: a commit is durable when COMMIT returns. NORMAL: survives a process crash,
    # may lose the last commits on power loss (the WAL is synced only at checkpoints).
    conn.execute(f"PRAGMA synchronous = {'FULL' if sync == 'full' else 'NORMAL'}")


# The write connection's page cache: its bound, whatever the store. 16 MiB, not 64: in
# interleaved 20,000-page crawls (a 242 MB store; tools/bench_writes.py --writer-cache
# 64,16,8 --reps 2) 64 MiB bought ~4% of CPU per page (medians 3.59 ms against 3.75, the
# ranges overlapping), no pages/s and no bytes written (3.16x at both), for 59 MB more
# peak resident set (185 MB against 125); 8 MiB saved 11 MB more and wrote a little more
# (3.18x) at fewer pages/s (docs/store.md, "The writer's page cache"). Full
# within a crawl's first few thousand pages, it no longer makes its memory climb later.
WRITER_CACHE_MIB = 16
READER_CACHE_KIB = 2000  # a read connection's page cache (SQLite's default, named here)


def connection_cache(conn: apsw.Connection, mib: int | None = None) -> None:
    """A page cache for the writer's indexes: SQLite's default (2 MiB) makes inserts into a
    growing store's unique indexes read pages back from the OS on almost every message.
    It fills as the store grows, up to ``WRITER_CACHE_MIB``, and stays there: a crawl's
    growth in memory over its first few thousand pages, where the store reaches that size,
    and none after (docs/store.md, "The writer's page cache")."""
    conn.execute(f"PRAGMA cache_size = {-(mib or WRITER_CACHE_MIB) * 1024}")


def connection_temp_memory(conn: apsw.Connection) -> None:
    """Savepoint journals and sorts in memory: a savepoint per message costs 1.1x, not 1.3x."""
    conn.execute("PRAGMA temp_store = MEMORY")


class WalFrames:
    """The WAL hook of a write connection: notes the frames in the WAL after each commit.

    Installing a WAL hook replaces SQLite's auto-checkpoint, whose errors SQLite drops; the
    writer checkpoints itself once ``frames`` fill its WAL limit
    (``SQLiteBackend.after_commit``) and sees every error.
    """

    __slots__ = ("frames",)

    def __init__(self) -> None:
        self.frames = 0

    def __call__(self, conn: apsw.Connection, name: str, frames: int) -> int:
        self.frames = frames
        return apsw.SQLITE_OK


# Under sync=normal a power loss can take what was committed since the WAL's last sync,
# which is at a checkpoint: one runs at least this often (SQLite's 1,000 frames of 4 KiB).
NORMAL_CHECKPOINT_BYTES = 4 * 1024 * 1024


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


def connect_writer(db_path: Path, sync: Sync, busy_timeout_ms: int, *,
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


def connect_reader(db_path: Path, busy_timeout_ms: int, *,
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
        conn.execute(f"PRAGMA cache_size = {-READER_CACHE_KIB}")
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
        with immediate(conn):
            conn.execute(sql)
            conn.execute(
                "INSERT INTO schema_migration VALUES (?, ?, ?, ?)",
                (version, name, checksum, now_text()),
            )
            conn.execute(f"PRAGMA user_version = {version}")
    return newest_known


@contextlib.contextmanager
def immediate(conn: apsw.Connection) -> Iterator[None]:
    """One ``BEGIN IMMEDIATE`` transaction: committed when the block ends, else rolled back."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if not conn.get_autocommit():  # an I/O error at COMMIT has rolled back already
            conn.execute("ROLLBACK")
        raise


# Each list of migrations (by checksum) applied once per process to a database in memory,
# kept as the bytes of its file: what ``copy_migrated`` copies.
_migrated_images: dict[tuple[int | str, ...], bytes] = {}


def copy_migrated(conn: apsw.Connection, migrations: list[tuple[int, str, str, str]]) -> None:
    """Make ``conn``'s empty main database what ``apply_migrations`` makes of it (the same
    schema, the same ``schema_migration`` rows and user_version, at ``conn``'s page size),
    by copying a database the same migrations made earlier in this process.

    Applying fifteen migrations costs about 35 ms of CPU (a few rebuild a table), copying
    their result about 1.5 ms (measured with apsw 3.54 on the development machine). Used
    for the databases that are only a reference or a scratch space (verify compares a
    store's schema with one and replays its frontier into another) and for a new store's
    own database (``SQLiteBackend.migrate``): a process that makes many stores, as the
    test suite's do, migrates once. The copy is one transaction of the destination: a
    crash leaves the database empty or whole.
    """
    page_size = conn.execute("PRAGMA page_size").fetchall()[0][0]
    key = (page_size, *(checksum for _version, _name, checksum, _sql in migrations))
    image = _migrated_images.get(key)
    if image is None:
        fresh = apsw.Connection(":memory:")
        try:
            fresh.execute(f"PRAGMA page_size = {page_size}")
            apply_migrations(fresh, migrations)
            image = fresh.serialize("main")
        finally:
            fresh.close()
        _migrated_images[key] = image
    source = apsw.Connection(":memory:")
    try:
        source.deserialize("main", image)
        copy = conn.backup("main", source, "main")
        try:
            copy.step(-1)
        except BaseException:
            # The step's own error is the one to see (apsw's context manager raises
            # SystemError when finishing after a failed step).
            with contextlib.suppress(apsw.Error):
                copy.finish()
            raise
        copy.finish()
    finally:
        source.close()


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


# A store created at migration 010 or later never held a quarantine row in the pre-006
# layout: it says so from the start (migration 010 records an older store's count).
CLOSE_LEGACY_QUARANTINE = (
    "INSERT INTO store_meta (key, value) SELECT 'legacy_quarantine', '0' "
    "WHERE (SELECT max(version) FROM schema_migration) >= 10 ON CONFLICT (key) DO NOTHING")


def ensure_store_id(conn: apsw.Connection) -> None:
    """Give a new store its identity (used in checkpoints and archives) once."""
    if conn.execute("SELECT 1 FROM store_meta WHERE key = 'store_id'").fetchall():
        return
    with immediate(conn):
        conn.execute(
            "INSERT INTO store_meta (key, value) VALUES ('store_id', ?), ('created_at', ?), "
            "('created_on', ?) ON CONFLICT (key) DO NOTHING",
            (new_id("store-"), now_text(), socket.gethostname()),
        )
        conn.execute(CLOSE_LEGACY_QUARANTINE)


def copy_snapshot(db_path: Path, dest: Path, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
                  step_pages: int = 4096, progress: Progress | None = None) -> int:
    """Copy one consistent snapshot of ``db_path`` into the new file ``dest``; return pages.

    The source connection takes a read transaction *before* the first backup step and keeps
    it until the last, so every step reads the same snapshot. Without it each step takes a
    fresh read lock, and a commit by any other connection between steps restarts the copy:
    with a crawler committing every few milliseconds it would never finish. In WAL mode the
    read transaction never blocks the writer; it only keeps checkpoints from recycling the
    WAL while the pages are copied (seconds), never while the dump is formatted.

    The copy leaves out ``store_meta``'s local keys (``artifactspec.LOCAL_META``).
    """
    check_sqlite_version()
    with map_sqlite_errors(db_path):
        src = connect_reader(db_path, busy_timeout_ms)  # read-only media included
        try:
            dst = apsw.Connection(str(dest), flags=apsw.SQLITE_OPEN_READWRITE
                                  | apsw.SQLITE_OPEN_CREATE | apsw.SQLITE_OPEN_EXCLUSIVE)
            try:
                dst.execute("PRAGMA synchronous = OFF")  # fsynced by the caller when it keeps it
                src.execute(SQLITE.begin_read)
                src.execute("SELECT count(*) FROM sqlite_schema").fetchall()  # the snapshot
                with dst.backup("main", src, "main") as backup:
                    while not backup.done:
                        backup.step(step_pages)
                        if progress:
                            progress("snapshot", backup.page_count - backup.remaining,
                                     backup.page_count)
                    pages = backup.page_count
                src.execute("COMMIT")
                # Where this deployment keeps its payloads is not part of what the store
                # holds: exports, backups and comparisons of the copy never carry it.
                dst.execute("DELETE FROM store_meta WHERE key IN (SELECT value FROM "
                            "json_each(?))", (json.dumps(LOCAL_META),))
            finally:
                dst.close()
        finally:
            src.close()
    return pages


def end_read(conn: apsw.Connection) -> None:
    """End a read transaction; on a damaged database a cursor's pending error can surface
    at the COMMIT, which then did not end it."""
    with contextlib.suppress(apsw.Error):
        conn.execute("COMMIT")
    if not conn.get_autocommit():
        with contextlib.suppress(apsw.Error):
            conn.execute("ROLLBACK")


# --- the backend ---------------------------------------------------------------------

class SQLiteBackend:
    """A store's database as one SQLite file in WAL mode (``backend.StoreBackend``)."""

    dialect = SQLITE
    local = True
    Error = apsw.Error
    BusyError = apsw.BusyError
    ConstraintError = apsw.ConstraintError

    def __init__(self, db_path: Path, *, sync: Sync = "full",
                 busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS, vfs: str | None = None,
                 wal_frames: WalFrames | None = None) -> None:
        self.db_path = db_path
        self.location = str(db_path)
        self.sync = sync
        self.busy_timeout_ms = busy_timeout_ms
        self.vfs = vfs
        self.wal_frames = wal_frames or WalFrames()  # frames in the WAL after the last commit
        self._frame_bytes: int | None = None  # a WAL frame: the page size plus 24

    def connect_writer(self, *, create: bool = False) -> apsw.Connection:
        return connect_writer(self.db_path, self.sync, self.busy_timeout_ms, create=create,
                               vfs=self.vfs, wal_frames=self.wal_frames)

    def try_begin_write(self, conn: apsw.Connection) -> bool:
        conn.set_busy_timeout(0)  # two C calls: nothing a batch would notice
        try:
            conn.execute(SQLITE.begin_write)
            return True
        except apsw.BusyError:
            return False
        finally:
            conn.set_busy_timeout(self.busy_timeout_ms)

    def migrate(self, conn: apsw.Connection) -> int:
        migrations = load_migrations()
        if not conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall():
            # A new store: the migrations' result copied whole, its times made this one's.
            copy_migrated(conn, migrations)
            with immediate(conn):
                conn.execute("UPDATE schema_migration SET applied_at = ?", (now_text(),))
        version = apply_migrations(conn, migrations)  # checks them; applies any not yet
        ensure_store_id(conn)
        return version

    @contextlib.contextmanager
    def reader(self) -> Iterator[apsw.Connection]:
        with map_sqlite_errors(self.db_path):
            conn = connect_reader(self.db_path, self.busy_timeout_ms, vfs=self.vfs)
        try:
            yield conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[apsw.Connection]:
        with self.reader() as conn, map_sqlite_errors(self.db_path):
            conn.execute(SQLITE.begin_read)
            try:
                yield conn
            finally:
                end_read(conn)

    def errors(self) -> contextlib.AbstractContextManager[None]:
        return map_sqlite_errors(self.db_path)

    def is_sync_failure(self, exc: BaseException) -> bool:
        return is_sync_failure(exc)

    def describe(self, exc: BaseException) -> str:
        return describe(exc)

    def copy_snapshot(self, dest: Path, *, progress: Progress | None = None) -> int:
        return copy_snapshot(self.db_path, dest, busy_timeout_ms=self.busy_timeout_ms,
                             progress=progress)

    def wal_size(self) -> int:
        """Bytes in the WAL file now (0 when absent)."""
        try:
            return Path(f"{self.db_path}-wal").stat().st_size
        except FileNotFoundError:
            return 0

    def after_commit(self, conn: apsw.Connection, *, wal_limit_bytes: int,
                     counted: Callable[[str], None]) -> None:
        """Checkpoint once the WAL holds ``wal_limit_bytes`` of frames, and keep it bounded.

        SQLite's auto-checkpoint (a passive checkpoint once the WAL holds 1,000 frames) is
        replaced by this one, because SQLite ignores its errors
        (``connection_checkpoints_seen``): here they are raised to the writer. It runs
        seldom on purpose: a checkpoint writes every page the WAL holds into the database
        file, so the hot pages (the ends of the append-only tables, the upper levels of
        each index) are written once per checkpoint, not once per thousand frames
        (docs/store.md, "The write path"). Under ``sync=normal`` the WAL is synced only at
        a checkpoint, so there one runs every ``NORMAL_CHECKPOINT_BYTES`` of frames (what
        SQLite's 1,000 frames of 4 KiB were): the commits a power loss can take stay as
        many as before (docs/reliability.md, "the loss window").

        A long reader stops a checkpoint from restarting the WAL, which then grows: while
        it is past ``wal_limit_bytes`` every commit tries again, and once a passive
        checkpoint has copied every frame (no reader holds an old snapshot), a TRUNCATE
        resets the file to zero; with a zero busy timeout it never waits on a reader (one
        reading the WAL right then leaves it to the next checkpoint). ``counted`` is told
        each ``checkpoints`` and ``wal_truncations`` as it happens.
        """
        large = self.wal_size() > wal_limit_bytes
        due = wal_limit_bytes if self.sync == "full" else min(wal_limit_bytes,
                                                              NORMAL_CHECKPOINT_BYTES)
        if not large and self.wal_frames.frames * self.frame_bytes(conn) < due:
            return
        frames, copied = conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
        counted("checkpoints")
        if large and frames == copied:
            conn.set_busy_timeout(0)
            try:
                conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
                counted("wal_truncations")
            except apsw.BusyError:
                pass  # a reader is in the WAL: every frame is copied, the next one truncates
            finally:
                conn.set_busy_timeout(self.busy_timeout_ms)

    def frame_bytes(self, conn: apsw.Connection) -> int:
        """Bytes of one WAL frame: a page and its 24-byte header (read once per store)."""
        if self._frame_bytes is None:
            self._frame_bytes = conn.execute("PRAGMA page_size").fetchall()[0][0] + 24
        return self._frame_bytes
