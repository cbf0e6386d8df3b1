"""The content-addressed artifact store: payload bytes on disk, named by their BLAKE3 digest.

This module owns everything under the artifact root::

    <root>/<namespace>/<digest[0:2]>/<digest>     one read-only file per payload
    <root>/LAYOUT                                 "evidence-artifacts 2": the layout above
    <root>/.tmp/put-<pid>-<random>.tmp            a put in progress

Layout 2 has one fan-out level (256 directories per namespace: a few thousand files per
directory at ten million artifacts, which ext4 and XFS index). Stores made before layouts
were recorded have no ``LAYOUT`` file and two levels, ``<digest[0:2]>/<digest[2:4]>/``
(layout 1); they are read and written in that layout, never converted. A new (empty) root
gets the current layout, recorded durably before the first put. A ``LAYOUT`` this program
does not know is refused: the store comes from a newer program.

Database rows never hold payload bytes; messages carry an ``ArtifactRef`` (namespace,
digest, size). What makes such a reference safe is the durability invariant:

    A put returns only after the payload file and its directory entry are durable (file
    fsynced before the rename, destination directory fsynced after it, every directory on
    the way fsynced in its parent). A row may reference an artifact only after its put
    returned.

So after any crash every referenced artifact is on disk with the right bytes. What a crash
can leave behind is harmless: temp files (removed by ``clean_stale_temp``) and complete
artifacts that no row references (orphans, found with ``iter_refs``).

Every path is built from a validated namespace and a validated digest, so no input can name
a file outside the root. OSError is translated into ``ArtifactError`` at one boundary,
``artifactbase._os_errors``, with the original kept as ``__cause__``; every file operation
of a put goes through ``fileops.FileOps`` (the fault tests replace it). POSIX only
(directory fsync, ``kill(pid, 0)``).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import blake3

from .._errors import (
    ArtifactCorruptError,
    ArtifactError,
    PayloadTooLargeError,
)
from .._model.refs import DIGEST_RE, NAMESPACE_RE, ArtifactRef, validate_digest, validate_namespace
from .artifactbase import (
    _READ_ONLY,
    CHUNK_SIZE,
    DEFAULT_MAX_PAYLOAD,
    _chunks,
    _os_errors,
    _subdirs,
    check_one_by_one,
    exists_by_check,
    usage_of,
)
from .backend import Removal
from .fileops import _TEMP_PREFIX, _TEMP_SUFFIX, FileOps

__all__ = ["ArtifactStore", "SingleRemoval"]

# A temp file whose writer may still be alive (another live pid) is removed only after this
# long without a write. Writes refresh mtime, so only a writer stalled this long loses it, and
# then its put fails cleanly at the rename (it never produces a wrong artifact).
TEMP_GRACE_SECONDS = 3600.0

_FANOUT_RE = re.compile(r"[0-9a-f]{2}")
_TEMP_DIR = ".tmp"  # cannot collide with a namespace: "." is not allowed in one
_LAYOUT_FILE = "LAYOUT"  # nor can this: no upper case in a namespace
_LAYOUTS = {"evidence-artifacts 2\n": 2}
LAYOUT = 2  # what a new store gets
_TEMP_PID_RE = re.compile(r"put-([1-9][0-9]{0,9})-.*\.tmp", re.DOTALL)

# Temp files open in this process, by (st_dev, st_ino) so that two stores opened on the same
# root through different spellings (symlinks) still agree. A sweep may run on another thread
# (another store's constructor); the lock makes "create + register" atomic against
# "check + unlink", so a sweep can never remove a temp file between its creation and its
# registration.
_LIVE_TEMPS: set[tuple[int, int]] = set()
_LIVE_LOCK = threading.Lock()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # EPERM: alive, someone else's; anything else: unsure
        return True
    return True


class ArtifactStore:
    """Content-addressed payload files under ``root``; safe to share between threads."""

    local = True  # files on this machine's file system

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        file_ops: FileOps | None = None,
        create: bool = True,
        read_only: bool = False,
        layout: int | None = None,
    ) -> None:
        if type(max_payload) is not int or max_payload < 0:
            raise ValueError(f"max_payload must be a non-negative int, not {max_payload!r}")
        self.root = Path(root).absolute()
        self._root_text = str(self.root)
        self.max_payload = max_payload
        self._ops = file_ops if file_ops is not None else FileOps()
        self._tmp = self.root / _TEMP_DIR
        # Directories whose entry in their parent this instance has made durable (or created).
        self._durable_dirs: set[Path] = set()
        # Directories _ensure_dir has completed for: each exists with its whole chain durable.
        # Nothing in a live store removes them, so a put skips the walk (~8% of a crawl
        # worker's CPU); one removed from outside fails the put with a clear ENOENT.
        self._ready_dirs: set[Path] = set()
        # Read-only (a store on read-only media, or someone else's): nothing under the root
        # is created, written, swept or removed, and put refuses.
        self.read_only = read_only
        if create and not read_only:
            self._ensure_dir(self._tmp)
        elif not self.root.is_dir():
            raise ArtifactError(
                f"artifact store {self.root} does not exist",
                hint="check the path, or open with create=True",
                path=self.root,
            )
        # ``layout`` is given only for the payload files of a store being converted to
        # packs (its LAYOUT already says packs): they are read, and removed once packed.
        self.layout = layout if layout is not None else self._open_layout()
        if not read_only:
            self.clean_stale_temp()

    def _open_layout(self) -> int:
        """The root's layout: recorded, legacy (1), or the current one recorded now."""
        path = self.root / _LAYOUT_FILE
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                text = f.read(64)
        except FileNotFoundError:
            if _subdirs(self.root, NAMESPACE_RE):
                return 1  # artifacts from before layouts were recorded
            if self.read_only:
                return LAYOUT  # empty: nothing to read in any layout
            try:
                self._write_layout(path)
            except ArtifactError as exc:
                if getattr(exc.__cause__, "errno", None) not in _READ_ONLY:
                    raise
                # Read-only and empty: nothing to read in any layout, nothing can be put.
            return LAYOUT
        except PermissionError as exc:
            if self.read_only:  # someone else's store, made when LAYOUT was 0600
                return self._infer_layout()
            raise ArtifactError(f"cannot read the artifact store layout at {path}: {exc}",
                                hint="check the permissions of the store", path=path) from exc
        except OSError as exc:
            raise ArtifactError(f"cannot read the artifact store layout at {path}: {exc}",
                                hint="check the permissions of the store", path=path) from exc
        layout = _LAYOUTS.get(text)
        if layout is None:
            raise ArtifactError(
                f"artifact store {self.root} has layout {text.strip()[:40]!r}, which this "
                "version of evidence does not know",
                hint="the store was written by a newer version of evidence: use that version",
                path=path,
            )
        return layout

    def _infer_layout(self) -> int:
        """The layout read off the tree, for a reader who may not read ``LAYOUT``: a
        fan-out directory holding fan-out directories is layout 1."""
        for namespace in _subdirs(self.root, NAMESPACE_RE):
            for prefix in _subdirs(self.root / namespace, _FANOUT_RE):
                return 1 if _subdirs(self.root / namespace / prefix, _FANOUT_RE) else LAYOUT
        return LAYOUT

    def _write_layout(self, path: Path) -> None:
        """Record the current layout durably: temp file, fsync, rename, fsync the root."""
        self._ensure_dir(self._tmp)
        with _os_errors("create temp file in", self._tmp):
            fd, tmp = self._ops.open_temp(self._tmp)
        try:
            with _os_errors("write temp file", tmp):
                self._ops.write(fd, f"evidence-artifacts {LAYOUT}\n".encode("ascii"))
            with _os_errors("make read-only", tmp):  # the store's mode policy: it never changes
                self._ops.chmod_readonly(tmp)
            with _os_errors("fsync temp file", tmp):
                self._ops.fsync(fd)
        finally:
            with contextlib.suppress(OSError):
                self._ops.close(fd)
        # Concurrent openers of a new root all write the same bytes: whichever rename wins.
        try:
            with _os_errors("move temp file into place at", path):
                self._ops.rename(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                self._ops.unlink(tmp)
            raise
        with _os_errors("fsync directory", self.root):
            self._ops.fsync_dir(self.root)

    def __repr__(self) -> str:
        return f"ArtifactStore({str(self.root)!r}, max_payload={self.max_payload})"

    # -- paths ---------------------------------------------------------------------------

    def path_for(self, ref_or_namespace: ArtifactRef | str, digest: str | None = None) -> Path:
        """The file for a ref (or namespace + digest). Both are validated, so it is under root."""
        if isinstance(ref_or_namespace, ArtifactRef):
            if digest is not None:
                raise TypeError("path_for(ref) takes no digest")
            namespace, digest = ref_or_namespace.namespace, ref_or_namespace.digest
        else:
            namespace = ref_or_namespace
        return Path(self._file(namespace, digest))  # type: ignore[arg-type]

    def _file(self, namespace: str, digest: str) -> str:
        """``path_for`` as text: one format instead of four Path joins (a writer checks every
        artifact a message references, and a put names two paths)."""
        validate_namespace(namespace)
        validate_digest(digest)
        if self.layout == 1:
            return f"{self._root_text}/{namespace}/{digest[:2]}/{digest[2:4]}/{digest}"
        return f"{self._root_text}/{namespace}/{digest[:2]}/{digest}"

    def _ensure_dir(self, target: Path) -> None:
        """Create ``target`` if needed and make every directory entry on the way durable.

        A directory that already existed is fsynced in its parent too, once per instance: it
        may have been created a moment ago by a concurrent put that has not fsynced it yet,
        and our put must not return before that entry is durable.
        """
        if target in self._ready_dirs:
            return
        parent = target.parent
        if parent in self._ready_dirs:  # the common case: a fan-out leaf, new or not ours yet
            with _os_errors("create directory", target):
                self._ops.makedirs(target)
            with _os_errors("fsync directory", parent):
                self._ops.fsync_dir(parent)
            self._durable_dirs.add(target)
            self._ready_dirs.add(target)
            return
        with _os_errors("create directory", target):
            created = self._ops.makedirs(target)
        levels = [self.root, *(self.root / p for p in _prefixes(target.relative_to(self.root)))]
        for directory in [*(d for d in created if d not in levels), *levels]:
            if directory in self._durable_dirs and directory not in created:
                continue
            if directory == self.root and directory not in created:
                self._durable_dirs.add(directory)  # not ours to vouch for
                continue
            with _os_errors("fsync directory", directory.parent):
                self._ops.fsync_dir(directory.parent)
            self._durable_dirs.add(directory)
        self._ready_dirs.add(target)

    # -- writing -------------------------------------------------------------------------

    def put(self, namespace: str, data: bytes | Iterable[bytes] | BinaryIO) -> ArtifactRef:
        """Store ``data`` (streamed, hashed as it is written); return its ref once durable."""
        validate_namespace(namespace)
        if self.read_only:
            raise ArtifactError(f"artifact store {self.root} was opened read-only",
                                hint="open the store for writing to store payloads",
                                path=self.root)
        chunks = _chunks(data)
        nbytes = memoryview(data).nbytes if isinstance(data, bytes | bytearray | memoryview) else 0
        if nbytes > self.max_payload:
            raise self._too_large(namespace, nbytes)  # refuse before touching the disk
        self._ensure_dir(self._tmp)
        with _LIVE_LOCK:
            with _os_errors("create temp file in", self._tmp):
                fd, tmp = self._ops.open_temp(self._tmp)
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            _LIVE_TEMPS.add(key)
        fd_open = True
        try:
            hasher, size = blake3.blake3(), 0
            for chunk in chunks:
                size += len(chunk)
                if size > self.max_payload:  # stop at the first byte over, not at the end
                    raise self._too_large(namespace, size)
                hasher.update(chunk)
                with _os_errors("write temp file", tmp):
                    self._ops.write(fd, chunk)
            # Read-only before the fsync, so the mode is as durable as the bytes and the file
            # is never visible writable in the store.
            with _os_errors("make read-only", tmp):
                self._ops.chmod_readonly(tmp)
            with _os_errors("fsync temp file", tmp):
                self._ops.fsync(fd)
            fd_open = False  # never retry a close: the fd is released even if close fails
            with _os_errors("close temp file", tmp):
                self._ops.close(fd)
            ref = ArtifactRef(namespace, hasher.hexdigest(), size)
            dest = self.path_for(ref)
            self._ensure_dir(dest.parent)
            existing = _lstat(dest)
            if existing is not None and stat.S_ISREG(existing.st_mode) and existing.st_size == size:
                # Same digest and size: the same content is already here. Keep that file (its
                # inode may be open by readers); the fsync below still runs, because the put
                # that wrote it may not have made its entry durable yet.
                with contextlib.suppress(OSError):
                    self._ops.unlink(tmp)
                writable = bool(existing.st_mode & 0o222)
                # Touch it: orphan reclaim keeps files younger than its grace period, and a
                # put that is about to be referenced again must count as young.
                with contextlib.suppress(OSError):
                    os.utime(dest)
            else:
                # Absent, or wrong size (damaged): our fsynced copy atomically takes its place.
                with _os_errors(
                    "move temp file into place at",
                    dest,
                    enoent_hint="a stale-temp sweep in another process removed it; retry",
                ):
                    self._ops.rename(tmp, dest)
                writable = False  # made read-only before its fsync
            with _os_errors("fsync directory", dest.parent):
                self._ops.fsync_dir(dest.parent)
            if writable:
                with _os_errors("make read-only", dest):
                    self._ops.chmod_readonly(dest)
            return ref
        except BaseException:
            if fd_open:
                with contextlib.suppress(OSError):
                    self._ops.close(fd)
            with contextlib.suppress(OSError):  # already renamed: ENOENT, nothing to undo
                self._ops.unlink(tmp)
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE_TEMPS.discard(key)

    def put_file(self, namespace: str, path: str | os.PathLike[str]) -> ArtifactRef:
        """Store the contents of the file at ``path``."""
        with _os_errors("open source file", Path(path)):
            source = open(path, "rb")  # noqa: SIM115 - closed below, outside the translation
        with source:
            return self.put(namespace, source)

    def _too_large(self, namespace: str, size: int) -> PayloadTooLargeError:
        return PayloadTooLargeError(
            f"payload for namespace {namespace!r} exceeds the limit of {self.max_payload} bytes"
            f" ({size} bytes seen so far)",
            hint="raise max_payload, or store a truncated body and record that it was truncated",
            namespace=namespace,
            size=size,
            limit=self.max_payload,
        )

    # -- reading -------------------------------------------------------------------------

    def check_each(self, refs: Sequence[ArtifactRef]) -> list[ArtifactError | None]:
        return check_one_by_one(self.check, refs)

    def check(self, ref: ArtifactRef) -> None:
        """Raise ArtifactMissingError, or ArtifactCorruptError if the file has the wrong size."""
        try:
            st = os.stat(self._file(ref.namespace, ref.digest))
        except OSError as exc:
            raise _os_errors("stat artifact", self.path_for(ref), ref=ref)._translate(exc) \
                from exc
        if not stat.S_ISREG(st.st_mode) or st.st_size != ref.size:
            self._check_stat(st, ref, self.path_for(ref))

    def batch(self) -> contextlib.AbstractContextManager[None]:
        """Each put is written by itself here: a block that only runs its body."""
        return contextlib.nullcontext()

    def sync(self, refs: Iterable[ArtifactRef]) -> None:
        """Make the listed payloads durable: nothing is left to do here, since a put in
        this store is durable when it returns (``backend.ArtifactBackend``)."""

    def close(self) -> None:
        """Nothing to release: every put is complete when it returns."""

    def plan_removal(self, refs: Iterable[ArtifactRef]) -> list[Removal]:
        """One removal per payload file (reclaim commits each under the write lock)."""
        return [SingleRemoval(self, ref) for ref in refs]

    def location(self, ref: ArtifactRef) -> str:
        """The payload's file, for findings and errors."""
        return self._file(ref.namespace, ref.digest)

    def age(self, ref: ArtifactRef) -> float | None:
        """Seconds since the payload's file was last written or put again (a put of the
        same content touches it); None if it is gone or not a regular file."""
        st = _lstat(Path(self._file(ref.namespace, ref.digest)))
        if st is None or not stat.S_ISREG(st.st_mode):
            return None
        return max(0.0, time.time() - st.st_mtime)

    def is_writable(self, ref: ArtifactRef) -> bool:
        """Whether the file has a write bit (every put makes its file read-only)."""
        try:
            return bool(os.stat(self._file(ref.namespace, ref.digest)).st_mode & 0o222)
        except OSError:
            return False

    def writable_each(self, refs: Sequence[ArtifactRef]) -> list[bool]:
        """``is_writable`` of each: a file per payload, so a stat per payload."""
        return [self.is_writable(ref) for ref in refs]

    def remove(self, ref: ArtifactRef) -> int | None:
        """Delete the payload's file (reclaim, under the store's write lock); the bytes
        freed, or None if it was gone or not a regular file. Directories stay: removing one
        could race a put that has just created it."""
        path = Path(self._file(ref.namespace, ref.digest))
        st = _lstat(path)
        if st is None or not stat.S_ISREG(st.st_mode):
            return None
        try:
            os.unlink(path)  # not a put's: the fault model's FileOps are the put's
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ArtifactError(f"could not delete orphan {path}: {exc.strerror}", path=path,
                                hint="check permissions on the artifact directory") from exc
        return st.st_size

    def exists(self, ref: ArtifactRef) -> bool:
        """True if the artifact is present with the right size (bytes are not re-hashed)."""
        return exists_by_check(self.check, ref)

    def open(self, ref: ArtifactRef, *, verify: bool = False) -> BinaryIO:
        """Open the artifact for reading; with ``verify``, re-hash it first (then rewind)."""
        path = self.path_for(ref)
        with _os_errors("open artifact", path, ref=ref):
            handle = open(path, "rb")  # noqa: SIM115 - returned to the caller
        try:
            with _os_errors("read artifact", path, ref=ref):
                self._check_stat(os.fstat(handle.fileno()), ref, path)
                if verify:
                    hasher, buffer = blake3.blake3(), bytearray(CHUNK_SIZE)
                    while n := handle.readinto(buffer):
                        hasher.update(memoryview(buffer)[:n])
                    self._check_digest(hasher.hexdigest(), ref, path)
                    handle.seek(0)
        except BaseException:
            handle.close()
            raise
        return handle

    def read(self, ref: ArtifactRef, *, verify: bool = False) -> bytes:
        """The artifact's bytes; with ``verify``, checked against the digest."""
        path = self.path_for(ref)
        with self.open(ref) as handle, _os_errors("read artifact", path, ref=ref):
            data = handle.read()
        if len(data) != ref.size:
            raise self._corrupt_size(ref, path, len(data))
        if verify:
            self._check_digest(blake3.blake3(data).hexdigest(), ref, path)
        return data

    def verify(self, ref: ArtifactRef) -> None:
        """Stream the artifact and re-hash it; raise ArtifactMissingError / ArtifactCorruptError."""
        with self.open(ref, verify=True):
            pass

    def _check_stat(self, st: os.stat_result, ref: ArtifactRef, path: Path) -> None:
        if not stat.S_ISREG(st.st_mode):
            raise ArtifactCorruptError(
                f"artifact {path} is not a regular file",
                hint="remove whatever is at that path and restore the payload",
                path=path,
                namespace=ref.namespace,
                digest=ref.digest,
            )
        if st.st_size != ref.size:
            raise self._corrupt_size(ref, path, st.st_size)

    @staticmethod
    def _corrupt_size(ref: ArtifactRef, path: Path, actual: int) -> ArtifactCorruptError:
        return ArtifactCorruptError(
            f"artifact {path} is {actual} bytes, its reference says {ref.size}",
            hint="the file was truncated or replaced; restore it from backup or re-fetch",
            path=path,
            namespace=ref.namespace,
            digest=ref.digest,
            expected_size=ref.size,
            actual_size=actual,
        )

    @staticmethod
    def _check_digest(actual: str, ref: ArtifactRef, path: Path) -> None:
        if actual != ref.digest:
            raise ArtifactCorruptError(
                f"artifact {path} is corrupt: expected blake3 {ref.digest}, got {actual}",
                hint="do not trust this payload; restore it from backup or re-fetch",
                path=path,
                namespace=ref.namespace,
                digest=ref.digest,
                actual_digest=actual,
            )

    # -- walking and housekeeping ----------------------------------------------------------

    def iter_refs(self) -> Iterator[ArtifactRef]:
        """Every artifact on disk, sorted by (namespace, digest); ``.tmp`` and strays skipped."""
        for namespace in _subdirs(self.root, NAMESPACE_RE):
            for prefix, leaf in self._leaves(self.root / namespace):
                with _os_errors("list directory", leaf), os.scandir(leaf) as entries:
                    files = sorted(
                        (e.name, e.stat(follow_symlinks=False).st_size)
                        for e in entries
                        if DIGEST_RE.fullmatch(e.name)
                        and e.name.startswith(prefix)
                        and e.is_file(follow_symlinks=False)
                    )
                for digest, size in files:
                    yield ArtifactRef(namespace, digest, size)

    def _leaves(self, directory: Path) -> Iterator[tuple[str, Path]]:
        """(digest prefix, directory) of every fan-out leaf under a namespace, sorted."""
        for a in _subdirs(directory, _FANOUT_RE):
            if self.layout == 1:
                for b in _subdirs(directory / a, _FANOUT_RE):
                    yield a + b, directory / a / b
            else:
                yield a, directory / a

    def usage(self) -> tuple[int, int]:
        """(number of artifacts, total bytes), by walking the store."""
        return usage_of(self.iter_refs())

    def clean_stale_temp(self, older_than: float = TEMP_GRACE_SECONDS) -> int:
        """Remove temp files left by dead puts; return how many were removed.

        Only regular files in ``.tmp`` named ``put-*.tmp`` are considered, and never one open
        by a put in this process. Of the rest, a file is removed if its writer is provably
        gone - the pid in its name is not alive, or is our own pid (a previous process that
        had our pid; common in containers) - or if it has not been written to for
        ``older_than`` seconds. ``older_than=0`` removes every temp file not open in this
        process: only for when no other process writes to this store. Assumes writers share
        a pid namespace. Files that cannot be removed are skipped, not raised.
        """
        with _os_errors("list directory", self._tmp):
            try:
                with os.scandir(self._tmp) as scan:
                    entries = [e for e in scan if e.name.startswith(_TEMP_PREFIX)]
            except FileNotFoundError:
                return 0
        now, me, removed = time.time(), os.getpid(), 0
        for entry in entries:
            if not entry.name.endswith(_TEMP_SUFFIX):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            match = _TEMP_PID_RE.fullmatch(entry.name)
            pid = int(match.group(1)) if match else None
            with _LIVE_LOCK:
                if (st.st_dev, st.st_ino) in _LIVE_TEMPS:
                    continue
                gone = pid is not None and (pid == me or not _pid_alive(pid))
                if not gone and now - st.st_mtime < older_than:
                    continue
                try:
                    self._ops.unlink(Path(entry.path))
                except OSError:
                    continue
            removed += 1
        return removed


class SingleRemoval(Removal):
    """One payload removed alone (a file, an object): nothing to prepare, nothing to undo."""

    def __init__(self, store: ArtifactStore | Any, ref: ArtifactRef) -> None:
        self.store, self.refs = store, [ref]

    def commit(self) -> int:
        return self.store.remove(self.refs[0]) or 0

    def abort(self) -> None:
        pass


def _prefixes(relative: Path) -> Iterator[Path]:
    parts = relative.parts
    return (Path(*parts[: i + 1]) for i in range(len(parts)))


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
