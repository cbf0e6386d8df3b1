"""What verify and reclaim ask of an S3 store: every payload listed, a payload's age,
and its removal: ``S3Reclaim``.

Reclaim's grace period reads ``age`` from the youngest copy's Last-Modified. A removal is
planned before the write lock and committed under it: a segment holding orphans is
rewritten without them first (``_SegmentRemoval``: the new segment put before the lock,
the old one deleted by ``commit``, the new one by ``abort``), a payload held here and never
sealed is dropped from memory (``_HeldRemoval``), and a payload in no segment loses its own
object (``_ObjectRemoval``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence

from .._errors import ArtifactError
from .._model.refs import DIGEST_RE, NAMESPACE_RE, ArtifactRef
from .artifactbase import usage_of
from .backend import Removal
from .s3client import ListedObject
from .s3puts import S3Puts
from .s3segment import SEGMENTS, Segment, build_segment

__all__ = ["S3Reclaim"]


class S3Reclaim(S3Puts):
    """Walking an S3 store, and removing from it (see the module's docstring)."""

    # --- walking and housekeeping --------------------------------------------------------

    def iter_refs(self) -> Iterator[ArtifactRef]:
        """Every payload, once, sorted by (namespace, digest): the objects of layout 1,
        the entries of every segment (listed now) and the payloads held here (as a pack
        lists records appended but not yet synced)."""
        self.refresh()
        with self._lock:
            found = {name: self._segments[keys[0]].entries[name].size
                     for name, keys in self._where.items() if keys}
            found.update((name, len(body)) for name, body in self._held.items())
        namespaces = sorted(
            name for item in self.client.list(self._base, delimiter="/")
            if isinstance(item, str)
            and NAMESPACE_RE.fullmatch(name := item[len(self._base):].rstrip("/")))
        for namespace in namespaces:
            start = f"{self._base}{namespace}/"
            for item in self.client.list(start):
                if isinstance(item, ListedObject):
                    digest = item.key[len(start):]
                    if DIGEST_RE.fullmatch(digest):
                        found.setdefault((namespace, digest), item.size)
        for (namespace, digest), size in sorted(found.items()):
            yield ArtifactRef(namespace, digest, size)

    def usage(self) -> tuple[int, int]:
        return usage_of(self.iter_refs())

    def age(self, ref: ArtifactRef) -> float | None:
        """Seconds since its youngest copy was stored (a segment's time, or its own
        object's, refreshed by a put); None if it is nowhere."""
        times = []
        name = (ref.namespace, ref.digest)
        with self._lock:
            if name in self._held:
                return 0.0  # put just now, not sealed yet
            keys = list(self._where.get(name, ()))
        for key in keys:
            head = self.client.head(key)
            if head is None:
                with self._lock:
                    self._forget(key)
            else:
                times.append(head.last_modified)
        head = self.client.head(self.key(ref))
        if head is not None:
            times.append(head.last_modified)
        if not times:
            return None
        return max(0.0, time.time() - max(times))

    def remove(self, ref: ArtifactRef) -> int | None:
        """Delete every copy of the payload (reclaim, under the store's write lock): its
        own object, and its entry in each segment (rewritten without it); the bytes freed,
        or None if it was nowhere."""
        self.refresh()
        with self._lock:
            held = (ref.namespace, ref.digest) in self._held
        if not held and self._entry(ref) is None and self.client.head(self.key(ref)) is None:
            return None
        freed = 0
        for removal in self.plan_removal([ref]):
            freed += removal.commit()
        return freed

    def _remove_object(self, ref: ArtifactRef) -> int:
        key = self.key(ref)
        head = self.client.head(key)
        if head is None:
            return 0
        self.client.delete(key)
        return head.size

    def plan_removal(self, refs: Iterable[ArtifactRef]) -> list[Removal]:
        """One removal per segment holding some of ``refs`` (the segment rewritten without
        them, before the lock; swapped in by ``commit``), and one per payload in no
        segment (its own object, deleted)."""
        self.refresh()
        by_segment: dict[str, list[ArtifactRef]] = {}
        alone: list[ArtifactRef] = []
        removals: list[Removal] = []
        for ref in refs:
            with self._lock:
                keys = list(self._where.get((ref.namespace, ref.digest), ()))
                held = (ref.namespace, ref.digest) in self._held
            for key in keys:
                by_segment.setdefault(key, []).append(ref)
            if held:
                removals.append(_HeldRemoval(self, ref))
            elif not keys:
                alone.append(ref)
        for key, mine in by_segment.items():
            with self._lock:
                segment = self._segments.get(key)
            if segment is not None:
                removals.append(_SegmentRemoval(self, segment, mine))
        removals += [_ObjectRemoval(self, ref) for ref in alone]
        return removals

    def is_writable(self, ref: ArtifactRef) -> bool:
        """False: an object is never changed in place (a replacement is a new object,
        which verify's re-hash finds)."""
        return False

    def writable_each(self, refs: Sequence[ArtifactRef]) -> list[bool]:
        return [False] * len(refs)


class _OneRemoval:
    """One payload of this store removed alone: nothing to prepare, nothing to undo."""

    def __init__(self, store: S3Reclaim, ref: ArtifactRef) -> None:
        self.store, self.refs = store, [ref]

    def abort(self) -> None:
        pass


class _HeldRemoval(_OneRemoval):
    """A payload held here, never sealed (no sync named it): dropped from memory."""

    def commit(self) -> int:
        store, ref = self.store, self.refs[0]
        with store._lock:
            body = store._held.pop((ref.namespace, ref.digest), None)
            store._copies.pop((ref.namespace, ref.digest), None)
            if body is not None:
                store._held_bytes -= len(body)
        return (0 if body is None else len(body)) + store._remove_object(ref)


class _ObjectRemoval(_OneRemoval):
    """A payload in no segment: its own object (layout 1) is deleted."""

    def commit(self) -> int:
        return self.store._remove_object(self.refs[0])


class _SegmentRemoval:
    """Some payloads of one segment removed: the segment is rewritten without them (a new
    segment, when any payload remains) before the lock; ``commit`` deletes the old one,
    ``abort`` the new one (if this removal created it). Both exist in between: a reader
    finds every payload in one or the other."""

    def __init__(self, store: S3Reclaim, segment: Segment,
                 refs: list[ArtifactRef]) -> None:
        self.store, self.segment, self.refs = store, segment, refs
        gone = {(ref.namespace, ref.digest) for ref in refs}
        self._freed = sum(e.size for name, e in segment.entries.items() if name in gone)
        self._new: Segment | None = None
        self._created = False
        keep = [e for name, e in segment.entries.items() if name not in gone]
        if not keep:
            return
        data = store.client.get(segment.key)
        if data is None or len(data) != segment.size:
            raise ArtifactError(f"s3://{store.location_.bucket}/{segment.key} changed while "
                                "reclaim planned its removal", hint="run reclaim again")
        body, entries, name = build_segment(
            (e.namespace, e.digest, data[e.offset:e.offset + e.size])
            for e in sorted(keep, key=lambda e: e.offset))
        key = f"{store._base}{SEGMENTS}{name}"
        self._created = store._put_object(key, body)
        self._new = Segment(key, len(body), time.time(),
                            {(e.namespace, e.digest): e for e in entries})
        with store._lock:
            store._know(self._new)

    def commit(self) -> int:
        store = self.store
        store.client.delete(self.segment.key)
        with store._lock:
            store._forget(self.segment.key)
        return self._freed + sum(store._remove_object(ref) for ref in self.refs)

    def abort(self) -> None:
        if self._new is not None and self._created:
            self.store.client.delete(self._new.key)
            with self.store._lock:
                self.store._forget(self._new.key)
