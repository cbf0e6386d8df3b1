"""Pack recovery: after a crash, and after a failed fsync (``PackRecovery``, ``resync_packs``).

A pack whose appender is gone (its ``flock`` is free) is recovered by the next writable
open: each record is re-hashed, the scan stops at the first one that is not whole (the torn
or unsynced tail), and the pack is sealed with an index of what came before. Nothing a
committed row references can be in that tail: it was synced before its COMMIT, and an
fsync covers every byte written before it. Bytes are never truncated or rewritten: sealing
only appends. A ``.new`` pack whose creator died before naming it holds no record and goes.

After a failed fsync (``PACKS/SYNC-FAILED`` names the packs), ``resync_packs`` rewrites
those packs and every unsealed one in place and fsyncs them, before the store's marker
goes (docs/design.md, "After a failed fsync, reads are not evidence").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from pathlib import Path

import blake3

from .._errors import (
    ArtifactError,
)
from . import packfile as pf
from .artifactbase import _READ_ONLY, CHUNK_SIZE
from .fileops import FileOps
from .fsync import fsync_file
from .packindex import (
    _FAILED_LIST,
    PACKS_DIR,
    PackIndex,
    _Pack,
    _reader,
)

log = logging.getLogger("evidence.store")

__all__ = ["PackRecovery", "packs_sync_failed", "resync_packs"]


class PackRecovery(PackIndex):
    """Recovering another process's pack (see the module's docstring)."""

    def _recover(self, pack: _Pack, size: int) -> bool:
        """Seal ``pack`` if its appender is gone (no lock on it): its records re-hashed,
        the index holding those before the first that is not whole. False if it is alive."""
        assert pack.read_fd is not None
        try:
            fcntl.flock(pack.read_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            read_at = _reader(pack.read_fd)
            if pf.parse_file_header(read_at(0, pf.FILE_HEADER_SIZE)) is None:
                if size == 0:  # created, never written: nothing to keep
                    self._unlink_quietly(pack.path)
                    self._packs.pop(pack.no, None)
                    self._by_name.pop(pack.name, None)
                    return True
                log.warning("%s has no valid pack header; its bytes are kept, unread",
                            pack.path, extra={"event": "pack.bad_header"})
                pack.sealed = True  # never appended to, never tailed again
                return True
            if size == pf.FILE_HEADER_SIZE:  # a pack created ahead, never appended to
                self._unlink_quietly(pack.path)
                self._packs.pop(pack.no, None)
                self._by_name.pop(pack.name, None)
                return True
            found = pf.scan(read_at, pf.FILE_HEADER_SIZE, size, verify=True)
            if not found.complete:
                log.warning("%s: the tail after byte %d is not whole records (a crash before "
                            "it was synced); it is kept, unindexed", pack.path, found.valid_end,
                            extra={"event": "pack.torn_tail"})
            seal = pf.encode_seal(found.entries, size)
            try:
                self._ops.make_writable(pack.path)
                fd = self._ops.open_existing(pack.path)
                try:
                    # What was read may be only in the page cache (the appender died, the
                    # machine did not): durable before the index that lists it, as in _seal.
                    self._ops.fsync(fd)
                    self._ops.pwrite(fd, seal, size)
                    self._ops.fsync(fd)
                finally:
                    self._ops.close(fd)
                self._ops.chmod_readonly(pack.path)
            except OSError as exc:
                if exc.errno in _READ_ONLY:  # someone else's store: read it as it is
                    for entry in found.entries:
                        self._add(pack, entry)
                    pack.size = found.valid_end
                    return True
                raise ArtifactError(f"cannot seal {pack.path} after a crash: {exc}",
                                    path=pack.path, hint="check the disk, then open the "
                                    "store again") from exc
            pack.sealed = True
            pack.size = pack.synced = size + len(seal)
            self._seal_known(pack, size, seal[:-pf.TRAILER_SIZE])
            return True
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(pack.read_fd, fcntl.LOCK_UN)

    def _remove_stale_new(self, name: str) -> None:
        """A pack whose creator died before naming it: it holds no record."""
        path = self.packs_dir / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # Removed while still locked. A creator between its create and its lock
            # (``PackAppend._try_create``) waits for this lock, then finds its name gone
            # and creates another; unlocked before the unlink, the creator could lock it,
            # find its name, and lose it to the unlink just before naming it ``.pack``.
            self._unlink_quietly(path)
        except BlockingIOError:
            return
        finally:
            os.close(fd)

    def _unlink_quietly(self, path: Path) -> None:
        with contextlib.suppress(OSError):
            self._ops.unlink(path)


def packs_sync_failed(root: Path) -> bool:
    """Whether a pack fsync failed under ``root`` and the packs are not resynced yet."""
    return (root / PACKS_DIR / _FAILED_LIST).exists()


def resync_packs(root: Path, file_ops: FileOps) -> None:
    """After a failed fsync: rewrite in place, and fsync, every pack an fsync failed on
    and every pack not sealed, so what reads show is on the disk again (the store's
    resync, ``_store/resync.py``, calls this before it removes its marker). Recovery at
    the next open then re-hashes the unsealed ones. OSError is raised as it is."""
    packs = root / PACKS_DIR
    if not packs.is_dir():
        return
    listed = packs / _FAILED_LIST
    try:
        failed = set(listed.read_text(encoding="ascii", errors="replace").split())
    except FileNotFoundError:
        failed = set()
    for name in sorted(os.listdir(packs)):
        if not name.endswith(".pack"):
            continue
        path = packs / name
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            sealed = pf.read_seal(_reader(fd), size) is not None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OSError(errno.EBUSY, "a process still appends to it", str(path)) \
                    from None
            if sealed and name[:-5] not in failed:
                continue
            file_ops.make_writable(path)
            wfd = file_ops.open_existing(path)
            try:
                offset = 0
                while chunk := os.pread(fd, CHUNK_SIZE, offset):
                    file_ops.pwrite(wfd, chunk, offset)
                    offset += len(chunk)
                file_ops.fsync(wfd)
            finally:
                file_ops.close(wfd)
            file_ops.chmod_readonly(path)
            if sealed:
                _reseal_checked(path, fd, file_ops)
        finally:
            os.close(fd)
    file_ops.fsync_dir(packs)
    if failed:
        file_ops.unlink(listed)
        file_ops.fsync_dir(packs)


def _reseal_checked(path: Path, fd: int, file_ops: FileOps) -> None:
    """A sealed pack an fsync failed on: its index may list records whose bytes never
    reached the disk. If any does not hash right now, seal it again with those left out."""
    read_at = _reader(fd)
    size = os.fstat(fd).st_size
    entries = pf.read_seal(read_at, size) or []
    good = [e for e in entries if e.kind != pf.PAYLOAD
            or blake3.blake3(read_at(e.offset + pf.RECORD_SIZE, e.length)).digest() == e.digest]
    if len(good) == len(entries):
        return
    log.warning("%s: %d records of its index did not reach the disk; sealed again without "
                "them", path, len(entries) - len(good), extra={"event": "pack.resealed"})
    seal = pf.encode_seal(good, size)
    file_ops.make_writable(path)
    wfd = file_ops.open_existing(path)
    try:
        file_ops.pwrite(wfd, seal, size)
        file_ops.fsync(wfd)
    finally:
        file_ops.close(wfd)
    file_ops.chmod_readonly(path)


def _append_line(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, (line + "\n").encode("ascii"))
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        fsync_file(path)
