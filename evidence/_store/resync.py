"""After a failed fsync: the marker that says so, and the resync that makes the store durable.

Why a failed fsync is different from any other error. On Linux (since 4.13, and on most
other systems) an fsync that fails with EIO marks the pages it could not write *clean*:
reads keep showing the new bytes from the page cache, a retried fsync succeeds without
writing them, and a power cut loses them. So after a failed fsync, what a reopened
connection reads is not evidence of what is on the disk: a commit-log row read back may
never have reached it (PostgreSQL learned this in 2018, "fsyncgate"). And in a WAL a lost
frame hides every later one, so one lost commit loses every commit after it on recovery,
however well those were synced.

The rule this module serves (docs/design.md, "The writer"):

  - an fsync failure (``SQLITE_IOERR_FSYNC``, ``SQLITE_IOERR_DIR_FSYNC``, or an I/O error
    that does not say which operation failed) at COMMIT or in a checkpoint stops the
    writer: nothing more is acknowledged from what reads show;
  - the store is marked: ``sync-failed`` in the store directory (``mark_sync_failed``),
    made durable if the disk still allows it, and at least visible to the rest of this
    boot, which is when the page cache can still lie;
  - the next open for writing first *resyncs* (``resync``): with the database to itself
    it reads the database file and its WAL and writes every byte back in place, which
    dirties the pages again, then fsyncs both files and the directory. Only when those
    syncs succeed is the marker removed: from then on what reads show is on the disk, so
    the ledger can answer for every message, a redelivered one included.

Rewriting in place is safe under a crash at any point: each sector either keeps what the
disk had or gets the page cache's bytes, which are the same data, only newer; the WAL
still holds every frame not yet checkpointed with a successful fsync, and recovery
applies it over the database file. The marker stays until the resync has succeeded.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

import apsw

from .._errors import SyncError
from .._model.messages import now_text
from .fileops import FileOps

__all__ = ["SYNC_MARKER", "describe", "is_sync_failure", "mark_sync_failed", "read_marker",
           "resync"]

log = logging.getLogger("evidence.store")

SYNC_MARKER = "sync-failed"
_MARKER_HEAD = ("evidence: an fsync of this store failed; it is resynced at the next open "
                "for writing")
_CHUNK = 1024 * 1024
# A failed fsync, or an I/O error that does not say which operation failed (a VFS may not:
# its bare SQLITE_IOERR, or an apsw.IOError with no extended code at all).
_SYNC_CODES = frozenset({apsw.SQLITE_IOERR, apsw.SQLITE_IOERR_FSYNC,
                         apsw.SQLITE_IOERR_DIR_FSYNC})


def is_sync_failure(exc: BaseException) -> bool:
    """Is this SQLite error (possibly) a failed fsync, after which reads may not be on disk?

    Other I/O errors are not: a failed write or read changes nothing the disk holds, and
    SQLite writes a commit's frames before its single fsync, so a write error at COMMIT
    means the commit frame was never written.
    """
    if not isinstance(exc, apsw.IOError):
        return False
    code = getattr(exc, "extendedresult", None)
    # No code at all: a Python VFS (an encryption or compression shim) raised a bare
    # apsw.IOError, which reaches the caller as it was raised. It does not say which
    # operation failed, so it may have been the fsync (issue 30: 10 of 10 such acks lost).
    return code is None or code in _SYNC_CODES


def describe(exc: BaseException) -> str:
    """An SQLite error in words, with its extended code's name (an error a VFS raised has
    no message of its own: ``SQLITE_IOERR_FSYNC`` is what it says)."""
    code = getattr(exc, "extendedresult", None)
    name = apsw.mapping_extended_result_codes.get(code) or apsw.mapping_result_codes.get(code)
    text = str(exc)
    if name and name not in text:
        return f"{name}: {text}" if text else name
    return text or type(exc).__name__


def read_marker(root: Path) -> str | None:
    """The marker's text (when and what failed) if the store has one, else None."""
    try:
        return (root / SYNC_MARKER).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None


def mark_sync_failed(root: Path, file_ops: FileOps, reason: str) -> bool:
    """Leave ``sync-failed`` in the store directory; True if it is there (at least cached).

    Durable if the disk still allows it (temp file, fsync, rename, directory fsync, each
    failure tolerated): what matters most is that later opens in this boot see it, since
    only they can be lied to by the page cache. An existing marker is kept (the first
    failure is the one that matters).
    """
    marker = root / SYNC_MARKER
    if marker.exists():
        return True
    text = f"{_MARKER_HEAD}\nat {now_text()}\n{reason}\n".encode()
    try:
        fd, tmp = file_ops.open_temp(root)
    except OSError as exc:
        log.error("cannot leave the %s marker in %s (%s): %s", SYNC_MARKER, root, exc, reason,
                  extra={"event": "store.resync_marker_failed"})
        return False
    try:
        try:
            file_ops.write(fd, text)
            file_ops.chmod_readonly(tmp)  # the store's mode policy: a record, never changed
            with contextlib.suppress(OSError):
                file_ops.fsync(fd)  # durable if possible
        finally:
            with contextlib.suppress(OSError):
                file_ops.close(fd)
        file_ops.rename(tmp, marker)
    except OSError as exc:
        with contextlib.suppress(OSError):
            file_ops.unlink(tmp)
        log.error("cannot leave the %s marker in %s (%s): %s", SYNC_MARKER, root, exc, reason,
                  extra={"event": "store.resync_marker_failed"})
        return False
    with contextlib.suppress(OSError):
        file_ops.fsync_dir(root)
    log.error("an fsync of %s failed; the store is marked for a resync: %s", root, reason,
              extra={"event": "store.fsync_failed"})
    return True


def resync(root: Path, db_name: str, *, file_ops: FileOps, busy_timeout_ms: int,
           vfs: str | None = None, also: Callable[[], None] | None = None) -> None:
    """Rewrite the database and its WAL in place, fsync them and the directory, then
    remove the marker. Raises ``SyncError`` if any of it fails (the marker stays).
    ``also`` resyncs the rest of the store (its artifact packs) before the marker goes.

    Needs the database to itself: an exclusive lock (``locking_mode=EXCLUSIVE``, then a
    transaction) keeps every other connection, reader or writer, out while bytes are
    read and written back, so no checkpoint can move a page under the copy.
    """
    db_path = root / db_name
    reason = (read_marker(root) or "").strip().splitlines()[1:]
    told = f" ({'; '.join(reason)})" if reason else ""
    try:
        conn = apsw.Connection(str(db_path), flags=apsw.SQLITE_OPEN_READWRITE, vfs=vfs)
    except apsw.Error as exc:
        raise _failed(root, told, exc) from exc
    fds: list[int] = []
    try:
        conn.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1)
        conn.set_busy_timeout(busy_timeout_ms)
        conn.execute("PRAGMA locking_mode = EXCLUSIVE").fetchall()
        conn.execute("BEGIN EXCLUSIVE")
        try:
            for name in (db_name + "-wal", db_name):
                path = root / name
                if not path.exists():
                    continue
                fd = file_ops.open_existing(path)
                fds.append(fd)  # closed only after the connection: closing another fd
                _rewrite(file_ops, fd)  # of the database would drop SQLite's POSIX locks
                file_ops.fsync(fd)
            file_ops.fsync_dir(root)
            if also is not None:
                also()
        finally:
            conn.execute("ROLLBACK")
    except apsw.BusyError as exc:
        raise SyncError(
            f"{root}: the store must be resynced after a failed fsync{told}, and another "
            "connection has it open",
            hint="stop the other processes using this store (a crawl, a service, a long "
            "'evidence export'), then open it again", path=str(root)) from exc
    except (apsw.Error, OSError) as exc:
        raise _failed(root, told, exc) from exc
    finally:
        conn.close()
        for fd in fds:
            with contextlib.suppress(OSError):
                file_ops.close(fd)
    try:
        file_ops.unlink(root / SYNC_MARKER)
        file_ops.fsync_dir(root)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise _failed(root, told, exc) from exc
    log.warning("%s: resynced after a failed fsync%s", root, told,
                extra={"event": "store.resynced"})


def _rewrite(file_ops: FileOps, fd: int) -> None:
    """Write every byte of the file back where it is: the pages are dirty again."""
    offset = 0
    while chunk := os.pread(fd, _CHUNK, offset):
        file_ops.pwrite(fd, chunk, offset)
        offset += len(chunk)


def _failed(root: Path, told: str, exc: BaseException) -> SyncError:
    return SyncError(
        f"{root}: the store must be resynced after a failed fsync{told}, and the resync "
        f"failed too ({exc}); nothing is acknowledged until it succeeds",
        hint="the disk is still failing: check it (dmesg, smartctl), fix or replace it, then "
        "open the store again",
        path=str(root))
