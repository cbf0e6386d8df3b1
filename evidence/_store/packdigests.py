"""The pack store's digest index, held compact: ``DigestIndex``.

A pack store finds a payload by (namespace, BLAKE3 digest): a put deduplicates against it,
a read, a check or a sync goes straight to the record it names. A dict of dicts holding a
bytes key and a tuple of four ints per payload cost about 200 bytes a payload, three
payloads a crawled page: what grew with every page of a crawl once the writer's caches
were full (issue 35; docs/benchmarks.md, "Memory over a crawl"). This module keeps the
same map in columns of machine integers (``array``): the digest as four 64-bit words, the
namespace as a small number, and the location's four numbers, 62 bytes a payload and no
Python object per payload.

Two parts. The *base*: every entry but the newest, sorted by the digest's first word, one
``array`` per column; a lookup bisects the first word's column (``bisect`` over an
``array``: C speed) and compares the other words of the few entries sharing it. The
*recent* entries: a dict, merged into the base once it holds ``RECENT`` entries or a
sixteenth of the base, whichever is more (so each entry is copied about 16 times per
doubling of the base, at C speed, and the dict adds at most ~20 bytes a payload on
average). Removing an entry from the base marks it (pack number 0: pack numbers start at
1); the next merge drops it.

Invariants: a key is live in one part at most; the base is sorted by the digest's first
word; the map answers exactly what a dict would (tests/test_packdigests.py compares it
with one over any sequence of operations). Each operation holds the index's own lock: a
dict's lookup was atomic and the pack store looks up without its lock (a put on one
thread while the writer's sync looks up on another), where a lookup here reads several
columns that a merge or an update changes one at a time.
"""

from __future__ import annotations

import threading
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from itertools import compress

__all__ = ["BYTES_PER_ENTRY", "RECENT", "DigestIndex", "Location"]

Location = tuple[int, int, int, int]  # (pack number, record offset, payload length, time ms)

RECENT = 4096  # recent entries merged into the base at least (a small base: at this many)
_SHARE = 16  # ... or at a sixteenth of the base, when that is more

# The base's columns: the digest's four words (big-endian: their order is the bytes'),
# the namespace's number, then the location.
_TYPECODES = ("Q", "Q", "Q", "Q", "H", "I", "Q", "Q", "Q")
_HEAD, _W1, _W2, _W3, _SPACE, _PACK, _OFFSET, _LENGTH, _TIME = range(9)
BYTES_PER_ENTRY = sum(array(code).itemsize for code in _TYPECODES)  # 62


def _words(digest: bytes) -> tuple[int, int, int, int]:
    return (int.from_bytes(digest[0:8], "big"), int.from_bytes(digest[8:16], "big"),
            int.from_bytes(digest[16:24], "big"), int.from_bytes(digest[24:32], "big"))


def _digest(w0: int, w1: int, w2: int, w3: int) -> bytes:
    return b"".join(w.to_bytes(8, "big") for w in (w0, w1, w2, w3))


class DigestIndex:
    """(namespace, digest) -> ``Location``, in about 62 bytes an entry (see the module's
    docstring). The operations a dict has, by key: ``get``, ``set`` (``add`` when ``get``
    just said it is absent), ``pop``; and ``items``, ``in_pack``, ``len``, ``compact``."""

    def __init__(self, *, recent: int = RECENT) -> None:
        if type(recent) is not int or recent < 1:
            raise ValueError(f"recent must be a positive int, not {recent!r}")
        self._most = recent
        self._recent: dict[tuple[str, bytes], Location] = {}
        self._cols = [array(code) for code in _TYPECODES]
        self._heads = self._cols[_HEAD]
        self._dead = 0  # base entries marked removed
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
            return None if i < 0 else self._location(i)

    def set(self, namespace: str, digest: bytes, loc: Location) -> None:
        with self._mutex:
            key = (namespace, digest)
            if key not in self._recent:
                i = self._find(namespace, digest)
                if i >= 0:
                    cols = self._cols
                    cols[_PACK][i], cols[_OFFSET][i], cols[_LENGTH][i], cols[_TIME][i] = loc
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
            loc = self._location(i)
            self._cols[_PACK][i] = 0
            self._dead += 1
            return loc

    def items(self) -> Iterator[tuple[str, bytes, Location]]:
        """Every (namespace, digest, location), as they were when asked (the columns
        copied: a memory copy, no object per entry until each is yielded)."""
        with self._mutex:
            recent = list(self._recent.items())
            cols = [array(col.typecode, col) for col in self._cols]
            names = list(self._names)
        for (namespace, digest), loc in recent:
            yield namespace, digest, loc
        for row in zip(*cols, strict=True):
            if row[_PACK]:
                yield (names[row[_SPACE]], _digest(*row[_HEAD:_SPACE]),
                       row[_PACK:])

    def in_pack(self, pack: int) -> list[tuple[str, bytes, Location]]:
        """The entries located in pack number ``pack`` (a pack is forgotten, poisoned)."""
        with self._mutex:
            found = [(ns, d, loc) for (ns, d), loc in self._recent.items() if loc[0] == pack]
            cols, packs = self._cols, self._cols[_PACK]
            i = -1
            for _ in range(packs.count(pack) if pack else 0):
                i = packs.index(pack, i + 1)
                found.append((self._names[cols[_SPACE][i]],
                              _digest(cols[_HEAD][i], cols[_W1][i], cols[_W2][i],
                                      cols[_W3][i]), self._location(i)))
            return found

    def nbytes(self) -> int:
        """The base's columns, in bytes (the recent entries' dict not counted)."""
        with self._mutex:
            return sum(col.itemsize * len(col) for col in self._cols)

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
        whole (``frombytes``: a memory copy), one column at a time, so a merge costs a
        few calls per recent entry and one copy of the base."""
        rows = []
        for (namespace, digest), loc in self._recent.items():
            space = self._spaces.get(namespace)
            if space is None:
                space = self._spaces[namespace] = len(self._names)
                self._names.append(namespace)
            rows.append((*_words(digest), space, *loc))
        self._recent = {}
        if self._dead:
            self._drop_dead()
        rows.sort()  # by the digest's first word (a key is there once: no ties after it)
        heads = self._heads
        places = [bisect_left(heads, row[_HEAD]) for row in rows]
        cols = self._cols
        for c, col in enumerate(cols):
            width, merged, start = col.itemsize, array(col.typecode), 0
            with memoryview(col).cast("B") as view:
                for place, row in zip(places, rows, strict=True):
                    merged.frombytes(view[start * width:place * width])
                    merged.append(row[c])
                    start = place
                merged.frombytes(view[start * width:])
            cols[c] = merged  # the old column freed before the next is built
            del col
        self._heads = cols[_HEAD]

    def _drop_dead(self) -> None:
        """The base without the entries marked removed (rare: a pack forgotten or
        poisoned, a payload reclaimed)."""
        cols = self._cols
        live = array("b", (p != 0 for p in cols[_PACK]))
        for c, col in enumerate(cols):
            cols[c] = array(col.typecode, compress(col, live))
            del col
        self._heads = cols[_HEAD]
        self._dead = 0

    def _find(self, namespace: str, digest: bytes) -> int:
        """The base's position of the live entry for the key, or -1."""
        heads = self._heads
        head = int.from_bytes(digest[:8], "big")
        i = bisect_left(heads, head)
        if i == len(heads) or heads[i] != head:
            return -1  # most lookups: a new payload's digest
        space = self._spaces.get(namespace)
        cols, rest = self._cols, _words(digest)[1:]
        while i < len(heads) and heads[i] == head:
            if cols[_PACK][i] and (cols[_W1][i], cols[_W2][i], cols[_W3][i]) == rest \
                    and cols[_SPACE][i] == space:
                return i
            i += 1
        return -1

    def _location(self, i: int) -> Location:
        cols = self._cols
        return (cols[_PACK][i], cols[_OFFSET][i], cols[_LENGTH][i], cols[_TIME][i])
