"""Artifact packs: payloads appended to segment files, found by digest, synced in groups.

This module owns ``<root>/PACKS/`` (the segment format is ``_store/packfile.py``)::

    <root>/LAYOUT                    "evidence-artifacts 3": packs
    <root>/PACKS/<id>.pack           a segment: records appended, then sealed (read-only)
    <root>/PACKS/<id>.new            a segment being created (renamed once its header is
                                     written and its creator holds its lock)
    <root>/PACKS/SYNC-FAILED         names of packs whose fsync failed (resync reads it)

Each process that puts has one *active* pack: it created it, holds an exclusive ``flock``
on it while it lives, and is the only one ever to append to it. A put hashes the payload
(BLAKE3), returns at once if the digest is already indexed (dedup), and otherwise appends
one record (header and payload in one write) without an fsync. ``sync(refs)`` fsyncs each
pack holding a listed payload once, however many payloads it holds and however many
threads ask at the same time (group commit); the writer calls it with every payload a
batch references for the first time, before that batch's COMMIT, so "durable before
referenced" holds exactly as it did with one fsynced file per payload. Every
``WRITEBACK_BYTES`` appended, the kernel is asked to start writing them out (a hint:
the group's fsync then waits for less). A pack reaching ``pack_bytes`` is sealed (its
index and trailer appended, fsynced) on a thread of its own while the puts go on in the
next pack, created ahead on another thread once the active one is half full; a ``sync``
of a payload in a pack being sealed waits for the seal, and ``close`` waits for every
seal, then seals the active pack too.

The digest index does not grow in memory with the payloads (``_store/packdigests.py``):
a sealed pack is looked up in its own index on disk (a fence, block CRCs and a filter in
memory: about 3.7 bytes a payload), the records of unsealed packs are indexed in memory
by scanning them (other processes' active packs are *tailed*: a lookup that misses scans
what they appended since), 62 bytes a payload until their pack is sealed; the active
pack's own list of its records, for its seal, is dropped once it is sealed.

Invariants:
  - a payload is durable once ``sync`` returned for it (or its pack was sealed);
  - after a crash, a pack whose appender is gone is recovered by the next writable open:
    each record is re-hashed, the scan stops at the first one that is not whole (the torn
    or unsynced tail), and the pack is sealed with an index of what came before. Nothing a
    committed row references can be in that tail: it was synced before its COMMIT, and an
    fsync covers every byte written before it. Bytes are never truncated or rewritten:
    sealing only appends;
  - an fsync of a pack that fails (EIO: Linux then marks the unwritten pages clean, so a
    retried fsync succeeds without writing them) poisons that pack in this process: its
    records past the last successful fsync leave the index, nothing is appended to it
    again, it is never sealed by this process, and its name goes to ``SYNC-FAILED``, so a
    later put of the same bytes is appended again and a later ``sync`` of a payload that
    was only there raises that failure (never "missing", which would have the writer
    reject a message naming it: the batch fails and is redelivered instead). The writer
    stops and marks the store; the resync at the next open rewrites those packs in place
    before anything is trusted again;
  - reclaim compacts: a sealed pack holding orphans is rewritten without them into a new
    sealed pack, and the old one is removed only under the database's write lock, after
    reclaim's re-check (``_audit/verify.py``), and only once the new one is durable.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from .._errors import (
    ArtifactError,
)
from .._model.refs import NAMESPACE_RE
from .artifactbase import DEFAULT_MAX_PAYLOAD, _os_errors, _subdirs
from .artifacts import _LAYOUT_FILE, ArtifactStore
from .fileops import FileOps
from .packappend import WRITEBACK_BYTES
from .packdigests import DigestIndex
from .packindex import _FAILED_LIST, _LAYOUT_TEXT, PACKS_DIR, _Pack
from .packreclaim import PackReclaim
from .packrecovery import packs_sync_failed, resync_packs

# WRITEBACK_BYTES, PACKS_DIR and the resync are their modules', named here too (what the
# store, the conversion and tools/bench_packs.py import from the pack store).
__all__ = ["DEFAULT_PACK_BYTES", "PACKS_DIR", "WRITEBACK_BYTES", "Layout", "PackStore",
           "open_artifact_store", "packs_sync_failed", "resync_packs", "store_layout"]

log = logging.getLogger("evidence.store")

DEFAULT_PACK_BYTES = 64 * 1024 * 1024


class PackStore(PackReclaim):
    """Content-addressed payloads in append-only pack segments; safe to share between
    threads, and between processes (each appends to its own pack)."""

    local = True  # files on this machine's file system

    def __init__(self, root: str | os.PathLike[str], *, max_payload: int = DEFAULT_MAX_PAYLOAD,
                 file_ops: FileOps | None = None, create: bool = True, read_only: bool = False,
                 pack_bytes: int = DEFAULT_PACK_BYTES, clock: Callable[[], float] = time.time,
                 store_marker: Path | None = None) -> None:
        if type(max_payload) is not int or max_payload < 0:
            raise ValueError(f"max_payload must be a non-negative int, not {max_payload!r}")
        if type(pack_bytes) is not int or pack_bytes < 4096:
            raise ValueError(f"pack_bytes must be an int of at least 4096, not {pack_bytes!r}")
        self.root = Path(root).absolute()
        self.packs_dir = self.root / PACKS_DIR
        self.max_payload = max_payload
        self.pack_bytes = pack_bytes
        self.read_only = read_only
        self.clock = clock  # what "now" is for put times and ages (tests move it)
        self._ops = file_ops if file_ops is not None else FileOps()
        self._store_marker = store_marker  # the store's sync-failed marker, if any
        self._lock = threading.RLock()  # the index and the pack table
        self._append = threading.Lock()  # the active pack
        self._index = DigestIndex()  # the unsealed packs' entries (the sealed: on disk)
        self._sealed = ()
        self._touched: dict[tuple[str, bytes], int] = {}
        self._packs: dict[int, _Pack] = {}
        self._by_name: dict[str, _Pack] = {}
        self._numbers = iter(range(1, 1 << 62))
        self._active: _Pack | None = None
        # Rotation off the putting thread: the next pack is created ahead (``_spare``, once
        # the active one is half full) and a full pack is sealed on a thread of its own.
        self._spare: _Pack | None = None
        self._spare_for = 0  # the active pack a spare was last asked for (one try each)
        self._behind_lock = threading.Lock()  # _spare and _threads
        self._threads: list[threading.Thread] = []
        # Payloads a failed fsync took out of the index: asked for, they raise that
        # failure (redeliverable), never "missing"; a later put of the same bytes that is
        # appended again takes them out of here.
        self._lost: dict[tuple[str, bytes], _Pack] = {}
        self._closed = False
        self._namespaces: set[str] = set()  # validated already
        self._local = threading.local()  # ``held``: the calling thread's batch, if any
        if create and not read_only:
            self._make_root()
        elif not self.root.is_dir():
            raise ArtifactError(f"artifact store {self.root} does not exist",
                                hint="check the path, or open with create=True",
                                path=self.root)
        self._check_layout()
        self.legacy = self._open_legacy()
        self.refresh(recover=not read_only)

    # --- opening ----------------------------------------------------------------------

    def _make_root(self) -> None:
        created = self._ops.makedirs(self.packs_dir)
        for directory in created:
            with _os_errors("fsync directory", directory.parent):
                self._ops.fsync_dir(directory.parent)
        layout = self.root / _LAYOUT_FILE
        if not layout.exists():
            _write_small_file(self._ops, self.root, _LAYOUT_FILE, _LAYOUT_TEXT.encode())

    def _check_layout(self) -> None:
        path = self.root / _LAYOUT_FILE
        try:
            text = path.read_text(encoding="ascii", errors="replace")[:64]
        except FileNotFoundError:
            if self.read_only and not _subdirs(self.root, NAMESPACE_RE):
                return  # empty, read-only: nothing to read in any layout
            raise ArtifactError(f"artifact store {self.root} has no LAYOUT: not a pack store",
                                hint="open it with evidence.ArtifactStore", path=path) from None
        except OSError as exc:
            raise ArtifactError(f"cannot read the artifact store layout at {path}: {exc}",
                                hint="check the permissions of the store", path=path) from exc
        if text != _LAYOUT_TEXT:
            raise ArtifactError(
                f"artifact store {self.root} has layout {text.strip()[:40]!r}, not packs",
                hint="open it with evidence.ArtifactStore, or convert it with "
                "'evidence convert STORE'", path=path)

    def _open_legacy(self) -> ArtifactStore | None:
        """Payload files left by a conversion to packs that has not finished: read them."""
        if not _subdirs(self.root, NAMESPACE_RE):
            return None
        layout = _infer_file_layout(self.root)
        return ArtifactStore(self.root, create=False, read_only=True, layout=layout)

    # --- closing ----------------------------------------------------------------------

    def close(self) -> None:
        """Seal this process's active pack (unless an fsync failed: then the resync at the
        next open deals with it) and release its lock."""
        if self._closed:
            return
        with contextlib.suppress(ArtifactError):  # said by the batch's end, as it would be
            self._write_own_held()
        self._closed = True
        with self._append:
            self._wait_behind()  # the seals of full packs, a spare being created
            with self._behind_lock:
                spare, self._spare = self._spare, None
            if spare is not None:
                self._discard_empty(spare)
            pack = self._active
            marked = self._marked()
            if pack is not None and not pack.broken and not pack.failed and not marked:
                if pack.entries:
                    try:
                        self._seal(pack)
                    except ArtifactError as exc:
                        log.error("could not seal %s at close: %s", pack.path, exc,
                                  extra={"event": "pack.seal_failed"})
                else:
                    self._discard_empty(pack)
            self._active = None
        with self._lock:
            for pack in self._packs.values():
                self._close_fds(pack)

    def _marked(self) -> bool:
        return ((self._store_marker is not None and self._store_marker.exists())
                or (self.packs_dir / _FAILED_LIST).exists())

    def __enter__(self) -> PackStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PackStore({str(self.root)!r}, max_payload={self.max_payload})"


# --- helpers ---------------------------------------------------------------------------------

def _write_small_file(ops: FileOps, directory: Path, name: str, data: bytes) -> None:
    """A read-only record written durably: temp file, fsync, rename, fsync the directory."""
    with _os_errors("create temp file in", directory):
        fd, tmp = ops.open_temp(directory)
    try:
        try:
            with _os_errors("write temp file", tmp):
                ops.write(fd, data)
            with _os_errors("make read-only", tmp):
                ops.chmod_readonly(tmp)
            with _os_errors("fsync temp file", tmp):
                ops.fsync(fd)
        finally:
            with contextlib.suppress(OSError):
                ops.close(fd)
        with _os_errors("move temp file into place at", directory / name):
            ops.rename(tmp, directory / name)
    except BaseException:
        with contextlib.suppress(OSError):
            ops.unlink(tmp)
        raise
    with _os_errors("fsync directory", directory):
        ops.fsync_dir(directory)


def _infer_file_layout(root: Path) -> int:
    for namespace in _subdirs(root, NAMESPACE_RE):
        for prefix in _subdirs(root / namespace, re.compile(r"[0-9a-f]{2}")):
            return 1 if _subdirs(root / namespace / prefix, re.compile(r"[0-9a-f]{2}")) else 2
    return 2


# --- choosing the implementation -------------------------------------------------------------

Layout = Literal["packs", "files"]


def store_layout(root: Path) -> Layout | None:
    """What an artifact root holds: packs, payload files (layouts 1 and 2), or None (new)."""
    try:
        text = (root / _LAYOUT_FILE).read_text(encoding="ascii", errors="replace")[:64]
    except FileNotFoundError:
        if root.is_dir() and _subdirs(root, NAMESPACE_RE):
            return "files"
        return None
    except PermissionError:
        return "packs" if (root / PACKS_DIR).is_dir() else "files"
    if text == _LAYOUT_TEXT:
        return "packs"
    return "files"  # layout 2, or one ArtifactStore refuses by name


def open_artifact_store(root: str | os.PathLike[str], *, create: bool = True,
                        read_only: bool = False, file_ops: FileOps | None = None,
                        max_payload: int | None = None, layout: Layout | None = None,
                        store_marker: Path | None = None) -> ArtifactStore | PackStore:
    """The artifact store at ``root``, in the layout it has: packs, or one file per payload
    (stores made before packs, read and written as they are, never converted silently).
    A new root gets ``layout`` (packs by default)."""
    path = Path(root)
    found = store_layout(path)
    kind = found or layout or "packs"
    kwargs: dict = {} if max_payload is None else {"max_payload": max_payload}
    if kind == "files":
        return ArtifactStore(path, create=create, read_only=read_only, file_ops=file_ops,
                             **kwargs)
    return PackStore(path, create=create, read_only=read_only, file_ops=file_ops,
                     store_marker=store_marker, **kwargs)
