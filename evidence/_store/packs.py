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

The digest index is held in memory: the sealed packs' indexes, read when the store opens,
and the records of unsealed packs, read by scanning them (other processes' active packs
are *tailed*: a lookup that misses scans what they appended since). About 200 bytes of
memory per payload: a million payloads take ~200 MB.

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
import errno
import fcntl
import io
import logging
import mmap
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, Literal

import blake3

from .._errors import (
    ArtifactCorruptError,
    ArtifactError,
    ArtifactMissingError,
    PayloadTooLargeError,
)
from .._model.refs import NAMESPACE_RE, ArtifactRef, validate_namespace
from . import packfile as pf
from .artifacts import (
    _LAYOUT_FILE,
    _READ_ONLY,
    CHUNK_SIZE,
    DEFAULT_MAX_PAYLOAD,
    ArtifactStore,
    FileOps,
    Removal,
    _chunks,
    _os_errors,
    _subdirs,
    check_one_by_one,
)
from .fsync import fsync_file

__all__ = ["DEFAULT_PACK_BYTES", "PACKS_DIR", "PackStore", "open_artifact_store",
           "packs_sync_failed", "resync_packs", "store_layout"]

log = logging.getLogger("evidence.store")

PACKS_DIR = "PACKS"  # upper case: never a namespace (``[a-z0-9_-]``), never a legacy dir
PACKS_LAYOUT = 3
_LAYOUT_TEXT = f"evidence-artifacts {PACKS_LAYOUT}\n"
_FILE_LAYOUTS = {"evidence-artifacts 2\n": 2}
DEFAULT_PACK_BYTES = 64 * 1024 * 1024
_FAILED_LIST = "SYNC-FAILED"
# A put of content already stored appends a touch record (so reclaim's grace period counts
# from the latest put) when the stored copy was last put longer ago than this.
TOUCH_AFTER_MS = 60_000
# The appender hands what it wrote to the kernel's writeback every this many bytes
# (``FileOps.start_writeback``): of 128 KiB, 256 KiB and 1 MiB, 1 MiB measured fastest in
# the put stream of tools/bench_packs.py (the hint costs ~0.1 ms a call).
WRITEBACK_BYTES = 1024 * 1024
_PAGE = mmap.PAGESIZE
# Puts inside ``PackStore.batch()`` are held and appended together, in one ``writev`` for up
# to this many bytes or records (two buffers a record: within Linux's IOV_MAX of 1024). One
# system call per record cost more than BLAKE3 of the payload in the put stream of
# tools/bench_packs.py (docs/benchmarks.md); a payload larger than this is written alone.
BATCH_BYTES = 1024 * 1024
BATCH_RECORDS = 256

# A record to append: (kind, namespace, digest, payload, payload length, time ms).
_Record = tuple[int, str, bytes, bytes | memoryview, int, int]

Location = tuple[int, int, int, int]  # (pack number, record offset, payload length, time ms)


def _now_ms(clock: Callable[[], float]) -> int:
    return int(clock() * 1000)


class _Pack:
    """One segment file, as this process knows it."""

    __slots__ = ("broken", "cond", "entries", "failed", "fd", "hinted", "name", "no", "own",
                 "path", "read_fd", "sealed", "size", "sync_fd", "synced", "syncing")

    def __init__(self, no: int, name: str, path: Path, *, own: bool) -> None:
        self.no, self.name, self.path, self.own = no, name, path, own
        self.sealed = False
        self.size = pf.FILE_HEADER_SIZE  # records known up to here (own: the append point)
        self.synced = 0  # bytes known durable
        self.hinted = 0  # own packs: bytes handed to the kernel's writeback so far
        self.fd: int | None = None  # own packs: the write descriptor (holds the flock)
        self.read_fd: int | None = None
        self.sync_fd: int | None = None  # another process's pack: fsynced through this
        self.entries: list[pf.Entry] = []  # own packs: what the seal will index
        self.broken = False  # own: a write failed part-way; nothing more is appended
        self.failed = False  # an fsync failed: nothing past ``synced`` is trusted
        self.syncing = False
        self.cond = threading.Condition()


class _Held:
    """The records a thread's ``batch()`` holds until it writes them."""

    __slots__ = ("error", "keys", "records", "size")

    def __init__(self) -> None:
        self.records: list[_Record] = []
        self.keys: set[tuple[str, bytes]] = set()  # held already: a put again holds nothing
        self.size = 0  # bytes held
        self.error: ArtifactError | None = None  # a write of this batch failed


class PackStore:
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
        self._index: dict[str, dict[bytes, Location]] = {}
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

    # --- the index ----------------------------------------------------------------------

    def refresh(self, *, recover: bool = False) -> None:
        """Learn what other processes appended or sealed, and forget packs removed by a
        compaction. With ``recover``, packs whose appender is gone are recovered and
        sealed (a writable open does this)."""
        with self._lock:
            try:
                names = sorted(os.listdir(self.packs_dir))
            except FileNotFoundError:
                names = []
            except OSError as exc:
                raise ArtifactError(f"cannot list {self.packs_dir}: {exc}",
                                    path=self.packs_dir) from exc
            present = set()
            for name in names:
                if name.endswith(".new") and recover:
                    self._remove_stale_new(name)
                if not name.endswith(".pack"):
                    continue
                stem = name[:-5]
                present.add(stem)
                pack = self._by_name.get(stem)
                if pack is None:
                    self._load(stem, recover=recover)
                elif not pack.sealed and not pack.own:
                    self._tail(pack)
            for stem in [s for s, p in self._by_name.items() if s not in present and not p.own]:
                self._forget(self._by_name[stem])

    def _load(self, stem: str, *, recover: bool) -> None:
        path = self.packs_dir / f"{stem}.pack"
        pack = _Pack(next(self._numbers), stem, path, own=False)
        try:
            pack.read_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            return  # removed by a compaction meanwhile
        except OSError as exc:
            raise ArtifactError(f"cannot open {path}: {exc}", path=path) from exc
        read_at = _reader(pack.read_fd)
        size = os.fstat(pack.read_fd).st_size
        self._packs[pack.no] = pack
        self._by_name[stem] = pack
        sealed = pf.read_seal(read_at, size)
        if sealed is not None:
            pack.sealed, pack.size, pack.synced = True, size, size
            for entry in sealed:
                self._add(pack, entry)
            return
        if recover and self._recover(pack, size):
            return
        if not recover and _abandoned(pack.read_fd):
            # Nobody appends to it any more: read it as recovery would (each record
            # re-hashed, the torn tail left out), without sealing it.
            found = pf.scan(read_at, pf.FILE_HEADER_SIZE, size, verify=True)
            for entry in found.entries:
                self._add(pack, entry)
            pack.size, pack.sealed = found.valid_end, True  # never tailed again
            return
        self._tail(pack)

    def _tail(self, pack: _Pack) -> None:
        """Index the records another process appended to ``pack`` since the last look."""
        assert pack.read_fd is not None
        size = os.fstat(pack.read_fd).st_size
        if size <= pack.size:
            return
        read_at = _reader(pack.read_fd)
        if pack.size == pf.FILE_HEADER_SIZE and pf.parse_file_header(
                read_at(0, pf.FILE_HEADER_SIZE)) is None:
            return  # not a pack (yet): its header is not whole
        limit = pack.synced if pack.failed else size
        found = pf.scan(read_at, pack.size, limit)
        for entry in found.entries:
            self._add(pack, entry)
        pack.size = found.valid_end
        if not found.complete and not pack.failed:
            sealed = pf.read_seal(read_at, size)
            if sealed is not None:  # its appender sealed it: the index has everything
                pack.sealed, pack.size, pack.synced = True, size, size
                for entry in sealed:
                    self._add(pack, entry)

    def _add(self, pack: _Pack, entry: pf.Entry) -> None:
        key = entry.digest
        if entry.kind == pf.TOUCH:
            touched = (entry.namespace, key)
            self._touched[touched] = max(self._touched.get(touched, 0), entry.time)
            return
        if entry.kind != pf.PAYLOAD:
            return
        names = self._index.setdefault(entry.namespace, {})
        have = names.get(key)
        if have is None or have[0] not in self._packs:
            names[key] = (pack.no, entry.offset, entry.length, entry.time)
        elif entry.time > have[3]:
            names[key] = (*have[:3], entry.time)

    def _forget(self, pack: _Pack) -> None:
        """A pack that is gone (compacted by another process): drop what pointed into it."""
        self._packs.pop(pack.no, None)
        self._by_name.pop(pack.name, None)
        for names in self._index.values():
            for key in [k for k, v in names.items() if v[0] == pack.no]:
                del names[key]
        if not pack.own:
            self._close_fds(pack)

    def _get(self, namespace: str, digest: bytes) -> Location | None:
        names = self._index.get(namespace)
        return None if names is None else names.get(digest)

    def _locate(self, ref: ArtifactRef) -> Location | None:
        """Where ``ref`` is, looking again (this thread's batch written, other processes'
        packs) if it is not known."""
        digest = _digest_bytes(ref)
        loc = self._get(ref.namespace, digest)
        if loc is None or loc[0] not in self._packs:
            with contextlib.suppress(ArtifactError):  # the batch raises it when it ends
                self._write_own_held()
            self.refresh()
            loc = self._get(ref.namespace, digest)
        return loc

    # --- writing ----------------------------------------------------------------------

    def put(self, namespace: str, data: bytes | Iterable[bytes] | BinaryIO) -> ArtifactRef:
        """Store ``data``; return its ref. Durable once ``sync`` returned for the ref."""
        if namespace not in self._namespaces:  # checked once per name: a put is hot
            validate_namespace(namespace)
            self._namespaces.add(namespace)
        if self.read_only or self._closed:
            raise ArtifactError(f"artifact store {self.root} was opened read-only" if
                                self.read_only else f"artifact store {self.root} is closed",
                                hint="open the store for writing to store payloads",
                                path=self.root)
        if type(data) is bytes or isinstance(data, bytearray | memoryview):
            payload = data if type(data) is bytes else memoryview(data).cast("B")
            size = len(payload)
            if size > self.max_payload:
                raise self._too_large(namespace, size)
            digest = blake3.blake3(payload).digest()
            names = self._index.get(namespace)
            loc = None if names is None else names.get(digest)
            if loc is None or not self._known(namespace, digest, size, loc):
                held = getattr(self._local, "held", None)
                if held is not None and size <= BATCH_BYTES:
                    self._hold(held, namespace, digest, payload, size)
                else:
                    with self._append:
                        names = self._index.get(namespace)
                        if names is None or digest not in names:  # else another thread
                            self._write_record(pf.PAYLOAD, namespace, digest, payload,
                                               size, int(self.clock() * 1000))
            return ArtifactRef(namespace, digest.hex(), size)
        return self._put_stream(namespace, _chunks(data))

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Puts of this thread inside the block are appended together: held (bytes by
        reference, other buffers copied), then written in one ``writev`` per MiB (or 256
        records) and when the block ends. Their refs can be read and synced once the
        block has ended; this thread's ``sync`` or read of one inside it writes what is
        held first. If any of those writes fails, the block raises that error (however it
        ends) and its refs are not to be referenced: some may be stored, as orphans. A
        block that raises drops what it still holds. Nested blocks are one block. Other
        processes (a writer syncing what a worker process put) see nothing held: end the
        block before handing its refs on."""
        if getattr(self._local, "held", None) is not None:
            yield  # inside another block of this thread: that one writes
            return
        held = self._local.held = _Held()
        try:
            yield
            if held.records:
                self._write_held(held)
        finally:
            self._local.held = None
        if held.error is not None:
            raise held.error

    def _hold(self, held: _Held, namespace: str, digest: bytes,
              payload: bytes | memoryview, size: int) -> None:
        key = (namespace, digest)
        if key in held.keys:
            return
        if type(payload) is not bytes:
            payload = bytes(payload)  # the caller may change its buffer once put returns
        held.keys.add(key)
        held.records.append((pf.PAYLOAD, namespace, digest, payload, size, _now_ms(self.clock)))
        held.size += pf.RECORD_SIZE + size
        if held.size >= BATCH_BYTES or len(held.records) >= BATCH_RECORDS:
            self._write_held(held)

    def _write_held(self, held: _Held) -> None:
        """Append what ``held`` holds; on failure remember the error for the block's end."""
        records, held.records, held.size = held.records, [], 0
        held.keys.clear()  # indexed once written
        if self._closed:
            held.error = held.error or ArtifactError(
                f"artifact store {self.root} was closed inside a batch of puts",
                hint="end the batch before closing the store", path=self.root)
            raise held.error
        with self._append:
            try:
                self._append_records(records)
            except ArtifactError as exc:
                held.error = held.error or exc
                raise

    def _write_own_held(self) -> None:
        """Write what this thread's batch holds (a sync or read of its refs comes)."""
        held = getattr(self._local, "held", None)
        if held is not None and held.records:
            self._write_held(held)

    def import_payload(self, namespace: str, data: bytes, *, put_time: float) -> ArtifactRef:
        """Append ``data`` with ``put_time`` (seconds since the epoch) as when it was put:
        a payload file being converted keeps its age (``_store/convert.py``)."""
        validate_namespace(namespace)
        view = memoryview(data).cast("B")
        digest = blake3.blake3(view).digest()
        when = int(put_time * 1000)
        with self._append:
            if self._get(namespace, digest) is None:
                self._write_record(pf.PAYLOAD, namespace, digest, view, view.nbytes, when)
        return ArtifactRef(namespace, digest.hex(), view.nbytes)

    def holds(self, ref: ArtifactRef) -> bool:
        """Whether a pack holds ``ref`` (as far as this process knows; no file is read)."""
        loc = self._get(ref.namespace, _digest_bytes(ref))
        return loc is not None and loc[2] == ref.size

    def verify_packed(self, ref: ArtifactRef) -> None:
        """Re-hash ``ref`` in its pack, which must be sealed (a payload file of a
        conversion does not count): raise ``ArtifactMissingError`` or
        ``ArtifactCorruptError`` otherwise."""
        loc = self._locate(ref)
        if loc is None or not self._packs[loc[0]].sealed:
            raise self._missing(ref)
        self.verify(ref)

    def _known(self, namespace: str, digest: bytes, size: int, loc: Location) -> bool:
        """Whether the content at ``loc`` (the index's entry for it) is stored already (a
        put again touches it, if it is old)."""
        if loc[2] != size or loc[0] not in self._packs:
            return False
        now = _now_ms(self.clock)
        last = max(loc[3], self._touched.get((namespace, digest), 0))
        if now - last > TOUCH_AFTER_MS:
            with self._append:
                self._write_record(pf.TOUCH, namespace, digest, b"", 0, now)
            with self._lock:
                key = (namespace, digest)
                self._touched[key] = max(self._touched.get(key, 0), now)
        return True

    def _write_record(self, kind: int, namespace: str, digest: bytes,
                      payload: memoryview | bytes, length: int, when: int) -> None:
        """Append one whole record; the caller holds ``_append``."""
        self._append_records(((kind, namespace, digest, payload, length, when),))

    def _append_records(self, records: Sequence[_Record]) -> None:
        """Append whole records to the active pack, as many in one write as fit in it
        (``writev`` of each header and payload: the payloads are not copied); a pack
        that would grow past ``pack_bytes`` is rotated first (a record larger than that
        gets a pack of its own). The caller holds ``_append``."""
        first, count = 0, len(records)
        while first < count:
            pack = self._active
            need = pf.RECORD_SIZE + records[first][4]
            if pack is None or pack.broken or pack.failed or (
                    pack.size + need > self.pack_bytes and pack.size > pf.FILE_HEADER_SIZE):
                pack = self._writable(need)
            fd = pack.fd
            assert fd is not None
            offset = end = pack.size
            buffers: list[bytes | memoryview] = []
            placed: list[pf.Entry] = []
            last = first
            while last < count:
                kind, namespace, digest, payload, length, when = records[last]
                if last > first and end + pf.RECORD_SIZE + length > self.pack_bytes:
                    break  # the rest go to the next pack
                buffers.append(pf.encode_record(kind, namespace, digest, length, when))
                buffers.append(payload)
                placed.append(pf.Entry(kind, namespace, digest, end, length, when))
                end += pf.RECORD_SIZE + length
                last += 1
            try:
                self._ops.writev(fd, buffers, end - offset)
            except OSError as exc:
                pack.broken = True  # a part of a record may be there: start a new pack
                raise _os_errors("append to pack", pack.path)._translate(exc) from exc
            except BaseException:
                pack.broken = True
                raise
            with self._lock:
                pack.entries.extend(placed)
                pack.size = end
                for entry in placed:
                    self._add(pack, entry)
                    if self._lost and entry.kind == pf.PAYLOAD:  # stored again: trusted
                        self._lost.pop((entry.namespace, entry.digest), None)
            if end - pack.hinted >= WRITEBACK_BYTES:
                self._start_writeback(pack, end)
            if end > self.pack_bytes >> 1 and self._spare_for != pack.no:
                self._prepare_spare(pack)
            first = last

    def _start_writeback(self, pack: _Pack, end: int) -> None:
        """Let the disk start on what was appended since the last hint (``FileOps
        .start_writeback``): the next ``sync`` of this pack then waits for less. (On a
        thread of its own, measured no faster: the call releases the GIL but has to
        take it first.)"""
        assert pack.fd is not None
        end -= end % _PAGE  # not the page still being appended to: a write into a page
        # under writeback may have to wait for it (stable pages)
        with contextlib.suppress(OSError):  # a hint: the fsync is what reports errors
            self._ops.start_writeback(pack.fd, pack.hinted, end - pack.hinted)
        pack.hinted = end

    def _put_stream(self, namespace: str, chunks: Iterator[memoryview]) -> ArtifactRef:
        """A payload of unknown size: its header is written last, in place (``pwrite``)."""
        with self._append:
            pack = self._writable(pf.RECORD_SIZE)
            assert pack.fd is not None
            start = pack.size
            hasher, size = blake3.blake3(), 0
            try:
                with _os_errors("append to pack", pack.path):
                    self._ops.write(pack.fd, bytes(pf.RECORD_SIZE))  # not a record yet
                    for chunk in chunks:
                        size += len(chunk)
                        if size > self.max_payload:
                            self._void(pack, start, size - len(chunk))
                            raise self._too_large(namespace, size)
                        hasher.update(chunk)
                        self._ops.write(pack.fd, chunk)
                    digest, now = hasher.digest(), _now_ms(self.clock)
                    self._ops.pwrite(pack.fd, pf.encode_record(
                        pf.PAYLOAD, namespace, digest, size, now), start)
            except PayloadTooLargeError:
                raise
            except BaseException:
                pack.broken = True
                raise
            entry = pf.Entry(pf.PAYLOAD, namespace, digest, start, size, now)
            with self._lock:
                pack.entries.append(entry)  # a second copy of known bytes stays a record
                pack.size = entry.end
                self._add(pack, entry)
        return ArtifactRef(namespace, digest.hex(), size)

    def _void(self, pack: _Pack, start: int, written: int) -> None:
        """A streamed put refused half-way: its bytes become a record to skip."""
        assert pack.fd is not None
        try:
            self._ops.pwrite(pack.fd, pf.encode_record(pf.VOID, "", bytes(32), written, 0),
                             start)
        except OSError:
            pack.broken = True
            return
        pack.size = start + pf.RECORD_SIZE + written

    def put_file(self, namespace: str, path: str | os.PathLike[str]) -> ArtifactRef:
        """Store the contents of the file at ``path``."""
        with _os_errors("open source file", Path(path)):
            source = open(path, "rb")  # noqa: SIM115 - closed below
        with source:
            return self.put(namespace, source)

    def _writable(self, need: int) -> _Pack:
        """The active pack, sealed and replaced first when ``need`` bytes would take it
        past ``pack_bytes`` (a record larger than that gets a pack of its own)."""
        pack = self._active
        if pack is not None and (pack.broken or pack.failed):
            self._retire(pack)
            pack = None
        if pack is not None and pack.size > pf.FILE_HEADER_SIZE and \
                pack.size + need > self.pack_bytes:
            self._retire(pack)
            self._behind(self._seal_quietly, pack)
            pack = None
        if pack is None:
            with self._behind_lock:
                pack, self._spare = self._spare, None
            if pack is None:
                pack = self._create()
            self._active = pack
        return pack

    # --- rotation, off the putting thread -------------------------------------------------

    def _behind(self, work: Callable[..., None], *args: object) -> None:
        """Run ``work`` on a thread of its own; ``close`` waits for it. (In line where the
        file operations ask for it: ``FileOps.background``.)"""
        if not self._ops.background:
            work(*args)
            return
        thread = threading.Thread(target=work, args=args, name="evidence-packs")
        with self._behind_lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _wait_behind(self) -> None:
        with self._behind_lock:
            threads, self._threads = self._threads, []
        for thread in threads:
            thread.join()

    def _seal_quietly(self, pack: _Pack) -> None:
        """Seal a full pack behind the puts. Its guarantees are a seal's wherever it runs
        (records fsynced before the index that lists them; ``sync`` of its payloads waits
        for it); a failed fsync poisons the pack as any does, and the writer's next
        ``sync`` or check of a payload in it raises that failure."""
        try:
            self._seal(pack)
        except ArtifactError as exc:
            log.error("could not seal %s: %s", pack.path, exc, extra={"event": "pack.seal_failed"})
        except Exception:  # a thread's error would otherwise go to stderr only
            log.exception("could not seal %s", pack.path, extra={"event": "pack.seal_failed"})

    def _prepare_spare(self, active: _Pack) -> None:
        """Create the pack that follows ``active`` ahead of time (its header's fsync and
        its directory's fsync off the put that rotates); once per active pack."""
        self._spare_for = active.no
        if self._spare is None and not self._closed:
            self._behind(self._make_spare)

    def _make_spare(self) -> None:
        try:
            spare = self._create()
        except ArtifactError as exc:  # the rotating put creates one itself, and says why
            log.warning("could not create the next pack ahead: %s", exc,
                        extra={"event": "pack.prepare_failed"})
            return
        with self._behind_lock:
            kept = self._spare is None and not self._closed
            if kept:
                self._spare = spare
        if not kept:
            self._discard_empty(spare)

    def _create(self) -> _Pack:
        """A new pack of this process: header written, locked, then named ``.pack`` (so a
        recovering opener never takes a pack being created for an abandoned one)."""
        now = _now_ms(self.clock)
        pack_id = now.to_bytes(6, "big") + secrets.token_bytes(10)
        stem = pack_id.hex()
        new = self.packs_dir / f"{stem}.new"
        final = self.packs_dir / f"{stem}.pack"
        with _os_errors("create pack", new):
            fd = self._ops.create_exclusive(new, 0o444)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with _os_errors("write pack header", new):
                self._ops.write(fd, pf.encode_file_header(pack_id, now))
            # Its header durable before its name: a pack found after a crash always has
            # one (one fsync per pack, not per payload).
            with _os_errors("fsync pack", new):
                self._ops.fsync(fd)
            with _os_errors("name pack", final):
                self._ops.rename(new, final)
            with _os_errors("fsync directory", self.packs_dir):
                self._ops.fsync_dir(self.packs_dir)
        except BaseException:
            with contextlib.suppress(OSError):
                self._ops.close(fd)
            for path in (new, final):
                with contextlib.suppress(OSError):
                    self._ops.unlink(path)
            raise
        pack = _Pack(next(self._numbers), stem, final, own=True)
        pack.fd = fd
        with self._lock:
            self._packs[pack.no] = pack
            self._by_name[stem] = pack
        return pack

    def _retire(self, pack: _Pack) -> None:
        """No more appends to ``pack`` (sealed, broken or failed); its lock is kept until
        close, so no recovering opener seals a pack whose sync may still be asked for."""
        if self._active is pack:
            self._active = None

    def _seal(self, pack: _Pack) -> None:
        """Append the index and trailer and fsync: the pack never changes again."""
        assert pack.fd is not None
        with pack.cond:
            while pack.syncing:
                pack.cond.wait()
            if pack.failed or pack.sealed:
                return
            pack.syncing = True
        sealed = 0
        try:
            end = os.fstat(pack.fd).st_size  # past a record a failed write left part of
            # The records durable before the index that lists them: written back in any
            # order, the index could reach the disk without a record it names, and the
            # reopened store would deduplicate a put against bytes that are not there.
            if pack.synced < end:
                self._fsync_own(pack)
                with pack.cond:  # a sync waiting for these records need not wait for the
                    pack.synced = end  # index too (the writer's next COMMIT, in a crawl)
                    pack.cond.notify_all()
            seal = pf.encode_seal(pack.entries, end)
            with _os_errors("seal pack", pack.path):
                self._ops.pwrite(pack.fd, seal, end)
            self._fsync_own(pack)
            sealed = end + len(seal)
        finally:
            with pack.cond:  # sealed as the seal ends: a waiting _seal never seals twice
                pack.syncing = False
                if sealed:
                    pack.sealed = True
                    pack.synced = pack.size = sealed
                pack.cond.notify_all()

    def _fsync_own(self, pack: _Pack) -> None:
        """fsync a pack this process appends to; a failure poisons it (see ``_poison``)."""
        assert pack.fd is not None
        try:
            self._ops.fsync(pack.fd)
        except OSError as exc:
            self._poison(pack)
            raise self._sync_failed(pack, exc) from exc

    # --- durability -----------------------------------------------------------------------

    def sync(self, refs: Iterable[ArtifactRef]) -> None:
        """Make every listed payload durable: one fsync per pack that holds an unsynced one
        (threads asking for the same pack at once share one fsync)."""
        wanted: dict[int, int] = {}
        for ref in refs:
            loc = self._locate(ref)
            if loc is None:
                if self.legacy is not None and self.legacy.exists(ref):
                    continue  # a payload file: durable when its put returned
                raise self._missing(ref)
            end = loc[1] + pf.RECORD_SIZE + loc[2]
            pack = self._packs.get(loc[0])
            if pack is not None and end > pack.synced:
                wanted[loc[0]] = max(wanted.get(loc[0], 0), end)
        for number, end in wanted.items():
            pack = self._packs.get(number)
            if pack is None:
                raise ArtifactMissingError(f"a pack of {self.root} went away during a sync",
                                           hint="retry: it was compacted", path=self.root)
            self._sync_pack(pack, end)

    def _sync_pack(self, pack: _Pack, end: int) -> None:
        with pack.cond:
            while True:
                if pack.synced >= end:
                    return
                if pack.failed:
                    raise self._sync_failed(pack, None)
                if not pack.syncing:
                    break
                pack.cond.wait()
            pack.syncing = True
            target = pack.size  # every record appended so far: written before this fsync
        try:
            fd = pack.fd if pack.own else self._sync_fd(pack)
            assert fd is not None
            self._ops.fsync(fd)
        except OSError as exc:
            with pack.cond:
                pack.syncing = False
                self._poison(pack)
                pack.cond.notify_all()
            raise self._sync_failed(pack, exc) from exc
        except BaseException:
            with pack.cond:
                pack.syncing = False
                pack.cond.notify_all()
            raise
        with pack.cond:
            pack.syncing = False
            pack.synced = max(pack.synced, target)
            pack.cond.notify_all()
        if pack.synced < end:
            self._sync_pack(pack, end)

    def _sync_fd(self, pack: _Pack) -> int:
        if pack.sync_fd is None:
            with _os_errors("open pack", pack.path):
                pack.sync_fd = self._ops.open_read(pack.path)
        return pack.sync_fd

    def _poison(self, pack: _Pack) -> None:
        """An fsync of ``pack`` failed: trust nothing in it past its last good fsync."""
        pack.failed = True
        self._retire(pack)
        with self._lock:
            for namespace, names in self._index.items():
                for key in [k for k, (no, offset, length, _) in names.items()
                            if no == pack.no and offset + pf.RECORD_SIZE + length > pack.synced]:
                    del names[key]
                    self._lost[(namespace, key)] = pack
        try:
            _append_line(self.packs_dir / _FAILED_LIST, pack.name)
        except OSError as exc:
            log.error("cannot record that pack %s failed an fsync: %s", pack.path, exc,
                      extra={"event": "pack.fsync_record_failed"})

    def _sync_failed(self, pack: _Pack, exc: OSError | None) -> ArtifactError:
        why = f": {exc.strerror or exc}" if exc is not None else " earlier"
        return ArtifactError(
            f"an fsync of artifact pack {pack.path} failed{why}; its payloads not synced "
            "before are not trusted again until the store is resynced",
            hint="check the disk (dmesg); once it works, open the store again (opening it "
            "for writing resyncs it) and redeliver what was not acknowledged",
            path=pack.path, sync_failed=True, errno=getattr(exc, "errno", None))

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

    def _close_fds(self, pack: _Pack) -> None:
        for fd in (pack.fd, pack.sync_fd):  # opened through the file operations
            if fd is not None:
                with contextlib.suppress(OSError):
                    self._ops.close(fd)
        if pack.read_fd is not None:
            with contextlib.suppress(OSError):
                os.close(pack.read_fd)
        pack.fd = pack.read_fd = pack.sync_fd = None

    def _marked(self) -> bool:
        return ((self._store_marker is not None and self._store_marker.exists())
                or (self.packs_dir / _FAILED_LIST).exists())

    def _discard_empty(self, pack: _Pack) -> None:
        """A pack that got no record: nothing in it to keep (its lock held until it is
        unlinked: no recovering opener seals it meanwhile)."""
        with contextlib.suppress(OSError):
            self._ops.unlink(pack.path)
        self._close_fds(pack)
        with self._lock:
            self._packs.pop(pack.no, None)
            self._by_name.pop(pack.name, None)

    def __enter__(self) -> PackStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PackStore({str(self.root)!r}, max_payload={self.max_payload})"

    # --- recovery ---------------------------------------------------------------------

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
            for entry in found.entries:
                self._add(pack, entry)
            pack.sealed = True
            pack.size = pack.synced = size + len(seal)
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
        except BlockingIOError:
            return
        finally:
            os.close(fd)
        self._unlink_quietly(path)

    def _unlink_quietly(self, path: Path) -> None:
        with contextlib.suppress(OSError):
            self._ops.unlink(path)

    # --- reading ----------------------------------------------------------------------

    def check(self, ref: ArtifactRef) -> None:
        """Raise ArtifactMissingError, or ArtifactCorruptError if it is stored with another
        size. Looks at the pack file itself (a compaction elsewhere may have removed it)."""
        self._check(ref, {})

    def check_each(self, refs: Sequence[ArtifactRef]) -> list[ArtifactError | None]:
        """``check`` of each, each pack file looked at once (a batch's payloads share a
        few packs: one stat each, not one per payload)."""
        sizes: dict[int, int] = {}
        return check_one_by_one(lambda ref: self._check(ref, sizes), refs)

    def _check(self, ref: ArtifactRef, sizes: dict[int, int]) -> None:
        """``check``; ``sizes`` holds the size of each pack already looked at."""
        for _ in range(2):
            loc = self._locate(ref)
            if loc is None:
                if self.legacy is not None:
                    self.legacy.check(ref)
                    return
                raise self._missing(ref)
            pack = self._packs[loc[0]]
            size = sizes.get(loc[0])
            if size is None:
                try:
                    size = sizes[loc[0]] = os.stat(pack.path).st_size
                except FileNotFoundError:
                    with self._lock:
                        self._forget(pack)
                    continue
                except OSError as exc:
                    raise _os_errors("stat pack", pack.path, ref=ref)._translate(exc) from exc
            if loc[2] != ref.size:
                raise self._corrupt_size(ref, pack, loc, loc[2])
            if size < loc[1] + pf.RECORD_SIZE + loc[2]:
                raise ArtifactCorruptError(
                    f"artifact {ref.namespace}/{ref.digest} lies past the end of {pack.path} "
                    f"({size} bytes)", hint="the pack was truncated; restore it from "
                    "a backup", path=pack.path, namespace=ref.namespace, digest=ref.digest)
            return
        raise self._missing(ref)

    def exists(self, ref: ArtifactRef) -> bool:
        """True if the payload is stored with the right size (bytes are not re-hashed)."""
        try:
            self.check(ref)
        except (ArtifactMissingError, ArtifactCorruptError):
            return False
        return True

    def read(self, ref: ArtifactRef, *, verify: bool = False) -> bytes:
        """The payload's bytes; with ``verify``, its record header and BLAKE3 checked."""
        found = self._find_for_read(ref)
        if found is None:
            assert self.legacy is not None
            return self.legacy.read(ref, verify=verify)
        pack, loc, fd = found
        if loc[2] != ref.size:
            raise self._corrupt_size(ref, pack, loc, loc[2])
        with _os_errors("read pack", pack.path, ref=ref):
            data = _read_exact(fd, loc[1] + pf.RECORD_SIZE, loc[2])
            header = os.pread(fd, pf.RECORD_SIZE, loc[1]) if verify else b""
        if len(data) != ref.size:
            raise self._corrupt_size(ref, pack, loc, len(data))
        if verify:
            self._check_header(ref, pack, loc, header)
            self._check_digest(blake3.blake3(data).hexdigest(), ref, pack, loc)
        return data

    def open(self, ref: ArtifactRef, *, verify: bool = False) -> BinaryIO:
        """A reader of the payload's bytes; with ``verify``, re-hashed first."""
        if ref.size <= 8 * CHUNK_SIZE:
            return io.BytesIO(self.read(ref, verify=verify))
        found = self._find_for_read(ref)
        if found is None:
            assert self.legacy is not None
            return self.legacy.open(ref, verify=verify)
        pack, loc, fd = found
        if loc[2] != ref.size:
            raise self._corrupt_size(ref, pack, loc, loc[2])
        if verify:
            self.verify(ref)
        return io.BufferedReader(_Slice(os.dup(fd), loc[1] + pf.RECORD_SIZE, loc[2]),
                                 buffer_size=CHUNK_SIZE)

    def verify(self, ref: ArtifactRef) -> None:
        """Re-hash the payload (streamed) and check its record header."""
        found = self._find_for_read(ref)
        if found is None:
            assert self.legacy is not None
            self.legacy.verify(ref)
            return
        pack, loc, fd = found
        if loc[2] != ref.size:
            raise self._corrupt_size(ref, pack, loc, loc[2])
        with _os_errors("read pack", pack.path, ref=ref):
            header = os.pread(fd, pf.RECORD_SIZE, loc[1])
            self._check_header(ref, pack, loc, header)
            hasher, pos, left = blake3.blake3(), loc[1] + pf.RECORD_SIZE, loc[2]
            while left:
                chunk = os.pread(fd, min(left, CHUNK_SIZE), pos)
                if not chunk:
                    raise self._corrupt_size(ref, pack, loc, loc[2] - left)
                hasher.update(chunk)
                pos, left = pos + len(chunk), left - len(chunk)
        self._check_digest(hasher.hexdigest(), ref, pack, loc)

    def _read_fd(self, pack: _Pack) -> int:
        if pack.read_fd is None:
            with _os_errors("open pack", pack.path):
                pack.read_fd = os.open(pack.path, os.O_RDONLY | os.O_CLOEXEC)
        return pack.read_fd

    def _find_for_read(self, ref: ArtifactRef) -> tuple[_Pack, Location, int] | None:
        """(pack, location, read descriptor), or None for a payload file of a conversion
        in progress; ArtifactMissingError if it is nowhere."""
        for _ in range(2):
            loc = self._locate(ref)
            if loc is None:
                if self.legacy is not None:
                    return None
                raise self._missing(ref)
            pack = self._packs.get(loc[0])
            if pack is None:
                continue
            if pack.read_fd is None:
                try:
                    pack.read_fd = os.open(pack.path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    with self._lock:
                        self._forget(pack)
                    continue
                except OSError as exc:
                    raise _os_errors("open pack", pack.path, ref=ref)._translate(exc) from exc
            return pack, loc, pack.read_fd
        raise self._missing(ref)

    def iter_refs(self) -> Iterator[ArtifactRef]:
        """Every payload stored, once, sorted by (namespace, digest)."""
        self.refresh()
        with self._lock:
            refs = {ArtifactRef(ns, digest.hex(), loc[2])
                    for ns, names in self._index.items() for digest, loc in names.items()}
        if self.legacy is not None:
            refs.update(self.legacy.iter_refs())
        yield from sorted(refs, key=lambda r: (r.namespace, r.digest))

    def usage(self) -> tuple[int, int]:
        """(number of payloads, their total bytes)."""
        count = total = 0
        for ref in self.iter_refs():
            count, total = count + 1, total + ref.size
        return count, total

    def age(self, ref: ArtifactRef) -> float | None:
        """Seconds since the payload was last put (its record's time, or a later touch);
        None if it is not stored."""
        loc = self._locate(ref)
        if loc is None:
            return self.legacy.age(ref) if self.legacy is not None else None
        last = max(loc[3], self._touched.get((ref.namespace, _digest_bytes(ref)), 0))
        return max(0.0, self.clock() - last / 1000)

    def is_writable(self, ref: ArtifactRef) -> bool:
        """Whether the payload's pack has a write bit (every pack is created read-only)."""
        loc = self._locate(ref)
        if loc is None:
            return self.legacy.is_writable(ref) if self.legacy is not None else False
        try:
            return bool(os.stat(self._packs[loc[0]].path).st_mode & 0o222)
        except (OSError, KeyError):
            return False

    def location(self, ref: ArtifactRef) -> str:
        """``<pack path>@<record offset>:<namespace>/<digest>``, for findings and errors."""
        loc = self._locate(ref)
        if loc is None:
            if self.legacy is not None and self.legacy.exists(ref):
                return self.legacy.location(ref)
            return f"{self.packs_dir} (in no pack):{ref.namespace}/{ref.digest}"
        return f"{self._packs[loc[0]].path}@{loc[1]}:{ref.namespace}/{ref.digest}"

    def record(self, ref: ArtifactRef) -> tuple[Path, int] | None:
        """(pack file, offset of the record's header) of a stored payload, or None; its
        payload starts ``packfile.RECORD_SIZE`` bytes later (docs/store.md)."""
        loc = self._locate(ref)
        return None if loc is None else (self._packs[loc[0]].path, loc[1])

    def packs(self) -> list[tuple[Path, bool, int]]:
        """(path, sealed, size) of each pack known, oldest first."""
        self.refresh()
        with self._lock:
            return [(p.path, p.sealed, p.size) for p in sorted(
                self._packs.values(), key=lambda p: p.name)]

    # --- errors ---------------------------------------------------------------------------

    def _missing(self, ref: ArtifactRef) -> ArtifactError:
        """ArtifactMissingError; for a payload a failed fsync took out of the index, that
        failure instead (the store failing, not the payload missing: a message naming it
        is redelivered, never rejected)."""
        if self._lost:
            pack = self._lost.get((ref.namespace, _digest_bytes(ref)))
            if pack is not None:
                return self._sync_failed(pack, None)
        return ArtifactMissingError(
            f"artifact {ref.namespace}/{ref.digest} is not in the store (no pack under "
            f"{self.packs_dir} holds it)",
            hint="it was never stored here or was deleted; restore it or re-fetch the page",
            path=self.packs_dir, namespace=ref.namespace, digest=ref.digest)

    def _too_large(self, namespace: str, size: int) -> PayloadTooLargeError:
        return PayloadTooLargeError(
            f"payload for namespace {namespace!r} exceeds the limit of {self.max_payload} bytes"
            f" ({size} bytes seen so far)",
            hint="raise max_payload, or store a truncated body and record that it was truncated",
            namespace=namespace, size=size, limit=self.max_payload)

    def _corrupt_size(self, ref: ArtifactRef, pack: _Pack, loc: Location,
                      actual: int) -> ArtifactCorruptError:
        return ArtifactCorruptError(
            f"artifact {ref.namespace}/{ref.digest} in {pack.path} at byte {loc[1]} is "
            f"{actual} bytes, its reference says {ref.size}",
            hint="the pack was damaged or the reference is wrong; restore it from backup",
            path=pack.path, namespace=ref.namespace, digest=ref.digest,
            expected_size=ref.size, actual_size=actual)

    def _check_header(self, ref: ArtifactRef, pack: _Pack, loc: Location,
                      header: bytes) -> None:
        entry = pf.parse_record(header, loc[1])
        if entry is None or entry.kind != pf.PAYLOAD or entry.namespace != ref.namespace \
                or entry.digest.hex() != ref.digest or entry.length != loc[2]:
            raise ArtifactCorruptError(
                f"artifact {ref.namespace}/{ref.digest}: the record header in {pack.path} at "
                f"byte {loc[1]} is damaged or names other content",
                hint="do not trust this payload; restore the pack from backup or re-fetch",
                path=pack.path, namespace=ref.namespace, digest=ref.digest)

    @staticmethod
    def _check_digest(actual: str, ref: ArtifactRef, pack: _Pack, loc: Location) -> None:
        if actual != ref.digest:
            raise ArtifactCorruptError(
                f"artifact {ref.namespace}/{ref.digest} in {pack.path} at byte {loc[1]} is "
                f"corrupt: expected blake3 {ref.digest}, got {actual}",
                hint="do not trust this payload; restore the pack from backup or re-fetch",
                path=pack.path, namespace=ref.namespace, digest=ref.digest,
                actual_digest=actual)

    # --- reclaim: compaction ----------------------------------------------------------------

    def remove(self, ref: ArtifactRef) -> int | None:
        """Remove one payload now (its pack is rewritten without it); the bytes freed, or
        None if it was not stored. Reclaim uses ``plan_removal`` instead, to re-check
        under the write lock before anything is removed."""
        if self._locate(ref) is None:
            if self.legacy is not None:
                return self._legacy_writer().remove(ref)
            return None
        freed = 0
        for removal in self.plan_removal([ref]):
            freed += removal.commit()
        return freed

    def plan_removal(self, refs: Iterable[ArtifactRef]) -> list[Removal]:
        """Removals of ``refs``, one per pack holding some: each pack is rewritten without
        them into a new sealed pack now, and swapped for it by ``commit``."""
        by_pack: dict[int, set[tuple[str, bytes]]] = {}
        legacy: list[ArtifactRef] = []
        for ref in refs:
            loc = self._locate(ref)
            if loc is None:
                if self.legacy is not None:
                    legacy.append(ref)
                continue
            by_pack.setdefault(loc[0], set()).add((ref.namespace, _digest_bytes(ref)))
        removals: list[Removal] = []
        for number, keys in by_pack.items():
            pack = self._packs.get(number)
            if pack is None:
                continue
            if not pack.sealed and not self._seal_for_removal(pack):
                continue  # another process appends to it: its orphans wait until sealed
            removals.append(_PackRemoval(self, pack, keys))
        if legacy:
            removals += self._legacy_writer().plan_removal(legacy)
        return removals

    def _legacy_writer(self) -> ArtifactStore:
        assert self.legacy is not None
        return ArtifactStore(self.root, create=False, layout=self.legacy.layout)

    def _seal_for_removal(self, pack: _Pack) -> bool:
        if pack.own:
            with self._append:
                if pack.failed:
                    return False
                self._seal(pack)
                self._retire(pack)
            return True
        with self._lock:
            if pack.read_fd is None:
                return False
            return self._recover(pack, os.fstat(pack.read_fd).st_size) and pack.sealed

    def _compact(self, pack: _Pack, dead: set[tuple[str, bytes]]
                 ) -> tuple[_Pack | None, list[tuple[pf.Entry, pf.Entry]]]:
        """Write ``pack``'s live records (every payload it holds for the index but
        ``dead``, and the touches of stored content) into a new sealed pack; (the new pack,
        or None if nothing lives; [(old entry, new entry)])."""
        fd = self._read_fd(pack)
        read_at = _reader(fd)
        entries = pf.read_seal(read_at, os.fstat(fd).st_size) or []
        live = []
        for entry in entries:
            key = (entry.namespace, entry.digest)
            loc = self._get(*key)
            if key in dead or loc is None:
                continue
            mine = entry.kind == pf.PAYLOAD and (loc[0], loc[1]) == (pack.no, entry.offset)
            if mine or (entry.kind == pf.TOUCH and loc[0] != pack.no):
                live.append(entry)
        if not live:
            return None, []
        live.sort(key=lambda e: e.offset)  # the order they were put in
        target = self._create()
        moved = []
        try:
            assert target.fd is not None
            for entry in live:
                record = read_at(entry.offset, pf.RECORD_SIZE + entry.length)
                if len(record) != pf.RECORD_SIZE + entry.length or (
                        entry.kind == pf.PAYLOAD
                        and blake3.blake3(record[pf.RECORD_SIZE:]).digest() != entry.digest):
                    raise ArtifactCorruptError(
                        f"{pack.path}: the record at byte {entry.offset} "
                        f"({entry.namespace}/{entry.digest.hex()}) does not match its digest; "
                        "the pack is not compacted", path=pack.path,
                        hint="run 'evidence verify --full' and restore the pack from backup")
                placed = pf.Entry(entry.kind, entry.namespace, entry.digest, target.size,
                                  entry.length, entry.time)
                with _os_errors("write pack", target.path):
                    self._ops.write(target.fd, record)
                target.entries.append(placed)
                target.size = placed.end
                moved.append((entry, placed))
            self._seal(target)
        except BaseException:
            self._drop_own(target)
            raise
        return target, moved

    def _drop_own(self, pack: _Pack) -> None:
        if pack.fd is not None:
            with contextlib.suppress(OSError):
                self._ops.close(pack.fd)
            pack.fd = None
        self._unlink_quietly(pack.path)
        with self._lock:
            self._packs.pop(pack.no, None)
            self._by_name.pop(pack.name, None)


class _PackRemoval(Removal):
    """One pack rewritten without some payloads: prepared at once, swapped by commit."""

    def __init__(self, store: PackStore, pack: _Pack, dead: set[tuple[str, bytes]]) -> None:
        self.store, self.pack, self.dead = store, pack, dead
        self.refs = []
        for ns, digest in sorted(dead):
            loc = store._get(ns, digest)
            if loc is not None:
                self.refs.append(ArtifactRef(ns, digest.hex(), loc[2]))
        self.target, self.moved = store._compact(pack, dead)

    def commit(self) -> int:
        store, pack = self.store, self.pack
        with _os_errors("remove compacted pack", pack.path):
            store._ops.unlink(pack.path)  # read-only, in a writable directory
        with _os_errors("fsync directory", store.packs_dir):
            store._ops.fsync_dir(store.packs_dir)
        with store._lock:
            for ns, digest in self.dead:
                names = store._index.get(ns, {})
                loc = names.get(digest)
                if loc is not None and loc[0] == pack.no:
                    del names[digest]
                store._touched.pop((ns, digest), None)
            if self.target is not None:
                for old, new in self.moved:
                    if old.kind != pf.PAYLOAD:
                        continue
                    names = store._index.setdefault(old.namespace, {})
                    loc = names.get(old.digest)
                    if loc is not None and loc[0] == pack.no:
                        names[old.digest] = (self.target.no, new.offset, new.length, loc[3])
            store._forget(pack)
        return sum(ref.size for ref in self.refs)  # the payloads' bytes, as a file store says

    def abort(self) -> None:
        if self.target is not None:
            self.store._drop_own(self.target)
            self.target = None


class _Slice(io.RawIOBase):
    """``length`` bytes of a file from ``start``, read with pread (its own descriptor)."""

    def __init__(self, fd: int, start: int, length: int) -> None:
        self._fd, self._start, self._length, self._pos = fd, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), self._length - self._pos)
        if want <= 0:
            return 0
        data = os.pread(self._fd, want, self._start + self._pos)
        buffer[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        super().close()


# --- helpers ---------------------------------------------------------------------------------

def _abandoned(fd: int) -> bool:
    """Whether no process holds the pack's lock (its appender is gone)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


def _reader(fd: int) -> Callable[[int, int], bytes]:
    return lambda offset, length: os.pread(fd, length, offset)


def _read_exact(fd: int, offset: int, length: int) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) == length or not data:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _digest_bytes(ref: ArtifactRef) -> bytes:
    return bytes.fromhex(ref.digest)


def _append_line(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, (line + "\n").encode("ascii"))
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        fsync_file(path)


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

