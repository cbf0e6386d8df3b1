"""RFC 9162 (Certificate Transparency 2.0) Merkle trees: roots and proof verification.

Leaf hash SHA-256(0x00 || entry), node hash SHA-256(0x01 || left || right), the empty tree's
root SHA-256(""). A tree of n > 1 leaves splits at the largest power of two below n. The
verifiers follow RFC 9162 sections 2.1.3.2 (inclusion) and 2.1.4.2 (consistency) and return
False, never raise, on anything malformed. Written from the RFC, not from evidence's code:
an examiner's check should not inherit the producer's mistakes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from hashlib import sha256

EMPTY_ROOT = sha256(b"").digest()


def leaf_hash(entry: bytes) -> bytes:
    return sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return sha256(b"\x01" + left + right).digest()


class RootsAt:
    """Leaf hashes appended one by one; ``root()`` at the current size, in O(log n)."""

    def __init__(self) -> None:
        self.size = 0
        self._stack: list[tuple[int, bytes]] = []  # perfect subtrees, (leaf count, hash)

    def append(self, leaf: bytes) -> None:
        self.size += 1
        count, value = 1, leaf
        while self._stack and self._stack[-1][0] == count:
            left = self._stack.pop()[1]
            count, value = count * 2, node_hash(left, value)
        self._stack.append((count, value))

    def root(self) -> bytes:
        if not self._stack:
            return EMPTY_ROOT
        value = self._stack[-1][1]
        for _count, left in reversed(self._stack[:-1]):
            value = node_hash(left, value)
        return value


def root(leaves: Iterable[bytes]) -> bytes:
    tree = RootsAt()
    for leaf in leaves:
        tree.append(leaf)
    return tree.root()


def _ok_hashes(values: Iterable[object]) -> bool:
    return all(isinstance(v, bytes) and len(v) == 32 for v in values)


def verify_inclusion(index: int, size: int, leaf: bytes, path: Sequence[bytes],
                     expected_root: bytes) -> bool:
    """RFC 9162 2.1.3.2: does ``path`` lead from leaf ``index`` to the root of ``size``?"""
    if not (isinstance(index, int) and isinstance(size, int) and 0 <= index < size):
        return False
    if not _ok_hashes([leaf, expected_root, *path]):
        return False
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == expected_root


def verify_consistency(old_size: int, new_size: int, old_root: bytes, new_root: bytes,
                       path: Sequence[bytes]) -> bool:
    """RFC 9162 2.1.4.2: is the ``old_size`` tree a prefix of the ``new_size`` tree?

    From size 0 there is nothing to prove: true when ``old_root`` is the empty root and the
    path is empty. Equal sizes: the roots must be equal and the path empty."""
    if not (isinstance(old_size, int) and isinstance(new_size, int)
            and 0 <= old_size <= new_size):
        return False
    if not _ok_hashes([old_root, new_root, *path]):
        return False
    if old_size == 0:
        return not path and old_root == EMPTY_ROOT
    if old_size == new_size:
        return not path and old_root == new_root
    proof = list(path)
    if old_size & (old_size - 1) == 0:  # a power of two: the old root is the first node
        proof.insert(0, old_root)
    if not proof:
        return False
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = proof[0]
    for c in proof[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == old_root and sr == new_root and sn == 0
