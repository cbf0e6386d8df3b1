"""Every filesystem mutation a put makes, in one replaceable place: ``FileOps``, the
fault-injection seam.

The file store (``artifacts.py``), the packs (``packs.py`` and its parts), their
conversion and the store's resync write, fsync, rename and unlink through a ``FileOps``;
the fault tests give them another (``evidence.testing.disk``'s ``CrashFileOps``: a disk
that loses what was not synced, or fails the operation a trial names). Apart from the
stores, so that a simulated disk depends on this seam alone.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .fsync import fsync_dir

__all__ = ["FileOps"]

_TEMP_PREFIX, _TEMP_SUFFIX = "put-", ".tmp"


class FileOps:
    """Every filesystem mutation a put makes, in one replaceable place (the fault-injection seam).

    Methods raise OSError; the store translates. Subclasses may record, delay or fail calls.
    """

    # Whether work a store hands to a thread of its own (a pack's seal, the next pack
    # created ahead) runs there, or in line where it is handed over. A simulated disk runs
    # it in line: its fault trials then make their operations in one order every run, so
    # "the fault at operation N" is the same operation each time (a trial is repeatable).
    background = True

    def open_temp(self, directory: Path) -> tuple[int, Path]:
        path = directory / f"{_TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(8)}{_TEMP_SUFFIX}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        return os.open(path, flags, 0o600), path

    def write(self, fd: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:  # os.write may write less than asked
            written = os.write(fd, view)
            if written <= 0:
                raise OSError(errno.EIO, "write made no progress")
            view = view[written:]

    def writev(self, fd: int, buffers: Sequence[bytes | memoryview],
               size: int | None = None) -> None:
        """Write the buffers one after another, in one system call when the kernel takes
        them all (a pack record: its header and payload, the payload not copied).
        ``size``, if given, is their total length (a put knows it: no sum per call)."""
        written = os.writev(fd, buffers)
        if written == (sum(len(b) for b in buffers) if size is None else size):
            return  # nearly always: all of it at once
        views = [memoryview(b).cast("B") for b in buffers if len(b)]
        while written and views:  # skip what went out, then write the rest
            if written >= views[0].nbytes:
                written -= views.pop(0).nbytes
            else:
                views[0], written = views[0][written:], 0
        while views:
            written = os.writev(fd, views)
            if written <= 0:
                raise OSError(errno.EIO, "write made no progress")
            while views and written >= views[0].nbytes:
                written -= views[0].nbytes
                views.pop(0)
            if written:
                views[0] = views[0][written:]

    def open_existing(self, path: Path) -> int:
        """Open an existing file for rewriting in place (the store's resync, after a failed
        fsync); never creates one."""
        return os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            if written <= 0:
                raise OSError(errno.EIO, "write made no progress")
            view, offset = view[written:], offset + written

    def create_exclusive(self, path: Path, mode: int) -> int:
        """Create ``path`` (it must not exist) for writing, with ``mode`` from the start: a
        pack segment is made 0444 and written through this descriptor only."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        return os.open(path, flags, mode)

    def open_read(self, path: Path) -> int:
        """Open an existing file read-only: the writer fsyncs a pack another process
        appends to through such a descriptor (fsync needs no write access)."""
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)

    def make_writable(self, path: Path) -> None:
        """Give a read-only file its owner's write bit back (sealing a pack whose
        appender died, or rewriting one in a resync); ``chmod_readonly`` undoes it."""
        os.chmod(path, 0o644)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def start_writeback(self, fd: int, offset: int, length: int) -> None:
        """Ask the kernel to start writing ``length`` bytes from ``offset`` to the disk now,
        without waiting (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``; elsewhere
        nothing). A hint, never a durability point: only ``fsync`` makes bytes durable.
        A pack appender calls it every few hundred KiB, so the disk works on a group's
        first records while later ones are hashed, and the group's fsync has less left to
        wait for. It neither waits for the writes nor consumes their errors: a failed
        writeback is still reported by the next ``fsync`` of the file (Linux keeps write
        errors per file until each descriptor's fsync has seen them)."""
        if _sync_file_range is not None:
            _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)

    def close(self, fd: int) -> None:
        os.close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        os.rename(src, dst)

    def fsync_dir(self, path: Path) -> None:
        fsync_dir(path)

    def makedirs(self, path: Path) -> list[Path]:
        """Create ``path`` and missing parents; return the directories created, top-down."""
        missing: list[Path] = []
        probe = Path(path)
        while not os.path.lexists(probe):
            missing.append(probe)
            probe = probe.parent
        created = []
        for directory in reversed(missing):
            try:
                os.mkdir(directory, 0o755)
            except FileExistsError:  # a concurrent put won the race; fine
                continue
            created.append(directory)
        return created

    def chmod_readonly(self, path: Path) -> None:
        os.chmod(path, 0o444)

    def unlink(self, path: Path) -> None:
        os.unlink(path)


def _load_sync_file_range() -> Any:
    """libc's ``sync_file_range`` (Linux), or None. Called through ctypes, which releases
    the GIL for the call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of dirty pages, do not wait
