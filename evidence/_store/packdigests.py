"""The pack store's digest index: ``DigestIndex`` in memory, ``SealedDigests`` on disk.

A pack store finds a payload by (namespace, BLAKE3 digest): a put deduplicates against it,
a read, a check or a sync goes straight to the record it names. Held whole in memory,
that map grew with every payload stored, three a crawled page: what a crawl's resident
set still grew by once the writer's caches were full (issue 35 point 2; docs/store.md,
"The digest index"). So it is split by what a pack is:

- a **sealed** pack never changes again and carries its own index, sorted by (namespace,
  digest), checked by the BLAKE3 in its trailer when the store reads it. That index stays
  on disk: ``SealedDigests`` keeps of it a *fence* (the first key of every block of
  ``BLOCK_ENTRIES`` entries), each block's CRC-32, and a filter of the pack's digests
  (``FILTER_BITS`` bits a payload, one 64-bit word per digest: a blocked Bloom filter).
  A lookup the filter rules out costs no read (most lookups: a new payload's digest);
  otherwise one ``pread`` of a block (two when a key's entries straddle a boundary),
  checked against its CRC before anything in it is believed. Read with ``pread``, not
  mapped: touched pages of a mapping would count in the resident set again. About 3.7
  bytes a payload stay in memory (the filter's 2, the fence's 1.6), where the whole map
  took 62;
- the entries of **unsealed** packs (this process's active pack, other processes' packs
  being appended to, packs read as they are) are in ``DigestIndex``, bounded by what
  those packs hold (64 MiB each); a pack's entries leave it when the pack is sealed.

``DigestIndex`` keeps its map compact: the *base*, every entry but the newest, sorted by
the digest's first 8 bytes, in two columns: those 8 bytes as an ``array`` of 64-bit
words, and a ``bytearray`` of fixed 54-byte records (the digest's other 24 bytes, the
namespace's number, the location). A lookup bisects the words (``bisect`` over an
``array``: C speed) and compares the records of the few entries sharing the word. The
*recent* entries: a dict, merged into the base once it holds ``RECENT`` entries or a
sixteenth of the base, whichever is more. Removing an entry from the base marks it (pack
number 0: pack numbers start at 1); the next merge drops it.

Invariants: a ``DigestIndex`` answers exactly what a dict would, and a ``SealedDigests``
exactly what a dict built from its pack's index would (the first payload entry of a key,
with the latest time of its payload entries), tests/test_packdigests.py checks both over
any sequence of operations; a block whose bytes no longer match the CRC taken when the
index was checked is never believed (``DamagedIndex``). Each ``DigestIndex`` operation
holds the index's own lock: the pack store looks up without its lock (a put on one thread
while the writer's sync looks up on another), where a merge here replaces the base's two
columns and an update writes a record in place. A ``SealedDigests`` is immutable (its
reads are the caller's, through the function it passes in)."""

from __future__ import annotations

import struct
import threading
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator

from . import packfile as pf

__all__ = ["BLOCK_ENTRIES", "BYTES_PER_ENTRY", "FILTER_BITS", "RECENT", "DamagedIndex",
           "DigestIndex", "Location", "SealedDigests", "probe", "sealed_key"]

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


# --- sealed packs: their own index, on disk ----------------------------------------------

# Index entries per block: what a lookup the filter lets through reads (6 KiB), and the
# fence holds one key (about 100 bytes as a ``bytes`` object) per this many entries.
BLOCK_ENTRIES = 64
# The filter's bits per payload. One 64-bit word per digest, 6 bits set in it: at 16 bits
# a payload about 0.3% of absent digests pass (tests/test_packdigests.py measures it),
# each costing one block read. Bits, not bytes: 2 bytes a payload of the 3.7 kept.
FILTER_BITS = 16

_ENTRY = struct.Struct("<B7x32s32sQQQ")  # an index entry (``packfile``: docs/store.md)
_ENTRY_SIZE = _ENTRY.size
# An index entry as ``probe`` reads its digest: the kind, the digest's first 8 bytes as
# one little-endian word and its next 6 bytes, then the record's offset and length.
_PROBE = struct.Struct("<B39xQ6B18xQQ8x")
assert _PROBE.size == _ENTRY_SIZE
_KEYED = struct.Struct("<B7x64sQQQ")  # an entry with its sort key in one piece
_BIT = [1 << (b & 63) for b in range(256)]  # a probe byte's bit in its filter word (probe)
_KEY_AT, _KEY_END = 8, 72  # an entry's namespace (zero-padded) then digest: its sort key

ReadAt = Callable[[int, int], bytes]  # (offset in the pack, length) -> bytes: a pread


class DamagedIndex(Exception):
    """A block of a sealed pack's index does not match the CRC taken when the index was
    read and checked: the pack changed on disk since (the caller names the pack)."""

    def __init__(self, block: int) -> None:
        super().__init__(f"block {block} of the index fails its checksum")
        self.block = block


def probe(digest: bytes) -> tuple[int, int]:
    """(word, mask) of a digest in every sealed pack's filter: computed once per lookup
    (the word is taken modulo each filter's size). A BLAKE3 digest is uniform already:
    its first 8 bytes choose the word, six bits of each of the next six set the mask's
    bits (written out: a loop took twice the time)."""
    d = digest
    return int.from_bytes(d[:8], "little"), (
        1 << (d[8] & 63) | 1 << (d[9] & 63) | 1 << (d[10] & 63) | 1 << (d[11] & 63)
        | 1 << (d[12] & 63) | 1 << (d[13] & 63))


def sealed_key(namespace: str, digest: bytes) -> bytes:
    """The 64 bytes an index entry is sorted by: the namespace, zero-padded, then the
    digest."""
    return namespace.encode("ascii").ljust(32, b"\0") + digest


class SealedDigests:
    """The payloads of one sealed pack, found through its own index where it lies on
    disk (see the module's docstring). Built from the index's bytes once they have been
    checked against the trailer (``packfile.read_seal_index``); ``find`` and ``items``
    read through the ``ReadAt`` they are given."""

    __slots__ = ("_block_bytes", "_crcs", "_fence", "count", "filter", "index_offset",
                 "payloads", "words")

    def __init__(self, index_offset: int, index: bytes, *,
                 block: int = BLOCK_ENTRIES) -> None:
        if len(index) % _ENTRY_SIZE:
            raise ValueError(f"an index is whole {_ENTRY_SIZE}-byte entries, not {len(index)}")
        if type(block) is not int or block < 1:
            raise ValueError(f"block must be a positive int, not {block!r}")
        self.index_offset = index_offset
        self.count = len(index) // _ENTRY_SIZE
        self._block_bytes = size = block * _ENTRY_SIZE
        starts = range(0, len(index), size)
        self._fence = [index[at + _KEY_AT:at + _KEY_END] for at in starts]
        self._crcs = array("I", (zlib.crc32(index[at:at + size]) for at in starts))
        # Each payload entry's ``probe`` unpacked from the index as it lies (no digest
        # sliced or converted: an opening of a crawl's store spent 0.04 s of CPU on that).
        probes = [entry for entry in _PROBE.iter_unpack(index) if entry[0] == pf.PAYLOAD
                  and entry[8] + pf.RECORD_SIZE + entry[9] <= index_offset]
        # The filter: public, as a lookup over many packs probes it inline (a method
        # call per pack doubled a lookup's time).
        self.words = words = max(1, (len(probes) * FILTER_BITS + 63) // 64)
        self.filter = table = array("Q", bytes(8 * words))
        bit = _BIT  # each byte's bit looked up, where shifting cost an opening 0.007 s
        for _, word, b8, b9, b10, b11, b12, b13, _, _ in probes:
            table[word % words] |= bit[b8] | bit[b9] | bit[b10] | bit[b11] | bit[b12] | bit[b13]
        self.payloads = len(probes)  # payload entries (a key put twice counts twice)

    def might_hold(self, word: int, mask: int) -> bool:
        """False if the digest whose ``probe`` this is is surely not a payload here."""
        return self.filter[word % self.words] & mask == mask

    def find(self, key: bytes, read_at: ReadAt) -> tuple[int, int, int] | None:
        """(record offset, payload length, time) of the key's first payload entry, with
        the latest time of its payload entries; None if it has none. ``key`` is
        ``sealed_key``'s. Raises ``DamagedIndex``."""
        fence = self._fence
        block = max(bisect_left(fence, key) - 1, 0)  # the block before the first that
        found = None                                 # starts at or past the key
        while block < len(fence):
            data = self._block(block, read_at)
            at = data.find(key)
            while at >= 0:
                start = at - _KEY_AT
                if start % _ENTRY_SIZE == 0:
                    kind, _, _, offset, length, when = _ENTRY.unpack_from(data, start)
                    if kind == pf.PAYLOAD and \
                            offset + pf.RECORD_SIZE + length <= self.index_offset:
                        found = (offset, length, when) if found is None else \
                            (found[0], found[1], max(found[2], when))
                at = data.find(key, at + 1)
            if block + 1 < len(fence) and fence[block + 1] <= key:
                block += 1  # the key's entries go on in the next block
            else:
                break
        return found

    def items(self, read_at: ReadAt) -> Iterator[tuple[str, bytes, tuple[int, int, int]]]:
        """Every (namespace, digest, (offset, length, time)) as ``find`` answers it, in
        the index's order, read block by block. Raises ``DamagedIndex``."""
        last: tuple[bytes, str, bytes, tuple[int, int, int]] | None = None
        for block in range(len(self._fence)):
            for kind, ns, digest, offset, length, when in \
                    _ENTRY.iter_unpack(self._block(block, read_at)):
                if kind != pf.PAYLOAD or offset + pf.RECORD_SIZE + length > self.index_offset:
                    continue
                if last is not None and last[0] == ns and last[2] == digest:
                    loc = last[3]
                    last = (ns, last[1], digest, (loc[0], loc[1], max(loc[2], when)))
                    continue
                if last is not None:
                    yield last[1], last[2], last[3]
                last = (ns, ns.rstrip(b"\0").decode("ascii", "replace"), digest,
                        (offset, length, when))
        if last is not None:
            yield last[1], last[2], last[3]

    def sizes(self, read_at: ReadAt, into: dict[bytes, int], differ: set[bytes]) -> None:
        """Add each payload entry's size to ``into`` under its ``sealed_key``, a block at
        a time in one comprehension, and to ``differ`` each key listed with two sizes
        (here or before): ``PackIndex.listing``. Raises ``DamagedIndex``."""
        end, payload, record = self.index_offset, pf.PAYLOAD, pf.RECORD_SIZE
        for block in range(len(self._fence)):
            entries = [(key, length) for kind, key, offset, length, _ in
                       _KEYED.iter_unpack(self._block(block, read_at))
                       if kind == payload and offset + record + length <= end]
            listed = dict(entries)
            if len(listed) != len(entries):
                differ.update(key for key, length in entries if listed[key] != length)
            again = listed.keys() & into.keys()
            if again:
                differ.update(key for key in again if into[key] != listed[key])
            into.update(listed)

    def touches(self, read_at: ReadAt) -> Iterator[tuple[str, bytes, int]]:
        """The (namespace, digest, time) of each touch entry (the pack store keeps the
        latest per key in memory: they are few, one per content put again)."""
        for block in range(len(self._fence)):
            for kind, ns, digest, offset, _, when in \
                    _ENTRY.iter_unpack(self._block(block, read_at)):
                if kind == pf.TOUCH and offset + pf.RECORD_SIZE <= self.index_offset:
                    yield ns.rstrip(b"\0").decode("ascii", "replace"), digest, when

    def nbytes(self) -> int:
        """What this pack's part of the index holds in memory, in bytes (the fence's keys
        as ``bytes`` objects, the CRCs, the filter)."""
        return (len(self._fence) * (_KEY_END - _KEY_AT + 33) + 8 * (len(self._fence) + 1)
                + 4 * len(self._crcs) + 8 * self.words)

    def _block(self, block: int, read_at: ReadAt) -> bytes:
        start = block * self._block_bytes
        length = min(self._block_bytes, self.count * _ENTRY_SIZE - start)
        data = read_at(self.index_offset + start, length)
        if len(data) != length or zlib.crc32(data) != self._crcs[block]:
            raise DamagedIndex(block)
        return data
