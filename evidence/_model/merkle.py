"""The store's tamper evidence: an RFC 9162 (Certificate Transparency 2.0) Merkle tree.

Every accepted message gets a contiguous leaf index and the leaf hash

    leaf_hash(d)       = SHA-256(0x00 || canonical_bytes(d))

Interior nodes are ``SHA-256(0x01 || left || right)``. The two one-byte prefixes keep a
leaf from ever being mistaken for a node (second-preimage resistance). The shape is
RFC 9162 section 2.1.1: a list of n > 1 leaf hashes splits at k, the largest power of two
strictly smaller than n; the first k leaves form the left subtree, the rest the right, each
hashed the same way. One leaf is its own root; the empty tree's root is SHA-256 of the
empty string. This is exactly the RFC 6962 tree, so a third party can check our roots and
proofs with ``sha256sum``-level tools and any CT library, and we test against the published
CT reference vectors. SHA-256 (not the BLAKE3 the payload store uses) is chosen for that
reason alone: the audit trail must be checkable by people who do not trust our code.

The writer keeps a ``CompactTree``: the roots of the perfect subtrees that make up the tree
so far, largest (leftmost) first, one per set bit of ``size``. Appending costs O(1)
amortized hashes, the root O(log n), and ``to_bytes``/``from_bytes`` store and reload it in
a commit-log row. The free functions take the full list of leaf hashes and cost O(n); they
compute roots, inclusion proofs (RFC 9162 2.1.3) and consistency proofs (2.1.4).

Edge cases, decided here once:

* Proof *generators* raise ``ValueError`` for an out-of-range index or size and
  ``TypeError``/``ValueError`` for a leaf hash that is not 32 bytes.
* *Verifiers* never raise: any malformed input (bad sizes, wrong hash length, wrong types,
  a proof of the wrong length) makes them return ``False``.
* Consistency when ``old_size == new_size``: the proof is empty and the roots must be equal.
* Consistency from ``old_size == 0``: RFC 9162 only defines proofs for 0 < m < n. The empty
  tree is a prefix of every tree, so there is nothing to prove: ``consistency_proof(0, ...)``
  returns ``[]`` and ``verify_consistency(0, n, old, new, [])`` is true exactly when ``old``
  is the empty-tree hash (and, for n == 0, ``new`` is too). It says nothing about ``new``.
* A verified inclusion proof binds (index, size, root) only together: for some sizes the
  proof shape is identical (leaf 0 of a 5- and a 6-leaf tree), so the size must come from
  the same signed checkpoint as the root, never from the proof's sender alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from hashlib import sha256
from typing import TypeGuard

__all__ = [
    "EMPTY_ROOT",
    "HASH_SIZE",
    "CompactTree",
    "consistency_proof",
    "inclusion_proof",
    "leaf_hash",
    "leaf_hashes",
    "level_above",
    "node_hash",
    "root",
    "verify_consistency",
    "verify_inclusion",
]

HASH_SIZE = 32
EMPTY_ROOT = sha256(b"").digest()
"""MTH({}) — the root of the empty tree, SHA-256 of the empty string."""

_LEAF_PREFIX = b"\x00"
_NODE_PREFIX = b"\x01"


_LEAF_SEED = sha256(_LEAF_PREFIX)  # copied for each leaf: cheaper than a new one fed 0x00
try:  # CPython's own SHA-256: for a node's 65 bytes, a third cheaper a call than OpenSSL's
    from _sha256 import sha256 as _small_sha256
except ImportError:  # pragma: no cover - another Python (3.12 names it _sha2)
    _small_sha256 = sha256


def leaf_hash(data: bytes) -> bytes:
    """``SHA-256(0x00 || data)``: the hash of one leaf's canonical bytes."""
    h = _LEAF_SEED.copy()
    h.update(data)
    return h.digest()


def leaf_hashes(datas: Iterable[bytes]) -> list[bytes]:
    """``leaf_hash`` of each, in order: a whole chunk of a log in one call."""
    begun, leaves = _LEAF_SEED.copy, []
    for data in datas:
        h = begun()
        h.update(data)
        leaves.append(h.digest())
    return leaves


def level_above(nodes: Sequence[bytes]) -> list[bytes]:
    """The node hashes over each pair of ``nodes`` (one level up a perfect subtree; an odd
    last one has no pair and is left out)."""
    return [_small_sha256(_NODE_PREFIX + left + right).digest()
            for left, right in zip(nodes[0::2], nodes[1::2], strict=False)]


def node_hash(left: bytes, right: bytes) -> bytes:
    """``SHA-256(0x01 || left || right)``: the hash of an interior node."""
    return _node(_check_hash(left, "left"), _check_hash(right, "right"))


def _node(left: bytes, right: bytes) -> bytes:
    node: bytes = _small_sha256(_NODE_PREFIX + left + right).digest()
    return node


def _is_hash(value: object) -> bool:
    return isinstance(value, bytes | bytearray) and len(value) == HASH_SIZE


def _is_size(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_hash(value: object, what: str) -> bytes:
    if not isinstance(value, bytes | bytearray):
        raise TypeError(f"{what} must be bytes, not {type(value).__name__}")
    if len(value) != HASH_SIZE:
        raise ValueError(f"{what} must be {HASH_SIZE} bytes, got {len(value)}")
    return bytes(value)


def _check_leaves(leaves: Sequence[bytes]) -> None:
    for i, h in enumerate(leaves):
        if not _is_hash(h):
            _check_hash(h, f"leaf hash {i}")


def _check_size(value: object, what: str) -> int:
    if not _is_size(value):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    return value


def _split(n: int) -> int:
    """The largest power of two strictly smaller than ``n`` (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def _fold(frontier: Sequence[bytes]) -> bytes:
    """Root of a tree given its perfect-subtree roots, largest first."""
    if not frontier:
        return EMPTY_ROOT
    r = frontier[-1]
    for h in reversed(frontier[:-1]):
        r = _node(h, r)
    return r


def _range_root(leaves: Sequence[bytes], lo: int, hi: int) -> bytes:
    """MTH(leaves[lo:hi]) in O(hi - lo) hashes and O(log n) memory, without slicing.

    Leaves are pushed on a stack of perfect-subtree roots; after the c-th leaf, as many
    merges happen as c has trailing zero bits. Folding the stack right to left gives the
    RFC 9162 shape (the split at the largest power of two is the leftmost perfect subtree).
    """
    stack: list[bytes] = []
    for i in range(lo, hi):
        h = leaves[i]
        c = i - lo + 1
        while not c & 1:
            h = _node(stack.pop(), h)
            c >>= 1
        stack.append(bytes(h))
    return _fold(stack)


def root(leaves: Sequence[bytes]) -> bytes:
    """MTH over a list of *leaf hashes* (not raw data); O(n)."""
    _check_leaves(leaves)
    return _range_root(leaves, 0, len(leaves))


class CompactTree:
    """The incremental tree: ``size`` and the roots of its perfect subtrees, largest first.

    There is one root per set bit of ``size`` (a 6-leaf tree keeps MTH(0:4) and MTH(4:6)),
    so the state is at most 64 hashes for any realistic log and reloads in O(log n).
    """

    __slots__ = ("_frontier", "_size")

    def __init__(self) -> None:
        self._frontier: list[bytes] = []
        self._size = 0

    @property
    def size(self) -> int:
        """How many leaves have been appended."""
        return self._size

    @property
    def frontier(self) -> tuple[bytes, ...]:
        """The perfect-subtree roots, leftmost (largest) first."""
        return tuple(self._frontier)

    def append(self, leaf_hash: bytes) -> int:
        """Append one leaf hash; return its leaf index."""
        h = _check_hash(leaf_hash, "leaf hash")
        index = self._size
        n = index
        while n & 1:
            h = _node(self._frontier.pop(), h)
            n >>= 1
        self._frontier.append(h)
        self._size = index + 1
        return index

    def append_digest(self, digest: bytes) -> None:
        """``append`` of a leaf hash that is a SHA-256 digest just computed (so 32 bytes,
        immutable): the same tree, without checking it (``check_log``'s loop, once per
        ledger entry)."""
        n = self._size
        self._size = n + 1
        frontier = self._frontier
        while n & 1:
            digest = sha256(_NODE_PREFIX + frontier.pop() + digest).digest()
            n >>= 1
        frontier.append(digest)

    def extend(self, leaf_hashes: Iterable[bytes]) -> None:
        """Append each leaf hash in order."""
        for h in leaf_hashes:
            self.append(h)

    def root(self) -> bytes:
        """MTH of every leaf appended so far (``EMPTY_ROOT`` for none)."""
        return _fold(self._frontier)

    def copy(self) -> CompactTree:
        """An independent copy (appending to it leaves this tree alone)."""
        other = CompactTree()
        other._frontier = list(self._frontier)
        other._size = self._size
        return other

    def to_bytes(self) -> bytes:
        """The frontier as concatenated 32-byte hashes; store it with ``size``."""
        return b"".join(self._frontier)

    @classmethod
    def from_bytes(cls, size: int, blob: bytes) -> CompactTree:
        """Reload what ``to_bytes`` produced; ``ValueError`` if ``blob`` cannot be it."""
        _check_size(size, "size")
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        if not isinstance(blob, bytes | bytearray | memoryview):
            raise TypeError(f"blob must be bytes, not {type(blob).__name__}")
        blob = bytes(blob)
        expected = HASH_SIZE * size.bit_count()
        if len(blob) != expected:
            raise ValueError(f"a compact tree of size {size} is {expected} bytes, got {len(blob)}")
        tree = cls()
        tree._frontier = [blob[i : i + HASH_SIZE] for i in range(0, expected, HASH_SIZE)]
        tree._size = size
        return tree

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CompactTree):
            return NotImplemented
        return self._size == other._size and self._frontier == other._frontier

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"CompactTree(size={self._size}, root={self.root().hex()})"


def inclusion_proof(index: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PATH(index, leaves), RFC 9162 2.1.3.1: sibling hashes from the leaf up to the root."""
    _check_size(index, "index")
    n = len(leaves)
    if not 0 <= index < n:
        raise ValueError(f"leaf index {index} is not in a tree of size {n}")
    _check_leaves(leaves)
    path: list[bytes] = []  # collected root-first, returned leaf-first
    lo, hi = 0, n
    while hi - lo > 1:
        k = _split(hi - lo)
        if index < lo + k:
            path.append(_range_root(leaves, lo + k, hi))
            hi = lo + k
        else:
            path.append(_range_root(leaves, lo, lo + k))
            lo += k
    path.reverse()
    return path


def verify_inclusion(
    index: int, size: int, leaf_hash: bytes, proof: Iterable[bytes], root: bytes
) -> bool:
    """RFC 9162 2.1.3.2: is ``leaf_hash`` leaf ``index`` of the ``size``-leaf tree ``root``?

    Never raises; any malformed argument gives ``False``.
    """
    if not (_is_size(index) and _is_size(size) and 0 <= index < size):
        return False
    if not (_is_hash(leaf_hash) and _is_hash(root)):
        return False
    try:
        path = list(proof)
    except TypeError:
        return False
    fn, sn = index, size - 1
    r = bytes(leaf_hash)
    for p in path:
        if sn == 0 or not _is_hash(p):
            return False
        if fn & 1 or fn == sn:
            r = _node(p, r)
            while fn and not fn & 1:
                fn >>= 1
                sn >>= 1
        else:
            r = _node(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def consistency_proof(old_size: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PROOF(old_size, leaves), RFC 9162 2.1.4.1; empty for old_size 0 or len(leaves)."""
    _check_size(old_size, "old_size")
    n = len(leaves)
    if not 0 <= old_size <= n:
        raise ValueError(f"old size {old_size} is not in 0..{n}")
    _check_leaves(leaves)
    if old_size in (0, n):
        return []
    # SUBPROOF(m, D[lo:hi], b), unrolled: siblings are collected root-first.
    path: list[bytes] = []
    lo, hi, m, whole = 0, n, old_size, True
    while m != hi - lo:
        k = _split(hi - lo)
        if m <= k:
            path.append(_range_root(leaves, lo + k, hi))
            hi = lo + k
        else:
            path.append(_range_root(leaves, lo, lo + k))
            lo, m, whole = lo + k, m - k, False
    if not whole:
        path.append(_range_root(leaves, lo, hi))
    path.reverse()
    return path


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Iterable[bytes]
) -> bool:
    """RFC 9162 2.1.4.2: is the ``old_size`` tree ``old_root`` a prefix of ``new_root``?

    Never raises; any malformed argument gives ``False``. See the module docstring for
    ``old_size == new_size`` and ``old_size == 0``.
    """
    if not (_is_size(old_size) and _is_size(new_size) and 0 <= old_size <= new_size):
        return False
    if not (_is_hash(old_root) and _is_hash(new_root)):
        return False
    try:
        path = list(proof)
    except TypeError:
        return False
    if old_size == 0:
        return not path and old_root == EMPTY_ROOT and (new_size > 0 or new_root == EMPTY_ROOT)
    if old_size == new_size:
        return not path and old_root == new_root
    if not path:
        return False
    if old_size & (old_size - 1) == 0:  # a power of two: the old root is a node of the new tree
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    if not _is_hash(path[0]):
        return False
    fr = sr = bytes(path[0])
    for c in path[1:]:
        if sn == 0 or not _is_hash(c):
            return False
        if fn & 1 or fn == sn:
            fr = _node(c, fr)
            sr = _node(c, sr)
            while fn and not fn & 1:
                fn >>= 1
                sn >>= 1
        else:
            sr = _node(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == old_root and sr == new_root
