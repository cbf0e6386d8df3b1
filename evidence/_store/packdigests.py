"""The pack store's digest index, held compact: ``DigestIndex``.

A pack store finds a payload by (namespace, BLAKE3 digest): a put deduplicates against it,
a read, a check or a sync goes straight to the record it names. A dict of dicts holding a
bytes key and a tuple of four ints per payload cost about 200 bytes a payload, three
payloads a crawled page: what grew with every page of a crawl once the writer's caches
were full (issue 35; docs/benchmarks.md, "Writes and memory over a crawl"). This module
keeps the same map in 62 bytes a payload and no Python object per payload.

Two parts. The *base*: every entry but the newest, sorted by the digest's first 8 bytes,
in two columns: those 8 bytes as an ``array`` of 64-bit words, and a ``bytearray`` of
fixed 54-byte records (the digest's other 24 bytes, the namespace's number, the
location). A lookup bisects the words (``bisect`` over an ``array``: C speed) and
compares the records of the few entries sharing the word. The *recent* entries: a dict,
merged into the base once it holds ``RECENT`` entries or a sixteenth of the base,
whichever is more (each entry is copied about 16 times per doubling of the base, as
slices: memory copies; the dict adds ~20 bytes a payload on average). Removing an entry
from the base marks it (pack number 0: pack numbers start at 1); the next merge drops it.

Invariants: a key is live in one part at most; the base is sorted by the digest's first
8 bytes; the map answers exactly what a dict would (tests/test_packdigests.py compares it
with one over any sequence of operations). Each operation holds the index's own lock: a
dict's lookup was atomic and the pack store looks up without its lock (a put on one
thread while the writer's sync looks up on another), where a merge here replaces the
base's two columns and an update writes a record in place."""

from __future__ import annotations

import struct
import threading
from array import array
from bisect import bisect_left
from collections.abc import Iterator

__all__ = ["BYTES_PER_ENTRY", "RECENT", "DigestIndex", "Location"]

Location = tuple[int, int, int, int]  # (pack number, record offset, payload length, time ms)

RECENT = 4096  # recent entries merged into the base at least (a small base: at this many)
_SHARE = 16  # ... or at a sixteenth of the base, when that is more

# A base record: the digest's last 24 bytes, the namespace's number, then the location.
_RECORD = struct.Struct("<24sHIQQQ")
_KEY = 26  # the record's first bytes: what a lookup compares
_LOC = struct.Struct("<IQQQ")  # the location, at _KEY
_WIDTH = _RECORD.size  # 54
BYTES_PER_ENTRY = 8 + _WIDTH  # 62


def _head(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "big")


class DigestIndex:
    """(namespace, digest) -> ``Location``, in about 62 bytes an entry (see the module's
    docstring). The operations a dict has, by key: ``get``, ``set`` (``add`` when ``get``
    just said it is absent), ``pop``; and ``items``, ``in_pack``, ``len``, ``compact``."""

    def __init__(self, *, recent: int = RECENT) -> None:
        if type(recent) is not int or recent < 1:
            raise ValueError(f"recent must be a positive int, not {recent!r}")
        self._most = recent
        self._recent: dict[tuple[str, bytes], Location] = {}
        self._heads = array("Q")  # the digests' first 8 bytes, sorted
        self._records = bytearray()  # _WIDTH bytes each, in the same order
        self._dead = 0  # base entries marked removed (pack number 0)
        self._spaces: dict[str, int] = {}
        self._names: list[str] = []
        self._mutex = threading.Lock()

    def __len__(self) -> int:
        with self._mutex:
            return len(self._recent) + len(self._heads) - self._dead

    def get(self, namespace: str, digest: bytes) -> Location | None:
        with self._mutex:
            loc = self._recent.get((namespace, digest))
            if loc is not None:
                return loc
            i = self._find(namespace, digest)
            return None if i < 0 else _LOC.unpack_from(self._records, i * _WIDTH + _KEY)

    def set(self, namespace: str, digest: bytes, loc: Location) -> None:
        with self._mutex:
            key = (namespace, digest)
            if key not in self._recent:
                i = self._find(namespace, digest)
                if i >= 0:
                    _LOC.pack_into(self._records, i * _WIDTH + _KEY, *loc)
                    return
            self._add(key, loc)

    def add(self, namespace: str, digest: bytes, loc: Location) -> None:
        """``set`` of a key the caller just found absent (``get`` returned None, and
        nothing was set since: the lookup is not made twice)."""
        with self._mutex:
            self._add((namespace, digest), loc)

    def pop(self, namespace: str, digest: bytes) -> Location | None:
        """Remove the key; what it located, or None."""
        with self._mutex:
            loc = self._recent.pop((namespace, digest), None)
            if loc is not None:
                return loc
            i = self._find(namespace, digest)
            if i < 0:
                return None
            at = i * _WIDTH + _KEY
            loc = _LOC.unpack_from(self._records, at)
            _LOC.pack_into(self._records, at, 0, 0, 0, 0)
            self._dead += 1
            return loc

    def items(self) -> Iterator[tuple[str, bytes, Location]]:
        """Every (namespace, digest, location), as they were when asked (the columns
        copied: a memory copy, no object per entry until each is yielded)."""
        with self._mutex:
            recent = list(self._recent.items())
            heads, records = array("Q", self._heads), bytes(self._records)
            names = list(self._names)
        for (namespace, digest), loc in recent:
            yield namespace, digest, loc
        for head, (tail, space, pack, offset, length, when) in zip(
                heads, _RECORD.iter_unpack(records), strict=True):
            if pack:
                yield names[space], head.to_bytes(8, "big") + tail, (pack, offset, length, when)

    def in_pack(self, pack: int) -> list[tuple[str, bytes, Location]]:
        """The entries located in pack number ``pack`` (a pack is forgotten, poisoned)."""
        with self._mutex:
            found = [(ns, d, loc) for (ns, d), loc in self._recent.items() if loc[0] == pack]
            if pack:
                for head, (tail, space, no, offset, length, when) in zip(
                        self._heads, _RECORD.iter_unpack(self._records), strict=True):
                    if no == pack:
                        found.append((self._names[space], head.to_bytes(8, "big") + tail,
                                      (no, offset, length, when)))
            return found

    def nbytes(self) -> int:
        """The base's columns, in bytes (the recent entries' dict not counted)."""
        with self._mutex:
            return len(self._heads) * 8 + len(self._records)

    def compact(self) -> None:
        """Merge the recent entries into the base now (``add`` does it once there are
        enough of them)."""
        with self._mutex:
            self._compact()

    # --- the base ---------------------------------------------------------------------

    def _add(self, key: tuple[str, bytes], loc: Location) -> None:
        self._recent[key] = loc
        if len(self._recent) >= max(self._most, len(self._heads) // _SHARE):
            self._compact()

    def _compact(self) -> None:
        """Merge the recent entries into the base, dropping the removed ones. Each
        recent entry goes in at its place (bisected) between slices of the base copied
        whole (a memory copy), so a merge costs a few calls per recent entry and one
        copy of the base."""
        rows = []
        for (namespace, digest), loc in self._recent.items():
            space = self._spaces.get(namespace)
            if space is None:
                space = self._spaces[namespace] = len(self._names)
                self._names.append(namespace)
            rows.append((_head(digest), _RECORD.pack(digest[8:], space, *loc)))
        self._recent = {}
        if self._dead:
            self._drop_dead()
        rows.sort()  # by the digest's first 8 bytes, then the rest
        heads, records = self._heads, self._records
        total = len(heads) + len(rows)
        # Allocated once at their final size (grown by appends, they would hold ~12% more).
        merged_heads, merged_records = array("Q", bytes(8 * total)), bytearray(_WIDTH * total)
        start = out = 0  # where the next slice of the base starts; where it goes
        with memoryview(heads).cast("B") as head_view, memoryview(records) as record_view, \
                memoryview(merged_heads).cast("B") as head_out:
            for head, record in rows:
                place = bisect_left(heads, head)
                if place > start:
                    end = out + place - start
                    head_out[out * 8:end * 8] = head_view[start * 8:place * 8]
                    merged_records[out * _WIDTH:end * _WIDTH] = \
                        record_view[start * _WIDTH:place * _WIDTH]
                    out = end
                merged_heads[out] = head
                merged_records[out * _WIDTH:(out + 1) * _WIDTH] = record
                start, out = place, out + 1
            head_out[out * 8:] = head_view[start * 8:]
            merged_records[out * _WIDTH:] = record_view[start * _WIDTH:]
        self._heads, self._records = merged_heads, merged_records

    def _drop_dead(self) -> None:
        """The base without the entries marked removed (rare: a pack forgotten or
        poisoned, a payload reclaimed)."""
        live = [i for i, (_, _, pack, *_) in enumerate(_RECORD.iter_unpack(self._records))
                if pack]
        heads, records = self._heads, self._records
        self._heads = array("Q", (heads[i] for i in live))
        self._records = bytearray(b"".join(records[i * _WIDTH:(i + 1) * _WIDTH]
                                           for i in live))
        self._dead = 0

    def _find(self, namespace: str, digest: bytes) -> int:
        """The base's position of the live entry for the key, or -1."""
        heads = self._heads
        head = _head(digest)
        i = bisect_left(heads, head)
        if i == len(heads) or heads[i] != head:
            return -1  # most lookups: a new payload's digest
        space = self._spaces.get(namespace)
        if space is None:
            return -1
        want, records = digest[8:] + space.to_bytes(2, "little"), self._records
        while i < len(heads) and heads[i] == head:
            at = i * _WIDTH
            if records[at:at + _KEY] == want and records[at + _KEY:at + _KEY + 4] != b"\0\0\0\0":
                return i
            i += 1
        return -1
