"""An S3 store's index of segments, and the reads through it: ``S3Index``.

What ``S3ArtifactStore`` (``s3.py``) knows of ``<prefix>/SEGMENTS/``: each segment known,
by key, and (namespace, digest) -> the keys of the segments holding that payload. A
segment's index is read by range from its end (``_load_segment``); ``refresh`` lists the
bucket and learns the new segments, forgets the ones gone. A holding store remembers only
its recent puts (bounded); a full listing loads all. Reads find a payload in memory (held,
not sealed yet), in a segment, or as its own object (layout 1), and look again after a
refresh when a segment is gone (reclaim rewrote it); every error a read raises is built
here.

This is the lowest of the S3 store's classes (``S3Index`` < ``S3Puts`` < ``S3Reclaim`` <
``S3ArtifactStore``, one module each): it declares the state they share, which
``S3ArtifactStore.__init__`` sets.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Sequence
from typing import BinaryIO

import blake3

from .._errors import ArtifactCorruptError, ArtifactError, ArtifactMissingError
from .._model.refs import ArtifactRef, validate_digest, validate_namespace
from .artifactbase import check_one_by_one, exists_by_check
from .s3client import ListedObject, S3Client
from .s3location import S3Location
from .s3segment import (
    SEGMENTS,
    TRAILER_SIZE,
    Entry,
    Segment,
    SegmentFormatError,
    is_segment_name,
    parse_index,
    parse_trailer,
)

__all__ = ["S3Index"]

log = logging.getLogger("evidence.s3")

_TAIL = 64 * 1024  # bytes read from a segment's end to find its index (most fit)
_KNOWN_LOCATIONS = 1 << 17  # a holding store's memory of where its recent puts went


class S3Index:
    """The segment index of an S3 store, and reading through it (see the module's
    docstring)."""

    # The state every part of the store shares, set by ``S3ArtifactStore.__init__``.
    location_: S3Location
    url: str
    max_payload: int
    read_only: bool
    hold: bool
    client: S3Client
    layout: int
    _base: str
    _lock: threading.Lock
    _sealing: threading.Lock
    _held: dict[tuple[str, str], bytes]
    _copies: dict[tuple[str, str], float]
    _held_bytes: int
    _segments: dict[str, Segment]
    _where: dict[tuple[str, str], list[str]]
    _listed: bool

    # --- keys ----------------------------------------------------------------------------

    def key(self, ref_or_namespace: ArtifactRef | str, digest: str | None = None) -> str:
        """The object key of a ref in layout 1 (one object per payload; validated: no
        input can name another key)."""
        if isinstance(ref_or_namespace, ArtifactRef):
            namespace, digest = ref_or_namespace.namespace, ref_or_namespace.digest
        else:
            namespace = ref_or_namespace
        if digest is None:
            raise TypeError("key(namespace) needs a digest")
        validate_namespace(namespace)
        validate_digest(digest)
        return f"{self._base}{namespace}/{digest}"

    def location(self, ref: ArtifactRef) -> str:
        """Where the payload is, for findings and errors: its segment and offset, or its
        own object."""
        with self._lock:
            keys = self._where.get((ref.namespace, ref.digest), ())
            segment = self._segments.get(keys[0]) if keys else None
        if segment is not None:
            entry = segment.entries[(ref.namespace, ref.digest)]
            return f"s3://{self.location_.bucket}/{segment.key}@{entry.offset}"
        return f"s3://{self.location_.bucket}/{self.key(ref)}"

    def segment_keys(self) -> list[str]:
        """The keys of every segment object in the bucket (listed now)."""
        start = self._base + SEGMENTS
        return [item.key for item in self.client.list(start)
                if isinstance(item, ListedObject) and is_segment_name(item.key[len(start):])]

    def _know(self, segment: Segment) -> None:
        """Add ``segment`` to the index (under ``_lock``); a holding store that has not
        listed the bucket forgets its oldest segments past a bound, so a long crawl's
        memory does not grow with it (a payload not found is looked up again)."""
        self._segments.pop(segment.key, None)
        self._segments[segment.key] = segment
        for name in segment.entries:
            keys = self._where.setdefault(name, [])
            if segment.key not in keys:
                keys.append(segment.key)
        if self._listed:
            return
        while len(self._where) > _KNOWN_LOCATIONS and len(self._segments) > 1:
            self._forget(next(iter(self._segments)))

    def _forget(self, key: str) -> None:
        """Drop segment ``key`` from the index (under ``_lock``)."""
        segment = self._segments.pop(key, None)
        if segment is None:
            return
        for name in segment.entries:
            keys = self._where.get(name)
            if keys is not None and key in keys:
                keys.remove(key)
                if not keys:
                    del self._where[name]

    # --- finding a payload ---------------------------------------------------------------

    def _entry(self, ref: ArtifactRef) -> tuple[Segment, Entry] | None:
        """The youngest known segment holding ``ref``'s payload, and where in it."""
        name = (ref.namespace, ref.digest)
        with self._lock:
            found = [self._segments[key] for key in self._where.get(name, ())]
        if not found:
            return None
        segment = max(found, key=lambda s: s.modified)
        return segment, segment.entries[name]

    def refresh(self) -> None:
        """Load the index of every segment in the bucket not known yet, and forget the
        known ones that are gone (reclaim rewrote or removed them)."""
        listed: dict[str, ListedObject] = {}
        start = self._base + SEGMENTS
        for item in self.client.list(start):
            if isinstance(item, ListedObject) and is_segment_name(item.key[len(start):]):
                listed[item.key] = item
        with self._lock:
            for key in [k for k in self._segments if k not in listed]:
                self._forget(key)
            new = [item for key, item in listed.items() if key not in self._segments]
            self._listed = True
        for item in new:
            segment = self._load_segment(item)
            if segment is not None:
                with self._lock:
                    self._know(segment)

    def _load_segment(self, item: ListedObject) -> Segment | None:
        """A listed segment's index, read by range from its end (None: gone meanwhile,
        or damaged: its payloads are then not found, which verify reports)."""
        try:
            tail_start = max(0, item.size - _TAIL)
            tail = self.client.get(item.key, start=tail_start, end=item.size - 1)
            if tail is None:
                return None
            if len(tail) != item.size - tail_start or item.size < TRAILER_SIZE:
                raise SegmentFormatError("the object is shorter than its listing says")
            start, length, check = parse_trailer(tail[-TRAILER_SIZE:], item.size)
            if start >= tail_start:
                index = tail[start - tail_start:start - tail_start + length]
            else:
                index = self.client.get(item.key, start=start, end=start + length - 1) or b""
            entries = parse_index(index, check, start)
        except SegmentFormatError as exc:
            log.warning("s3://%s/%s: not a readable segment (%s); the payloads it holds "
                        "are not found", self.location_.bucket, item.key, exc,
                        extra={"event": "s3.segment_unreadable"})
            return None
        return Segment(item.key, item.size, item.last_modified, entries)

    # --- reading -------------------------------------------------------------------------

    def check_each(self, refs: Sequence[ArtifactRef]) -> list[ArtifactError | None]:
        """``check`` of each, asking for each segment once (a HEAD per segment, not per
        payload: verify's quick pass over a store of segments)."""
        confirmed: set[str] = set()
        return check_one_by_one(lambda ref: self._check(ref, confirmed), refs)

    def check(self, ref: ArtifactRef) -> None:
        """Raise ArtifactMissingError, or ArtifactCorruptError if the size differs."""
        self._check(ref, set())

    def _check(self, ref: ArtifactRef, confirmed: set[str]) -> None:
        """``check``, where the segments in ``confirmed`` are known to be there.

        A payload held here passes (the writer's sync stores it before its COMMIT);
        else its segment (once per ``check_each``) or its own object is asked for with a
        HEAD: what this process knows says where to look, never that it is there (a
        reclaim elsewhere may have rewritten a segment since)."""
        with self._lock:
            held = self._held.get((ref.namespace, ref.digest))
        if held is not None:
            if len(held) != ref.size:
                raise self._wrong_size(ref, len(held))
            return
        for attempt in range(2):
            found = self._entry(ref)
            if found is not None:
                segment, entry = found
                if entry.size != ref.size:
                    raise self._wrong_size(ref, entry.size)
                if segment.key in confirmed:
                    return
                if self.client.head(segment.key) is not None:
                    confirmed.add(segment.key)
                    return
                # Gone: reclaim rewrote it (the payload may be in the new segment).
            else:
                head = self.client.head(self.key(ref))
                if head is not None:
                    if head.size != ref.size:
                        raise self._wrong_size(ref, head.size)
                    return
            if attempt == 0:
                self.refresh()
        raise self._missing(ref)

    def exists(self, ref: ArtifactRef) -> bool:
        return exists_by_check(self.check, ref)

    def _fetch(self, ref: ArtifactRef, start: int, end: int | None) -> bytes | None:
        """Bytes ``start``..``end`` (inclusive; None: to the end) of the payload, from
        memory, a segment or its own object; None if it is nowhere."""
        with self._lock:
            held = self._held.get((ref.namespace, ref.digest))
        if held is not None:
            return held[start:None if end is None else end + 1]
        for attempt in range(2):
            found = self._entry(ref)
            if found is not None:
                segment, entry = found
                last = entry.size - 1 if end is None else min(end, entry.size - 1)
                if last < start:
                    return b""
                data = self.client.get(segment.key, start=entry.offset + start,
                                       end=entry.offset + last)
                if data is not None:
                    return data
                # Gone: reclaim rewrote it (the payload may be in the new segment).
            elif start == 0 and end is None:
                data = self.client.get(self.key(ref))
            else:
                data = self.client.get(self.key(ref), start=start, end=end)
            if data is not None:
                return data
            if attempt == 0:
                self.refresh()  # forgets the segments gone, learns the new ones
        return None

    def read(self, ref: ArtifactRef, *, verify: bool = False) -> bytes:
        data = self._fetch(ref, 0, None)
        if data is None:
            raise self._missing(ref)
        if len(data) != ref.size:
            raise self._wrong_size(ref, len(data))
        if verify:
            actual = blake3.blake3(data).hexdigest()
            if actual != ref.digest:
                raise ArtifactCorruptError(
                    f"artifact {self.location(ref)} is corrupt: expected blake3 {ref.digest}, "
                    f"got {actual}",
                    hint="do not trust this payload; restore it from backup or re-fetch",
                    path=self.location(ref), namespace=ref.namespace, digest=ref.digest,
                    actual_digest=actual)
        return data

    def read_range(self, ref: ArtifactRef, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (inclusive) of a payload, without reading the rest."""
        data = self._fetch(ref, start, end)
        if data is None:
            raise self._missing(ref)
        return data

    def open(self, ref: ArtifactRef, *, verify: bool = False) -> BinaryIO:
        return io.BytesIO(self.read(ref, verify=verify))

    def verify(self, ref: ArtifactRef) -> None:
        self.read(ref, verify=True)

    def _missing(self, ref: ArtifactRef) -> ArtifactMissingError:
        return ArtifactMissingError(
            f"artifact {ref.namespace}/{ref.digest} is not in the store (expected at "
            f"{self.location(ref)} or in a segment under "
            f"s3://{self.location_.bucket}/{self._base}{SEGMENTS})",
            hint="it was never stored here or was deleted; restore it or re-fetch the page",
            path=self.location(ref), namespace=ref.namespace, digest=ref.digest)

    def _wrong_size(self, ref: ArtifactRef, actual: int) -> ArtifactCorruptError:
        return ArtifactCorruptError(
            f"artifact {self.location(ref)} is {actual} bytes, its reference says {ref.size}",
            hint="the object was truncated or replaced; restore it from backup or re-fetch",
            path=self.location(ref), namespace=ref.namespace, digest=ref.digest,
            expected_size=ref.size, actual_size=actual)
