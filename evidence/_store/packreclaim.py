"""Reclaim in a pack store: compaction (``PackReclaim``).

A sealed pack holding orphans is rewritten without them into a new sealed pack before
reclaim takes the database's write lock (``plan_removal``); the old one is removed only
under that lock, after reclaim's re-check (``_audit/verify.py``), and only once the new one
is durable (``_PackRemoval.commit``); ``abort`` leaves everything as it was. Payload files
left by a conversion that has not finished are removed one by one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

import blake3

from .._errors import (
    ArtifactCorruptError,
)
from .._model.refs import ArtifactRef
from . import packfile as pf
from .artifactbase import _os_errors
from .artifacts import ArtifactStore
from .backend import Removal
from .packappend import PackAppend
from .packindex import (
    _digest_bytes,
    _Pack,
    _reader,
)

__all__ = ["PackReclaim"]


class PackReclaim(PackAppend):
    """Removing payloads from a pack store (see the module's docstring)."""

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

    def __init__(self, store: PackReclaim, pack: _Pack, dead: set[tuple[str, bytes]]) -> None:
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
                loc = store._index.get(ns, digest)
                if loc is not None and loc[0] == pack.no:
                    store._index.pop(ns, digest)
                store._touched.pop((ns, digest), None)
            if self.target is not None:
                for old, new in self.moved:
                    if old.kind != pf.PAYLOAD:
                        continue
                    loc = store._index.get(old.namespace, old.digest)
                    if loc is not None and loc[0] == pack.no:
                        store._index.set(old.namespace, old.digest,
                                         (self.target.no, new.offset, new.length, loc[3]))
            store._forget(pack)
        return sum(ref.size for ref in self.refs)  # the payloads' bytes, as a file store says

    def abort(self) -> None:
        if self.target is not None:
            self.store._drop_own(self.target)
            self.target = None
