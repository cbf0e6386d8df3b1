"""Fault injection for the write path: a simulated disk, an SQLite VFS and artifact FileOps.

The model, first (SQLite's own crash tests, ``src/test6.c``, work the same way):

    A file's bytes live in two places: the OS cache (what reads see: the real file here)
    and the durable medium (what survives power loss: kept in memory by ``SimulatedDisk``).
    A write reaches only the cache. ``fsync`` moves the file's pending writes to the medium.
    A directory entry (a create, delete or rename) is durable only once that directory is
    fsynced. At power loss the medium is all there is, plus whatever the hardware happened
    to write back of the pending writes: nothing (``drop``), each whole write or not, in
    any order (``reorder``), or each 512-byte sector old, new or garbage (``torn``).

``SimulatedDisk`` keeps that model for every file under one root. Two seams report into
it, so the database and the artifacts share one disk and one operation counter:

- ``CrashVFS``, an apsw VFS whose files inherit ``apsw.VFSFile`` (the default VFS does the
  real I/O). Like ``os_unix.c``, it fsyncs a journal's or WAL's directory at that file's
  first sync when it was opened with ``SQLITE_OPEN_CREATE``, and after ``xDelete`` only when
  SQLite passes ``syncDir`` (which it does for the rollback journal only under
  ``synchronous=EXTRA``: design rule 12). The ``-shm`` file is not modelled:
  SQLite rebuilds it after a crash.
- ``CrashFileOps``, an ``evidence._store.fileops.FileOps`` for ``ArtifactStore(file_ops=...)``.

A ``Fault`` names the N-th counted operation (read, write, sync, truncate, meta: create,
rename, delete, mkdir), optionally only on some kinds of file (the database, its WAL, an
artifact, a directory), and what happens there: power loss (that operation and every later
one fail with EIO, and the disk's contents are frozen as the crash image), or an I/O error
or disk-full error (once, from then on, or from then on for a while: a failing device that
comes back). A failed fsync loses its pending writes for good while reads still see them
(``sync_failure="lose"``, Linux since 4.13: the pages are marked clean, so a later fsync
succeeds without writing them) or keeps them pending for a later fsync (``"keep"``). A
failed directory fsync always keeps its entries pending: journaling file systems do not
drop a directory entry and then report later fsyncs as successful (ext4 and XFS stop
the journal instead).

``write_crash_image()`` replaces everything under the root with the frozen image; the
store is then reopened with the ordinary VFS, as after a reboot. Modelled files are never
really fsynced (the model, not the kernel, decides what is durable), so loops run at
memory speed; with the root on tmpfs (/dev/shm) thousands of trials take minutes.
``open_store`` opens a store on the disk: its database through the VFS, its artifacts
through the FileOps. ``evidence.testing.trial`` runs a fixed writer workload there under one
fault and checks what survived; ``tools/faultloop.py`` and ``tests/test_faults.py`` drive it
for N = 1, 2, ...
"""

from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import os
import random
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import apsw

from .._store.db import Store
from .._store.fileops import FileOps

__all__ = [
    "CrashFileOps",
    "CrashMode",
    "CrashVFS",
    "Fault",
    "SimulatedDisk",
    "open_store",
]

Operation = Literal["read", "write", "sync", "truncate", "meta", "writeback"]
# What an operation touches, for faults aimed at one kind of file (``Fault.files``).
FileKind = Literal["database", "wal", "journal", "artifact", "directory", "other"]
FILE_KINDS: tuple[str, ...] = ("database", "wal", "journal", "artifact", "directory", "other")
CrashMode = Literal["drop", "torn", "reorder", "keep"]
SECTOR = 512
_SHM = "-shm"
_JOURNALS = apsw.SQLITE_OPEN_MAIN_JOURNAL | apsw.SQLITE_OPEN_WAL | apsw.SQLITE_OPEN_SUPER_JOURNAL


@dataclass(frozen=True, kw_only=True)
class Fault:
    """What happens at the ``at``-th (1-based) operation whose kind is in ``ops``."""

    action: Literal["power_loss", "io_error", "disk_full"]
    at: int
    ops: frozenset[str] = frozenset({"write", "sync"})
    crash: CrashMode = "drop"  # power loss: what becomes of writes not yet synced
    persistent: bool = False  # errors: every later counted operation fails too
    heal_after: int = 0  # persistent: after this many failed operations they work again
    path_suffix: str = ""  # count only operations on paths ending with this
    files: frozenset[str] = frozenset()  # count only operations on these FILE_KINDS (all)

    def __post_init__(self) -> None:
        unknown = set(self.files) - set(FILE_KINDS)
        if unknown:
            raise ValueError(f"unknown file kinds {sorted(unknown)}; known: {FILE_KINDS}")

    def fails(self, counted: int) -> bool:
        """Does the ``counted``-th matching operation fail (or cut the power)?"""
        if counted == self.at:
            return True
        if not self.persistent or counted < self.at:
            return False
        return not self.heal_after or counted < self.at + self.heal_after

    def __str__(self) -> str:
        kinds = "|".join(sorted(self.ops))
        what = f"{self.action}({self.crash})" if self.action == "power_loss" else self.action
        where = f" on *{self.path_suffix}" if self.path_suffix else ""
        if self.files:
            where += f" of {'|'.join(sorted(self.files))}"
        when = ""
        if self.persistent:
            when = f" for {self.heal_after}" if self.heal_after else " onwards"
        return f"{what} at {kinds} #{self.at}{where}{when}"


@dataclass(eq=False)
class _Inode:
    durable: bytearray  # what the medium holds
    mode: int  # permission bits now
    durable_mode: int
    pending: list[tuple] = field(default_factory=list)  # ("w", offset, bytes) | ("t", size)
    dirsync: bool = False  # fsync the directory at the first sync (os_unix.c UNIXFILE_DIRSYNC)


def _apply(data: bytearray, op: tuple) -> None:
    if op[0] == "t":
        size = op[1]
        if size < len(data):
            del data[size:]
        else:
            data.extend(bytes(size - len(data)))
        return
    _, offset, payload = op
    if offset > len(data):
        data.extend(bytes(offset - len(data)))
    data[offset:offset + len(payload)] = payload


class SimulatedDisk:
    """The durable-versus-cached model of every file and directory under ``root``.

    Thread-safe: the writer commits in a worker thread. ``log`` records every counted
    operation as (number, kind, path relative to root, offset, length, outcome).
    """

    def __init__(self, root: os.PathLike[str] | str, *, seed: int = 0,
                 sync_failure: Literal["lose", "keep"] = "lose") -> None:
        self.root = Path(root).absolute()
        self.rng = random.Random(seed)
        self.sync_failure = sync_failure
        self.fault: Fault | None = None
        self.counts: collections.Counter[str] = collections.Counter()
        self.kind_counts: collections.Counter[str] = collections.Counter()  # "op:kind"
        self.counted = 0  # operations that matched the fault's kinds so far
        self.log: list[tuple[int, str, str, int, int, str]] = []
        self.log_kinds: list[FileKind] = []  # the kind of file of each ``log`` entry
        self.crashed = False
        self.power_losses = 0  # file operations made before the last one stay dead
        self.wal_syncs = 0  # completed syncs of a -wal file: what makes WAL commits durable
        self.wal_syncs_at_crash = 0
        self.fired: list[str] = []
        self.unobserved: list[str] = []  # files that appeared without passing a seam
        self._lock = threading.RLock()
        self._inodes: dict[int, _Inode] = {}
        self._live: dict[Path, int] = {}
        self._durable: dict[Path, dict[str, int | None]] = {}  # None: a subdirectory
        self._ids = itertools.count(1)
        self._image: tuple[list[Path], list[tuple[Path, bytes, int]]] | None = None

    # --- setting up --------------------------------------------------------------------

    def capture(self) -> None:
        """Take everything under the root as durable (the state a test starts from)."""
        with self._lock:
            self._inodes.clear()
            self._live.clear()
            self._durable.clear()
            self.root.mkdir(parents=True, exist_ok=True)
            for dirpath, dirnames, filenames in os.walk(self.root):
                here = Path(dirpath)
                entries: dict[str, int | None] = dict.fromkeys(dirnames)
                for name in filenames:
                    if name.endswith(_SHM):
                        continue
                    entries[name] = self._adopt(here / name, note=False)
                self._durable[here] = entries
            self.crashed = False
            self._image = None

    def arm(self, fault: Fault | None) -> None:
        with self._lock:
            self.fault = fault
            self.counted = 0

    def _adopt(self, path: Path, *, note: bool = True) -> int:
        """A file nobody told us about: take its current bytes as durable."""
        st = path.stat()
        ino = next(self._ids)
        self._inodes[ino] = _Inode(bytearray(path.read_bytes()), st.st_mode & 0o777,
                                   st.st_mode & 0o777)
        self._live[path] = ino
        if note:
            self.unobserved.append(self._rel(path))
        return ino

    def _rel(self, path: Path | str) -> str:
        with contextlib.suppress(ValueError):
            return str(Path(path).relative_to(self.root))
        return str(path)

    # --- the fault point every seam calls before it acts ---------------------------------

    def kind(self, path: Path | str) -> FileKind:
        """What a path is, for faults aimed at one kind of file."""
        path = Path(path)
        if path.is_dir():
            return "directory"
        name = path.name
        if name.endswith("-wal"):
            return "wal"
        if name.endswith("-journal"):
            return "journal"
        if name.endswith(".db"):
            return "database"
        return "artifact" if "artifacts" in Path(self._rel(path)).parts else "other"

    def check(self, op: Operation, path: Path | str, offset: int = 0, length: int = 0
              ) -> Literal["ok", "dead", "io", "full"]:
        """Count one operation; say whether it may proceed, or how it fails."""
        with self._lock:
            self.counts[op] += 1
            kind = self.kind(path)
            self.kind_counts[f"{op}:{kind}"] += 1
            outcome: Literal["ok", "dead", "io", "full"] = "ok"
            fault = self.fault
            if self.crashed:
                outcome = "dead"
            elif (fault and op in fault.ops and str(path).endswith(fault.path_suffix)
                  and (not fault.files or kind in fault.files)):
                self.counted += 1
                if fault.fails(self.counted):
                    self.fired.append(f"{fault} ({op} {self._rel(path)})")
                    if fault.action == "power_loss":
                        self.power_loss(fault.crash)
                        outcome = "dead"
                    else:
                        outcome = "io" if fault.action == "io_error" else "full"
            self.log.append((sum(self.counts.values()), op, self._rel(path), offset, length,
                             outcome))
            self.log_kinds.append(kind)
            return outcome

    # --- events, reported after the real operation succeeded ------------------------------

    def opened(self, path: Path, *, dirsync: bool = False, created: bool = False) -> int:
        with self._lock:
            ino = self._live.get(path)
            if ino is None:
                if created:
                    ino = next(self._ids)
                    self._inodes[ino] = _Inode(bytearray(), 0o644, 0o644)
                    self._live[path] = ino
                else:
                    ino = self._adopt(path)
            self._inodes[ino].dirsync |= dirsync
            return ino

    def created(self, path: Path, mode: int) -> int:
        with self._lock:
            ino = next(self._ids)
            self._inodes[ino] = _Inode(bytearray(), mode, mode)
            self._live[path] = ino
            return ino

    def wrote(self, ino: int, offset: int, data: bytes) -> None:
        with self._lock:
            self._inodes[ino].pending.append(("w", offset, bytes(data)))

    def truncated(self, ino: int, size: int) -> None:
        with self._lock:
            self._inodes[ino].pending.append(("t", size))

    def synced(self, ino: int, path: Path) -> None:
        with self._lock:
            inode = self._inodes[ino]
            for op in inode.pending:
                _apply(inode.durable, op)
            inode.pending.clear()
            inode.durable_mode = inode.mode
            if path.name.endswith("-wal"):
                self.wal_syncs += 1

    def take_dirsync(self, ino: int) -> bool:
        """Whether the file's directory is to be synced now (once, after its first sync)."""
        with self._lock:
            inode = self._inodes[ino]
            wanted, inode.dirsync = inode.dirsync, False
            return wanted

    def sync_failed(self, ino: int) -> None:
        """A failed fsync: with "lose", the pending writes never reach the medium."""
        with self._lock:
            if self.sync_failure == "lose":
                self._inodes[ino].pending.clear()

    def chmod(self, path: Path, mode: int) -> None:
        with self._lock:
            ino = self._live.get(path)
            if ino is not None:
                self._inodes[ino].mode = mode

    def deleted(self, path: Path) -> None:
        with self._lock:
            self._live.pop(path, None)

    def renamed(self, src: Path, dst: Path) -> None:
        with self._lock:
            ino = self._live.pop(src, None)
            if ino is not None:
                self._live[dst] = ino

    def dir_synced(self, directory: Path) -> None:
        with self._lock:
            self._durable[Path(directory)] = self._scan(Path(directory))

    def _scan(self, directory: Path) -> dict[str, int | None]:
        """The directory's entries now, as the medium would record them at an fsync."""
        entries: dict[str, int | None] = {}
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return entries
        for name in names:
            path = directory / name
            if path.is_dir():
                entries[name] = None
            elif not name.endswith(_SHM) and path.is_file():
                ino = self._live.get(path)
                entries[name] = ino if ino is not None else self._adopt(path)
        for gone in [p for p in self._live if p.parent == directory and p.name not in entries]:
            del self._live[gone]  # removed without passing a seam (e.g. reclaim's unlink)
        return entries

    # --- power loss ----------------------------------------------------------------------

    def power_loss(self, mode: CrashMode = "drop") -> None:
        """Cut the power now: freeze the crash image; every later operation fails."""
        with self._lock:
            if self.crashed:
                return
            self.crashed = True
            self.power_losses += 1
            self.wal_syncs_at_crash = self.wal_syncs
            dirs: list[Path] = []
            files: list[tuple[Path, bytes, int]] = []
            contents: dict[int, bytes] = {}
            stack = [self.root]
            while stack:
                directory = stack.pop()
                for name, ino in sorted(self._crash_listing(directory, mode).items()):
                    path = directory / name
                    if ino is None:
                        dirs.append(path)
                        stack.append(path)
                        continue
                    inode = self._inodes[ino]
                    if ino not in contents:
                        contents[ino] = self._crash_content(inode, mode)
                    files.append((path, contents[ino],
                                  inode.mode if mode == "keep" else inode.durable_mode))
            self._image = (dirs, files)

    def _crash_listing(self, directory: Path, mode: CrashMode) -> dict[str, int | None]:
        """A directory's entries after the crash: the fsynced ones, or (``keep``) the live
        ones, or (``torn``, ``reorder``) either, as if its metadata was written back or not."""
        durable = self._durable.get(directory, {})
        if mode == "keep" or (mode != "drop" and self.rng.random() < 0.5):
            return self._scan(directory)
        return durable

    def _crash_content(self, inode: _Inode, mode: CrashMode) -> bytes:
        data = bytearray(inode.durable)
        pending = list(inode.pending)
        if mode == "keep":
            for op in pending:
                _apply(data, op)
        elif mode == "reorder":  # each write whole or not at all, landing in any order
            self.rng.shuffle(pending)
            for op in pending:
                if self.rng.random() < 0.5:
                    _apply(data, op)
        elif mode == "torn":  # each sector of each write: new, old, or garbage
            for op in pending:
                if op[0] == "t":
                    if self.rng.random() < 0.5:
                        _apply(data, op)
                    continue
                _, offset, payload = op
                start = offset - offset % SECTOR
                for lo in range(start, offset + len(payload), SECTOR):
                    a, b = max(lo, offset), min(lo + SECTOR, offset + len(payload))
                    roll = self.rng.random()
                    if roll < 1 / 3:
                        _apply(data, ("w", a, payload[a - offset:b - offset]))
                    elif roll < 2 / 3:
                        _apply(data, ("w", a, self.rng.randbytes(b - a)))
        return bytes(data)

    def write_crash_image(self) -> None:
        """Replace everything under the root with the frozen image (after every file closed)."""
        with self._lock:
            if self._image is None:
                raise RuntimeError("write_crash_image() before power_loss()")
            dirs, files = self._image
            for child in self.root.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            for directory in dirs:
                directory.mkdir(parents=True, exist_ok=True)
            for path, data, mode in files:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                path.chmod(mode)
            self.capture()


# --- the SQLite seam --------------------------------------------------------------------

class CrashVFS(apsw.VFS):
    """An apsw VFS over the default one that reports to a ``SimulatedDisk`` and injects faults.

    Without a disk it only does targeted faults: ``arm("sync", "-wal")`` fails the next sync
    of a file whose name ends with ``-wal`` once (the API of the old ``tests/faultvfs.py``).
    """

    def __init__(self, name: str = "crashvfs", *, disk: SimulatedDisk | None = None) -> None:
        self.name = name
        self.disk = disk
        self.armed: dict[tuple[str, str], int] = {}
        self.fired: list[tuple[str, str]] = []
        super().__init__(name, "")

    def arm(self, operation: str, suffix: str, after: int = 0) -> None:
        """Fail the ``after``-th next ``operation`` on a file whose name ends with ``suffix``."""
        self.armed[(operation, suffix)] = after

    def fail(self, op: Operation, path: str, offset: int = 0, length: int = 0) -> None:
        """Raise the error the fault plan (or an armed fault) puts at this operation.

        I/O errors carry the extended code ``os_unix.c`` returns for that operation
        (``SQLITE_IOERR_FSYNC`` for a failed fsync, ...), as SQLite would report it.
        """
        for (armed_op, suffix), countdown in list(self.armed.items()):
            if armed_op == op and path.endswith(suffix):
                if countdown == 0:
                    del self.armed[(armed_op, suffix)]
                    self.fired.append((armed_op, suffix))
                    raise apsw.exception_for(_IOERR_CODES[op])
                self.armed[(armed_op, suffix)] = countdown - 1
        if self.disk is None:
            return
        outcome = self.disk.check(op, path, offset, length)
        if outcome in ("dead", "io"):  # power loss: every operation fails with EIO
            raise apsw.exception_for(_IOERR_CODES[op])
        if outcome == "full":
            raise apsw.exception_for(apsw.SQLITE_FULL)

    def xOpen(self, name, flags):  # apsw's names
        if self.disk is not None and self.disk.crashed:
            raise apsw.CantOpenError("simulated power loss: the disk is gone")
        return CrashFile(self, name, flags)

    def xDelete(self, filename: str, syncdir: bool) -> None:
        self.fail("meta", filename)
        super().xDelete(filename, syncdir)
        if self.disk is not None:
            path = Path(filename)
            self.disk.deleted(path)
            if syncdir:
                self.disk.dir_synced(path.parent)


_IOERR_CODES = {"read": apsw.SQLITE_IOERR_READ, "write": apsw.SQLITE_IOERR_WRITE,
                "sync": apsw.SQLITE_IOERR_FSYNC, "truncate": apsw.SQLITE_IOERR_TRUNCATE,
                "meta": apsw.SQLITE_IOERR_DELETE}


class CrashFile(apsw.VFSFile):
    def __init__(self, vfs: CrashVFS, name, flags) -> None:
        self.vfs = vfs
        self.filename = name if isinstance(name, str) or name is None else name.filename()
        existed = self.filename is not None and os.path.exists(self.filename)
        super().__init__("", name, flags)
        self.ino: int | None = None
        if vfs.disk is not None and self.filename and not self.filename.endswith(_SHM):
            create = bool(flags[0] & apsw.SQLITE_OPEN_CREATE)
            self.ino = vfs.disk.opened(Path(self.filename), created=not existed,
                                       dirsync=create and bool(flags[0] & _JOURNALS))

    def xRead(self, amount: int, offset: int) -> bytes:
        self.vfs.fail("read", self.filename or "", offset, amount)
        return super().xRead(amount, offset)

    def xWrite(self, data: bytes, offset: int) -> None:
        self.vfs.fail("write", self.filename or "", offset, len(data))
        super().xWrite(data, offset)
        if self.ino is not None:
            self.vfs.disk.wrote(self.ino, offset, data)  # type: ignore[union-attr]

    def xTruncate(self, newsize: int) -> None:
        self.vfs.fail("truncate", self.filename or "", newsize)
        super().xTruncate(newsize)
        if self.ino is not None:
            self.vfs.disk.truncated(self.ino, newsize)  # type: ignore[union-attr]

    def xSync(self, flags: int) -> None:
        try:
            self.vfs.fail("sync", self.filename or "")
        except apsw.Error:
            if self.ino is not None:
                self.vfs.disk.sync_failed(self.ino)  # type: ignore[union-attr]
            raise
        if self.ino is None:  # modelled files are made durable by the model, not by fsync
            super().xSync(flags)
            return
        disk = self.vfs.disk
        assert disk is not None and self.filename is not None
        disk.synced(self.ino, Path(self.filename))
        if disk.take_dirsync(self.ino):
            # os_unix.c fsyncs a new journal's or WAL's directory after the file's first
            # successful sync, and ignores a failure of that directory fsync ("many systems
            # are unable to fsync a directory"): so does the model. The entry then stays
            # pending; only the store's own directory fsync can make it durable.
            directory = Path(self.filename).parent
            try:
                self.vfs.fail("sync", str(directory))
            except apsw.Error:
                return
            disk.dir_synced(directory)


# --- the artifact-store seam --------------------------------------------------------------

class CrashFileOps(FileOps):
    """``FileOps`` that report to a ``SimulatedDisk``: ``ArtifactStore(root, file_ops=...)``.

    Each operation is checked, done and recorded under the disk's lock: a power loss on
    another thread (a pack sealed or created behind the puts) falls before or after it,
    never between the real change and its record."""

    background = False  # a store's background work runs in line: one order every run

    def __init__(self, disk: SimulatedDisk) -> None:
        self.disk = disk
        self._fds: dict[int, list] = {}  # fd -> [inode, offset, path]
        # The power losses before this process (these operations) began: after another
        # one, it is dead for good, even once a crash image is written and captured (a
        # thread of the store that "crashed" must not write into the next one's disk).
        self._born = disk.power_losses

    def _fail(self, op: Operation, path: Path | str, offset: int = 0, length: int = 0) -> None:
        if self.disk.power_losses != self._born:
            raise OSError(errno.EIO, f"simulated power loss: {op}", str(path))
        outcome = self.disk.check(op, path, offset, length)
        if outcome == "dead":
            raise OSError(errno.EIO, f"simulated power loss: {op}", str(path))
        if outcome == "io":
            raise OSError(errno.EIO, f"injected I/O error: {op}", str(path))
        if outcome == "full":
            raise OSError(errno.ENOSPC, f"injected disk full: {op}", str(path))

    def open_temp(self, directory: Path) -> tuple[int, Path]:
        with self.disk._lock:
            self._fail("meta", directory)
            fd, path = super().open_temp(directory)
            self._fds[fd] = [self.disk.created(path, 0o600), 0, path]
            return fd, path

    def write(self, fd: int, data: bytes | memoryview) -> None:
        with self.disk._lock:
            ino, offset, path = self._fds[fd]
            self._fail("write", path, offset, len(data))
            super().write(fd, data)
            self.disk.wrote(ino, offset, bytes(data))
            self._fds[fd][1] = offset + len(data)

    def writev(self, fd: int, buffers, size: int | None = None) -> None:
        self.write(fd, b"".join(bytes(b) for b in buffers))  # one write, as the model sees it

    def start_writeback(self, fd: int, offset: int, length: int) -> None:
        """Counted and logged, and changes nothing durable: the model makes bytes durable
        at an fsync only (a real disk may keep more of an unsynced tail, which recovery
        handles too). Its outcome is ignored, as the real hint's result is."""
        with self.disk._lock:
            if self.disk.power_losses == self._born:
                self.disk.check("writeback", self._fds[fd][2], offset, length)

    def fsync(self, fd: int) -> None:
        with self.disk._lock:
            ino, _, path = self._fds[fd]
            try:
                self._fail("sync", path)
            except OSError:
                self.disk.sync_failed(ino)
                raise
            self.disk.synced(ino, path)  # the model decides what is durable: no real fsync

    def create_exclusive(self, path: Path, mode: int) -> int:
        with self.disk._lock:
            self._fail("meta", path)
            fd = super().create_exclusive(path, mode)
            self._fds[fd] = [self.disk.created(Path(path), mode), 0, Path(path)]
            return fd

    def open_read(self, path: Path) -> int:
        with self.disk._lock:
            fd = super().open_read(path)
            self._fds[fd] = [self.disk.opened(Path(path)), 0, Path(path)]
            return fd

    def make_writable(self, path: Path) -> None:
        with self.disk._lock:
            self._fail("meta", path)
            super().make_writable(path)
            self.disk.chmod(Path(path), 0o644)

    def open_existing(self, path: Path) -> int:
        with self.disk._lock:
            fd = super().open_existing(path)
            self._fds[fd] = [self.disk.opened(Path(path)), 0, Path(path)]
            return fd

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        with self.disk._lock:
            ino, _, path = self._fds[fd]
            self._fail("write", path, offset, len(data))
            super().pwrite(fd, data, offset)
            self.disk.wrote(ino, offset, bytes(data))

    def close(self, fd: int) -> None:
        self._fds.pop(fd, None)
        super().close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        with self.disk._lock:
            self._fail("meta", dst)
            super().rename(src, dst)
            self.disk.renamed(src, dst)
            for entry in self._fds.values():  # a file still open (a pack) has its new name
                if entry[2] == Path(src):
                    entry[2] = Path(dst)

    def fsync_dir(self, path: Path) -> None:
        with self.disk._lock:
            self._fail("sync", path)
            self.disk.dir_synced(path)

    def makedirs(self, path: Path) -> list[Path]:
        with self.disk._lock:
            if not os.path.isdir(path):
                self._fail("meta", path)
            return super().makedirs(path)

    def chmod_readonly(self, path: Path) -> None:
        with self.disk._lock:
            super().chmod_readonly(path)
            self.disk.chmod(path, 0o444)

    def unlink(self, path: Path) -> None:
        with self.disk._lock:
            self._fail("meta", path)
            super().unlink(path)
            self.disk.deleted(path)


# --- a store on the simulated disk -------------------------------------------------------

def open_store(store_path: Path, vfs: CrashVFS, disk: SimulatedDisk, sync: str = "full",
               pack_bytes: int | None = None, **options: Any) -> Store:
    """Open a store whose database and artifacts both live on the simulated disk
    (``options``: more of ``Store.open``'s, ``busy_timeout_ms`` say)."""
    store = Store.open(store_path, vfs=vfs.name, sync=sync,  # type: ignore[arg-type]
                       file_ops=CrashFileOps(disk), **options)
    if pack_bytes is not None and hasattr(store.artifacts, "pack_bytes"):
        store.artifacts.pack_bytes = pack_bytes
    return store
