"""The pack store's digest index, and the reads through it: ``PackIndex``.

What ``PackStore`` (``_store/packs.py``) knows of ``<root>/PACKS/``: each pack as this
process knows it (``_Pack``), and the index from (namespace, digest) to where the record
is (``Location``). A sealed pack is looked up through its own index, on disk
(``SealedDigests``: a fence, block checksums and a filter in memory); unsealed packs are
indexed in memory (``DigestIndex``) by scanning their records, and another process's
active pack is *tailed* (a lookup that misses scans what it appended since). A lookup
asks both (``_get``): a key held by several packs is located in the lowest-numbered live
one, with the latest time any of them gives it. Reads find a payload here, re-check its record
header and size, and (``verify``) re-hash it; every error a read can raise is built here.

This is the lowest of the pack store's classes (``PackIndex`` < ``PackRecovery`` <
``PackAppend`` < ``PackReclaim`` < ``PackStore``, one module each): it declares the state
they share, which ``PackStore.__init__`` sets, and names the three methods it calls that
the classes above provide.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import io
import mmap
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import blake3

from .._errors import (
    ArtifactCorruptError,
    ArtifactError,
    ArtifactMissingError,
    PayloadTooLargeError,
)
from .._model.refs import ArtifactRef
from . import packfile as pf
from .artifactbase import CHUNK_SIZE, _os_errors, check_one_by_one, exists_by_check, usage_of
from .artifacts import ArtifactStore
from .fileops import FileOps
from .packdigests import DamagedIndex, DigestIndex, Location, SealedDigests, probe, sealed_key

__all__ = ["PACKS_DIR", "Location", "PackIndex"]

PACKS_DIR = "PACKS"  # upper case: never a namespace (``[a-z0-9_-]``), never a legacy dir
PACKS_LAYOUT = 3
_LAYOUT_TEXT = f"evidence-artifacts {PACKS_LAYOUT}\n"
_FILE_LAYOUTS = {"evidence-artifacts 2\n": 2}
_FAILED_LIST = "SYNC-FAILED"
_PAGE = mmap.PAGESIZE
# ``read_each`` looks so few refs up one by one; more, in one pass over every entry.
_FEW_REFS = 64


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


class PackIndex:
    """The index of a pack store, and reading through it (see the module's docstring)."""

    # The state every part of the store shares, set by ``PackStore.__init__``.
    root: Path
    packs_dir: Path
    max_payload: int
    pack_bytes: int
    read_only: bool
    clock: Callable[[], float]
    legacy: ArtifactStore | None
    _ops: FileOps
    _store_marker: Path | None
    _lock: threading.RLock
    _append: threading.Lock
    _index: DigestIndex  # the unsealed packs' entries
    _sealed: tuple[tuple[int, SealedDigests], ...]  # by pack number; replaced, never changed
    _touched: dict[tuple[str, bytes], int]
    _packs: dict[int, _Pack]
    _by_name: dict[str, _Pack]
    _numbers: Iterator[int]
    _active: _Pack | None
    _spare: _Pack | None
    _spare_for: int
    _behind_lock: threading.Lock
    _threads: list[threading.Thread]
    _lost: dict[tuple[str, bytes], _Pack]
    _closed: bool
    _namespaces: set[str]
    _local: threading.local

    # --- the index --------------------------------------------------------------------

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
        sealed = pf.read_seal_index(read_at, size)
        if sealed is not None:
            pack.sealed, pack.size, pack.synced = True, size, size
            self._seal_known(pack, *sealed)
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
            sealed = pf.read_seal_index(read_at, size)
            if sealed is not None:  # its appender sealed it: the index has everything
                pack.sealed, pack.size, pack.synced = True, size, size
                self._seal_known(pack, *sealed)

    def _add(self, pack: _Pack, entry: pf.Entry) -> None:
        key = entry.digest
        if entry.kind == pf.TOUCH:
            touched = (entry.namespace, key)
            self._touched[touched] = max(self._touched.get(touched, 0), entry.time)
            return
        if entry.kind != pf.PAYLOAD:
            return
        have = self._index.get(entry.namespace, key)
        if have is None:
            self._index.add(entry.namespace, key,
                            (pack.no, entry.offset, entry.length, entry.time))
        elif have[0] not in self._packs:
            self._index.set(entry.namespace, key,
                            (pack.no, entry.offset, entry.length, entry.time))
        elif entry.time > have[3]:
            self._index.set(entry.namespace, key, (*have[:3], entry.time))
            # Kept as a touch too: the entry of ``have`` leaves the memory index when its
            # pack is sealed, and its pack's own index does not know this later time.
            touched = (entry.namespace, key)
            self._touched[touched] = max(self._touched.get(touched, 0), entry.time)

    def _seal_known(self, pack: _Pack, index_offset: int, index: bytes) -> None:
        """``pack`` is sealed with this index (checked against its trailer): look its
        payloads up there from now on, and drop its entries from the memory index. Built
        before ``_lock`` is taken (tens of ms for a full pack: the puts go on meanwhile)."""
        digests = SealedDigests(index_offset, index)
        # Each entry's kind is its first byte: most packs hold no touch, and seeing so
        # costs one slice, where reading every entry for them cost an opening 0.01 s of CPU.
        touches = [] if pf.TOUCH not in index[::pf.ENTRY_SIZE] else list(digests.touches(
            lambda offset, length: index[offset - index_offset:offset - index_offset + length]))
        with self._lock:
            for namespace, digest, when in touches:
                key = (namespace, digest)
                self._touched[key] = max(self._touched.get(key, 0), when)
            others = [item for item in self._sealed if item[0] != pack.no]
            self._sealed = tuple(sorted((*others, (pack.no, digests)),
                                        key=lambda item: item[0]))
            for namespace, digest, _ in self._index.in_pack(pack.no):  # found on disk now
                self._index.pop(namespace, digest)

    def _forget(self, pack: _Pack) -> None:
        """A pack that is gone (compacted by another process): drop what pointed into it."""
        self._packs.pop(pack.no, None)
        self._by_name.pop(pack.name, None)
        if any(no == pack.no for no, _ in self._sealed):
            self._sealed = tuple(item for item in self._sealed if item[0] != pack.no)
        for namespace, digest, _ in self._index.in_pack(pack.no):
            self._index.pop(namespace, digest)
        if not pack.own:
            self._close_fds(pack)

    def _get(self, namespace: str, digest: bytes) -> Location | None:
        """Where the key is: the memory index's answer and each sealed pack's whose filter
        does not rule the digest out (most lookups of a new payload read nothing)."""
        loc = self._index.get(namespace, digest)
        sealed = self._sealed
        if not sealed:
            return loc
        word, mask = probe(digest)
        maybe = [item for item in sealed
                 if item[1].filter[word % item[1].words] & mask == mask]
        if not maybe:
            return loc
        key = sealed_key(namespace, digest)
        with self._lock:  # a pack's descriptor is closed under it (``_forget``, ``close``)
            for no, digests in maybe:
                pack = self._packs.get(no)
                found = None if pack is None else self._sealed_find(pack, digests, key)
                if found is not None:
                    loc = _merged(loc, (no, *found), self._packs)
        return loc

    def _sealed_find(self, pack: _Pack, digests: SealedDigests,
                     key: bytes) -> tuple[int, int, int] | None:
        """``digests.find`` through ``pack``'s descriptor (opened again if the store
        closed it; a pack removed meanwhile is forgotten). The caller holds ``_lock``."""
        if pack.read_fd is None:
            try:
                pack.read_fd = os.open(pack.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                self._forget(pack)
                return None
            except OSError as exc:
                raise _os_errors("open pack", pack.path)._translate(exc) from exc
        try:
            return digests.find(key, _reader(pack.read_fd))
        except DamagedIndex as exc:
            raise _damaged(pack, exc) from None
        except OSError as exc:
            raise _os_errors("read pack index", pack.path)._translate(exc) from exc

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

    def _close_fds(self, pack: _Pack) -> None:
        for fd in (pack.fd, pack.sync_fd):  # opened through the file operations
            if fd is not None:
                with contextlib.suppress(OSError):
                    self._ops.close(fd)
        if pack.read_fd is not None:
            with contextlib.suppress(OSError):
                os.close(pack.read_fd)
        pack.fd = pack.read_fd = pack.sync_fd = None

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
        return exists_by_check(self.check, ref)

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

    def read_each(self, refs: Sequence[ArtifactRef], *, most: int
                  ) -> Iterator[tuple[ArtifactRef, bytes | ArtifactError | None]]:
        """``read`` of each ref up to ``most`` bytes, in ``refs`` order: (ref, its bytes,
        or the ``ArtifactCorruptError`` ``read`` raises for a record of another size), or
        (ref, None) for one to ``read`` or ``open`` one by one instead (larger than
        ``most``, in no pack now: a payload file of a conversion, or missing: ``read``
        says which).

        What an export reads (``_archive/segments.py``): every payload the store
        references, in digest order. ``read`` looks each up in the index and reads it with
        a system call; here the refs are located in one pass over the index, and each pack
        is mapped into memory once and, when most of it is wanted, read ahead in file
        order (the 14,952 payloads of a 5,000-page crawl's store: one pack of 22 MiB)."""
        self.refresh()
        locations = self._locations(refs)
        wanted: collections.Counter[int] = collections.Counter()
        for number, _, length, _ in locations.values():
            wanted[number] += length
        maps: dict[int, tuple[_Pack, mmap.mmap] | None] = {}
        try:
            for ref in refs:
                loc = locations.get((ref.namespace, ref.digest))
                if ref.size > most or loc is None:
                    yield ref, None
                    continue
                if loc[0] not in maps:
                    maps[loc[0]] = self._map(loc[0], wanted[loc[0]])
                mapped = maps[loc[0]]
                if mapped is None:
                    yield ref, None  # its pack is gone (a compaction): read says where
                    continue
                pack, view = mapped
                if loc[2] != ref.size:
                    yield ref, self._corrupt_size(ref, pack, loc, loc[2])
                    continue
                start = loc[1] + pf.RECORD_SIZE
                data = view[start:start + loc[2]]
                yield ref, (data if len(data) == ref.size
                            else self._corrupt_size(ref, pack, loc, len(data)))
        finally:
            for mapped in maps.values():
                if mapped is not None:
                    mapped[1].close()

    def _locations(self, refs: Sequence[ArtifactRef]) -> dict[tuple[str, str], Location]:
        """Where each of ``refs`` is: a lookup each when they are few, else one pass over
        every entry (the memory index's, then each sealed pack's own index on disk, read
        once in file order rather than a block per ref)."""
        if len(refs) <= _FEW_REFS:
            found = ((r.namespace, r.digest, self._get(r.namespace, _digest_bytes(r)))
                     for r in refs)
            return {(ns, digest): loc for ns, digest, loc in found if loc is not None}
        wanted = {(r.namespace, bytes.fromhex(r.digest)) for r in refs}
        located: dict[tuple[str, str], Location] = {}
        for ns, digest, loc in self._entries():
            if (ns, digest) in wanted:
                key = (ns, digest.hex())
                located[key] = _merged(located.get(key), loc, self._packs)
        return located

    def _entries(self) -> Iterator[tuple[str, bytes, Location]]:
        """Every (namespace, digest, location) the index holds: the memory index's, then
        each sealed pack's (a key in several packs comes once per pack). Holds ``_lock``
        until exhausted (a sealed pack's descriptor is closed under it): consume it whole,
        taking no lock of the store meanwhile."""
        with self._lock:
            yield from self._index.items()
            for no, digests in self._sealed:
                pack = self._packs[no]
                try:
                    for ns, digest, found in digests.items(_reader(self._read_fd(pack))):
                        yield ns, digest, (no, *found)
                except DamagedIndex as exc:
                    raise _damaged(pack, exc) from None
                except OSError as exc:
                    raise _os_errors("read pack index", pack.path)._translate(exc) from exc

    def _map(self, number: int, wanted: int) -> tuple[_Pack, mmap.mmap] | None:
        """Pack ``number`` mapped read-only (None if it is gone); read ahead when the
        ``wanted`` bytes of its payloads are a quarter of its size or more."""
        pack = self._packs.get(number)
        if pack is None:
            return None
        try:
            fd = self._read_fd(pack)
            view = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except (ArtifactError, OSError, ValueError):
            return None  # read() of each of its payloads says what is wrong
        if wanted * 4 >= len(view):
            view.madvise(mmap.MADV_WILLNEED)
        return pack, view

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

    def listing(self) -> tuple[dict[bytes, int], set[bytes]] | None:
        """Every payload the packs hold, its size by ``sealed_key`` (the namespace,
        zero-padded to 32 bytes, then the digest's 32 bytes), and the keys listed with two
        sizes (which one a lookup finds is the lookup's to say), after one look at each
        pack file; None when a pack is not as the index knows it (removed, of another size
        than it was sealed at or shorter than the records known in it, writable) or the
        store also holds loose files. How ``verify`` checks every reference at once
        (``_audit/verify_quick.py``), where ``check_each`` looks up each payload. Raises
        ``ArtifactError`` for an index that no longer reads back (its CRCs)."""
        self.refresh()
        with self._lock:
            if self.legacy is not None:
                return None
            for pack in self._packs.values():
                try:
                    stat = os.stat(pack.path)
                except OSError:
                    return None
                if (stat.st_mode & 0o222 or stat.st_size < pack.size
                        or (pack.sealed and stat.st_size != pack.size)):
                    return None
            listed = {sealed_key(ns, digest): loc[2] for ns, digest, loc in self._index.items()}
            differ: set[bytes] = set()
            for no, digests in self._sealed:
                pack = self._packs[no]
                try:
                    digests.sizes(_reader(self._read_fd(pack)), listed, differ)
                except DamagedIndex as exc:
                    raise _damaged(pack, exc) from None
                except OSError as exc:
                    raise _os_errors("read pack index", pack.path)._translate(exc) from exc
        return listed, differ

    def iter_refs(self) -> Iterator[ArtifactRef]:
        """Every payload stored, once, sorted by (namespace, digest)."""
        self.refresh()
        refs = {ArtifactRef(ns, digest.hex(), loc[2]) for ns, digest, loc in self._entries()}
        if self.legacy is not None:
            refs.update(self.legacy.iter_refs())
        yield from sorted(refs, key=lambda r: (r.namespace, r.digest))

    def usage(self) -> tuple[int, int]:
        """(number of payloads, their total bytes)."""
        return usage_of(self.iter_refs())

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
        return self._mode_writable(ref, {})

    def writable_each(self, refs: Sequence[ArtifactRef]) -> list[bool]:
        """``is_writable`` of each, each pack's mode looked at once: a pack's payloads
        share its write bit, so one stat answers for all of them."""
        modes: dict[int, bool] = {}
        return [self._mode_writable(ref, modes) for ref in refs]

    def _mode_writable(self, ref: ArtifactRef, modes: dict[int, bool]) -> bool:
        """``is_writable``; ``modes`` holds the answer of each pack already looked at."""
        loc = self._locate(ref)
        if loc is None:
            return self.legacy.is_writable(ref) if self.legacy is not None else False
        writable = modes.get(loc[0])
        if writable is None:
            try:
                writable = bool(os.stat(self._packs[loc[0]].path).st_mode & 0o222)
            except (OSError, KeyError):
                writable = False
            modes[loc[0]] = writable
        return writable

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

    # --- errors -----------------------------------------------------------------------

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

    def _sync_failed(self, pack: _Pack, exc: OSError | None) -> ArtifactError:
        why = f": {exc.strerror or exc}" if exc is not None else " earlier"
        return ArtifactError(
            f"an fsync of artifact pack {pack.path} failed{why}; its payloads not synced "
            "before are not trusted again until the store is resynced",
            hint="check the disk (dmesg); once it works, open the store again (opening it "
            "for writing resyncs it) and redeliver what was not acknowledged",
            path=pack.path, sync_failed=True, errno=getattr(exc, "errno", None))

    # --- what the classes built on this one provide ------------------------------------

    def _recover(self, pack: _Pack, size: int) -> bool:
        """Seal a pack whose appender is gone (``packrecovery.PackRecovery``)."""
        raise NotImplementedError

    def _remove_stale_new(self, name: str) -> None:
        """Remove a pack whose creator died before naming it (``PackRecovery``)."""
        raise NotImplementedError

    def _write_own_held(self) -> None:
        """Write what this thread's batch holds (``packappend.PackAppend``)."""
        raise NotImplementedError


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


def _merged(have: Location | None, found: Location, packs: dict[int, _Pack]) -> Location:
    """One key's location from two packs that hold it: the lowest-numbered live pack's
    record, with the later time (the time keeps it young for reclaim's grace period)."""
    if have is None or have[0] not in packs:
        return found
    first = have if have[0] <= found[0] else found
    return (*first[:3], max(have[3], found[3]))


def _damaged(pack: _Pack, exc: DamagedIndex) -> ArtifactCorruptError:
    return ArtifactCorruptError(
        f"the index of sealed pack {pack.path} changed on disk since it was read and "
        f"checked ({exc}): its payloads cannot be located", path=pack.path,
        hint="the pack is damaged: run 'evidence verify --full' and restore it from a "
        "backup")


def _digest_bytes(ref: ArtifactRef) -> bytes:
    return bytes.fromhex(ref.digest)


def _abandoned(fd: int) -> bool:
    """Whether no process holds the pack's lock (its appender is gone)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True
