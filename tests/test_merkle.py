"""Tests for evidence._model.merkle: published CT vectors, an independent RFC transcription, and
Hypothesis properties over random trees (every index, every old size, every mutation)."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence._model.merkle import (
    EMPTY_ROOT,
    HASH_SIZE,
    CompactTree,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root,
    verify_consistency,
    verify_inclusion,
)

# ---------------------------------------------------------------------------------------
# Published reference data: the certificate-transparency test vectors (the same values are
# in google/certificate-transparency's C++ tests and transparency-dev/merkle's
# testonly/constants.go and proof/verify_test.go). Indices below are 0-based.

H = bytes.fromhex

CT_INPUTS = [
    H(x)
    for x in (
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    )
]

CT_ROOTS = [  # CT_ROOTS[n] is the root of the first n inputs
    H("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    H("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"),
    H("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"),
    H("aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77"),
    H("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
    H("4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4"),
    H("76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef"),
    H("ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c"),
    H("5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"),
]

# Every perfect-subtree hash of the 8-leaf tree: CT_NODES[level][position].
CT_NODES = [
    [
        H("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"),
        H("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"),
        H("0298d122906dcfc10892cb53a73992fc5b9f493ea4c9badb27b791b4127a7fe7"),
        H("07506a85fd9dd2f120eb694f86011e5bb4662e5c415a62917033d4a9624487e7"),
        H("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
        H("4271a26be0d8a84f0bd54c8c302e7cb3a3b5d1fa6780a40bcce2873477dab658"),
        H("b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f"),
        H("46f6ffadd3d06a09ff3c5860d2755c8b9819db7df44251788c7d8e3180de8eb1"),
    ],
    [
        H("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"),
        H("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
        H("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
        H("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
    ],
    [
        H("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        H("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
    ],
    [H("5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328")],
]
N0, N1, N2, N3 = CT_NODES
CT_FRONTIERS = [  # the compact range of each size 0..8
    [],
    [N0[0]],
    [N1[0]],
    [N1[0], N0[2]],
    [N2[0]],
    [N2[0], N0[4]],
    [N2[0], N1[2]],
    [N2[0], N1[2], N0[6]],
    [N3[0]],
]

CT_INCLUSION = [  # (index, size, proof)
    (0, 1, []),
    (0, 8, [N0[1], N1[1], N2[1]]),
    (5, 8, [N0[4], N1[3], N2[0]]),
    (2, 3, [N1[0]]),
    (1, 5, [N0[0], N1[1], N0[4]]),
]

CT_CONSISTENCY = [  # (old_size, new_size, proof)
    (1, 1, []),
    (1, 8, [N0[1], N1[1], N2[1]]),
    (6, 8, [N1[2], N1[3], N2[0]]),
    (2, 5, [N1[1], N0[4]]),
    (6, 7, [N1[2], N0[6], N2[0]]),
]

CT_LEAVES = [leaf_hash(x) for x in CT_INPUTS]


def test_empty_root_is_sha256_of_nothing():
    assert EMPTY_ROOT == CT_ROOTS[0] == hashlib.sha256(b"").digest()
    assert root([]) == EMPTY_ROOT
    assert CompactTree().root() == EMPTY_ROOT


def test_leaf_hashes_match_published_level_zero():
    assert CT_LEAVES == N0


@pytest.mark.parametrize("n", range(9))
def test_roots_match_published_vectors(n):
    assert root(CT_LEAVES[:n]) == CT_ROOTS[n]
    tree = CompactTree()
    tree.extend(CT_LEAVES[:n])
    assert tree.root() == CT_ROOTS[n]
    assert list(tree.frontier) == CT_FRONTIERS[n]
    assert tree.to_bytes() == b"".join(CT_FRONTIERS[n])


@pytest.mark.parametrize("n", range(9))
def test_append_digest_builds_the_published_trees(n):
    tree = CompactTree()
    for leaf in CT_LEAVES[:n]:
        tree.append_digest(leaf)
    assert (tree.size, tree.root(), list(tree.frontier)) == (n, CT_ROOTS[n], CT_FRONTIERS[n])


@given(st.lists(st.binary(min_size=32, max_size=32), max_size=70))
def test_any_sequence_of_digests_appended_unchecked_makes_the_same_tree(leaves):
    checked, unchecked = CompactTree(), CompactTree()
    for leaf in leaves:
        checked.append(leaf)
        unchecked.append_digest(leaf)
        assert (unchecked.size, unchecked.root(), unchecked.to_bytes()) == (
            checked.size, checked.root(), checked.to_bytes())


def test_interior_nodes_match_published_vectors():
    for level in range(1, 4):
        for pos, expected in enumerate(CT_NODES[level]):
            left, right = CT_NODES[level - 1][2 * pos : 2 * pos + 2]
            assert node_hash(left, right) == expected


@pytest.mark.parametrize(("index", "size", "proof"), CT_INCLUSION)
def test_inclusion_matches_published_vectors(index, size, proof):
    leaves = CT_LEAVES[:size]
    assert inclusion_proof(index, leaves) == proof
    assert verify_inclusion(index, size, leaves[index], proof, CT_ROOTS[size])


@pytest.mark.parametrize(("old", "new", "proof"), CT_CONSISTENCY)
def test_consistency_matches_published_vectors(old, new, proof):
    assert consistency_proof(old, CT_LEAVES[:new]) == proof
    assert verify_consistency(old, new, CT_ROOTS[old], CT_ROOTS[new], proof)


# ---------------------------------------------------------------------------------------
# An independent, literal transcription of the RFC 9162 recursive definitions (slicing,
# recursion, hashlib directly) to hold the iterative implementation to.


def _sha(b: bytes) -> bytes:
    return hashlib.sha256(b).digest()


def _ref_node(left: bytes, right: bytes) -> bytes:
    return _sha(b"\x01" + left + right)


def _ref_k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def ref_mth(d: list[bytes]) -> bytes:
    if not d:
        return _sha(b"")
    if len(d) == 1:
        return d[0]
    k = _ref_k(len(d))
    return _ref_node(ref_mth(d[:k]), ref_mth(d[k:]))


def ref_path(m: int, d: list[bytes]) -> list[bytes]:
    if len(d) == 1:
        return []
    k = _ref_k(len(d))
    if m < k:
        return [*ref_path(m, d[:k]), ref_mth(d[k:])]
    return [*ref_path(m - k, d[k:]), ref_mth(d[:k])]


def ref_subproof(m: int, d: list[bytes], b: bool) -> list[bytes]:
    if m == len(d):
        return [] if b else [ref_mth(d)]
    k = _ref_k(len(d))
    if m <= k:
        return [*ref_subproof(m, d[:k], b), ref_mth(d[k:])]
    return [*ref_subproof(m - k, d[k:], False), ref_mth(d[:k])]


def _incl_sides(m: int, n: int) -> list[bool]:
    """For PATH(m, D[n]), leaf first: True where the proof element is the right child."""
    if n == 1:
        return []
    k = _ref_k(n)
    return [*_incl_sides(m, k), True] if m < k else [*_incl_sides(m - k, n - k), False]


def ref_verify_inclusion(i, n, leaf, proof, rt) -> bool:
    """Valid iff the RFC definition of PATH(i, D[n]) rebuilds ``rt`` from ``proof``."""
    if not 0 <= i < n:
        return False
    sides = _incl_sides(i, n)
    if len(proof) != len(sides):
        return False
    r = leaf
    for p, right in zip(proof, sides, strict=True):
        r = _ref_node(r, p) if right else _ref_node(p, r)
    return r == rt


def _cons_shape(m: int, n: int, b: bool):
    """(proof length, old-root expression, new-root expression) of SUBPROOF(m, D[n], b);
    expressions are "old", ("p", j) for proof element j, or ("n", left, right)."""
    if m == n:
        return (0, "old", "old") if b else (1, ("p", 0), ("p", 0))
    k = _ref_k(n)
    if m <= k:
        ln, old, new = _cons_shape(m, k, b)
        return ln + 1, old, ("n", new, ("p", ln))
    ln, old, new = _cons_shape(m - k, n - k, False)
    return ln + 1, ("n", ("p", ln), old), ("n", ("p", ln), new)


def _eval(e, proof, old_root):
    if e == "old":
        return old_root
    if e[0] == "p":
        return proof[e[1]]
    return _ref_node(_eval(e[1], proof, old_root), _eval(e[2], proof, old_root))


def ref_verify_consistency(m, n, old_root, new_root, proof) -> bool:
    """Valid iff the RFC definition of PROOF(m, D[n]) rebuilds both roots from ``proof``
    (plus the module's documented rules for m == 0 and m == n)."""
    if not 0 <= m <= n:
        return False
    if m == 0:
        return not proof and old_root == EMPTY_ROOT and (n > 0 or new_root == EMPTY_ROOT)
    if m == n:
        return not proof and old_root == new_root
    ln, old, new = _cons_shape(m, n, True)
    if len(proof) != ln:
        return False
    return _eval(old, proof, old_root) == old_root and _eval(new, proof, old_root) == new_root


def test_reference_transcription_agrees_with_published_vectors():
    for n in range(9):
        assert ref_mth(CT_LEAVES[:n]) == CT_ROOTS[n]
    for i, n, proof in CT_INCLUSION:
        assert ref_path(i, CT_LEAVES[:n]) == proof
    for m, n, proof in CT_CONSISTENCY[1:]:
        assert ref_subproof(m, CT_LEAVES[:n], True) == proof


def _leaves(n: int, seed: bytes = b"") -> list[bytes]:
    return [leaf_hash(seed + i.to_bytes(4, "big")) for i in range(n)]


def test_exhaustively_matches_reference_up_to_40_leaves():
    leaves = _leaves(40, b"exhaustive")
    for n in range(1, 41):
        d = leaves[:n]
        assert root(d) == ref_mth(d)
        for i in range(n):
            assert inclusion_proof(i, d) == ref_path(i, d)
        for m in range(1, n + 1):
            assert consistency_proof(m, d) == ref_subproof(m, d, True)


def test_large_power_of_two_boundaries():
    leaves = _leaves(4097, b"big")
    tree = CompactTree()
    tree.extend(leaves[:4096])
    assert tree.root() == root(leaves[:4096]) == ref_mth(leaves[:4096])
    tree.append(leaves[4096])
    assert tree.root() == root(leaves) == ref_mth(leaves)
    assert len(tree.frontier) == 2


# ---------------------------------------------------------------------------------------
# Hypothesis properties.

SEEDS = st.binary(max_size=8)


def _flip(h: bytes, bit: int = 0) -> bytes:
    return bytes([h[0] ^ (1 << bit)]) + h[1:]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 300), seed=SEEDS)
def test_compact_tree_matches_root_at_every_size(n, seed):
    leaves = _leaves(n, seed)
    tree = CompactTree()
    assert tree.size == 0
    for i, h in enumerate(leaves):
        assert tree.append(h) == i
        assert tree.size == i + 1
        assert len(tree.frontier) == (i + 1).bit_count()
        if i % 17 == 0 or i == n - 1:
            assert tree.root() == root(leaves[: i + 1])
        blob = tree.to_bytes()
        assert len(blob) == HASH_SIZE * (i + 1).bit_count()
        again = CompactTree.from_bytes(tree.size, blob)
        assert again == tree
        assert again.root() == tree.root()
    assert tree.root() == root(leaves)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 300), seed=SEEDS)
def test_compact_tree_copy_and_equality(n, seed):
    leaves = _leaves(n + 1, seed)
    tree = CompactTree()
    tree.extend(leaves[:n])
    twin = tree.copy()
    assert twin == tree and twin is not tree
    twin.append(leaves[n])
    assert twin != tree
    assert tree.size == n and tree.root() == root(leaves[:n])
    assert twin.root() == root(leaves)
    reloaded = CompactTree.from_bytes(n, bytearray(tree.to_bytes()))
    reloaded.append(leaves[n])
    assert reloaded == twin
    assert tree != CompactTree.from_bytes(0, b"")
    assert tree != object()


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 300), seed=SEEDS)
def test_every_inclusion_proof_verifies_and_every_mutation_fails(n, seed):
    leaves = _leaves(n, seed)
    rt = root(leaves)
    other_roots = [EMPTY_ROOT, _flip(rt), root(leaves[:-1]), root([*leaves, leaves[0]])]
    for i in range(n):
        proof = inclusion_proof(i, leaves)
        leaf = leaves[i]
        assert verify_inclusion(i, n, leaf, proof, rt)
        assert verify_inclusion(i, n, bytearray(leaf), tuple(proof), bytearray(rt))
        # Any single mutated proof element.
        for j in range(len(proof)):
            for bit in (0, 7):
                bad = list(proof)
                bad[j] = _flip(bad[j], bit)
                assert not verify_inclusion(i, n, leaf, bad, rt)
            assert not verify_inclusion(i, n, leaf, proof[:j] + proof[j + 1 :], rt)
            assert not verify_inclusion(i, n, leaf, [*proof[:j], rt, *proof[j:]], rt)
        # Extra or missing elements, wrong leaf, wrong root.
        assert not verify_inclusion(i, n, leaf, [*proof, rt], rt)
        assert not verify_inclusion(i, n, leaf, [leaf, *proof], rt)
        assert not verify_inclusion(i, n, _flip(leaf), proof, rt)
        assert not verify_inclusion(i, n, leaves[(i + 1) % n], proof, rt) or n == 1
        for wrong in other_roots:
            assert not verify_inclusion(i, n, leaf, proof, wrong)
        # Wrong index: another position of the same tree never has the same path.
        for j in {i - 1, i + 1, i ^ 1, i ^ 2, n - 1 - i, n, -1} - {i}:
            assert not verify_inclusion(j, n, leaf, proof, rt)
        # Wrong size: fails unless the RFC gives (i, s) exactly the same path shape as
        # (i, n), in which case no verifier can tell (see the test below).
        for s in {n - 1, n + 1, 2 * n, n // 2, i, i + 1, 0} - {n}:
            got = verify_inclusion(i, s, leaf, proof, rt)
            assert got == ref_verify_inclusion(i, s, leaf, proof, rt)
            assert got == (s > i and _incl_sides(i, s) == _incl_sides(i, n))
        assert not verify_inclusion(i, 2 * n, leaf, proof, rt)


def test_inclusion_binds_size_only_together_with_root():
    # Leaf 0 has the same path shape in trees of 5 and 6 leaves: a proof against the
    # 5-leaf root also "verifies" when the caller claims size 6. The size must come from
    # the same signed checkpoint as the root.
    leaves = _leaves(6, b"shape")
    proof5 = inclusion_proof(0, leaves[:5])
    root5 = root(leaves[:5])
    assert verify_inclusion(0, 5, leaves[0], proof5, root5)
    assert verify_inclusion(0, 6, leaves[0], proof5, root5)
    assert not verify_inclusion(0, 6, leaves[0], proof5, root(leaves))


@pytest.mark.slow
@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 300), seed=SEEDS)
def test_every_consistency_proof_verifies_and_every_mutation_fails(n, seed):
    leaves = _leaves(n, seed)
    tree = CompactTree()
    roots = [tree.root()]
    for h in leaves:
        tree.append(h)
        roots.append(tree.root())
    new = roots[n]
    assert verify_consistency(0, n, EMPTY_ROOT, new, consistency_proof(0, leaves))
    for m in range(1, n + 1):
        old = roots[m]
        proof = consistency_proof(m, leaves)
        assert verify_consistency(m, n, old, new, proof)
        assert verify_consistency(m, n, bytearray(old), bytearray(new), tuple(proof))
        if m == n:
            assert proof == []
            assert not verify_consistency(m, n, old, new, [old])
            assert not verify_consistency(m, n, old, _flip(new), proof)
            continue
        # Any single mutated element, dropped element or inserted element.
        for j in range(len(proof)):
            for bit in (0, 7):
                bad = list(proof)
                bad[j] = _flip(bad[j], bit)
                assert not verify_consistency(m, n, old, new, bad)
            assert not verify_consistency(m, n, old, new, proof[:j] + proof[j + 1 :])
            assert not verify_consistency(m, n, old, new, [*proof[:j], old, *proof[j:]])
        for extra in (old, new, proof[0], proof[-1]):
            assert not verify_consistency(m, n, old, new, [*proof, extra])
            assert not verify_consistency(m, n, old, new, [extra, *proof])
        assert not verify_consistency(m, n, old, new, [])
        # Wrong roots.
        assert not verify_consistency(m, n, _flip(old), new, proof)
        assert not verify_consistency(m, n, old, _flip(new), proof)
        assert not verify_consistency(m, n, new, old, proof)
        assert not verify_consistency(m, n, roots[m - 1], new, proof)
        assert not verify_consistency(m, n, old, roots[n - 1], proof)
        # Wrong sizes: fail unless the RFC proof for the claimed sizes has exactly the same
        # shape, so that the same hashes rebuild the same two roots.
        wrong_sizes = {(m - 1, n), (m + 1, n), (m ^ 2, n), (m, n + 1), (m, 2 * n)}
        wrong_sizes |= {(m, n - 1), (m, n // 2), (n, m), (0, n)}
        for m2, n2 in wrong_sizes - {(m, n)}:
            got = verify_consistency(m2, n2, old, new, proof)
            assert got == ref_verify_consistency(m2, n2, old, new, proof)
        assert not verify_consistency(m, 2 * n, old, new, proof)


# ---------------------------------------------------------------------------------------
# Edge cases and malformed input.


def test_consistency_edge_cases():
    leaves = _leaves(5)
    r5 = root(leaves)
    assert consistency_proof(0, leaves) == []
    assert consistency_proof(5, leaves) == []
    assert consistency_proof(0, []) == []
    assert verify_consistency(0, 0, EMPTY_ROOT, EMPTY_ROOT, [])
    assert not verify_consistency(0, 0, EMPTY_ROOT, r5, [])
    assert verify_consistency(0, 5, EMPTY_ROOT, r5, [])
    assert not verify_consistency(0, 5, r5, r5, [])  # the old root must be the empty tree's
    assert not verify_consistency(0, 5, EMPTY_ROOT, r5, [r5])
    assert verify_consistency(5, 5, r5, r5, [])
    assert not verify_consistency(5, 5, r5, EMPTY_ROOT, [])
    assert not verify_consistency(5, 4, r5, r5, [])  # shrinking
    assert not verify_consistency(2, 1, r5, r5, [r5])


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: inclusion_proof(-1, _leaves(3)), ValueError),
        (lambda: inclusion_proof(3, _leaves(3)), ValueError),
        (lambda: inclusion_proof(0, []), ValueError),
        (lambda: inclusion_proof(True, _leaves(3)), TypeError),
        (lambda: inclusion_proof(0, [b"short"]), ValueError),
        (lambda: inclusion_proof(0, ["x" * 32]), TypeError),
        (lambda: consistency_proof(-1, _leaves(3)), ValueError),
        (lambda: consistency_proof(4, _leaves(3)), ValueError),
        (lambda: consistency_proof(1, []), ValueError),
        (lambda: consistency_proof(1.0, _leaves(3)), TypeError),
        (lambda: consistency_proof(1, [*_leaves(2), b"\0" * 33]), ValueError),
        (lambda: root([b"\0" * 31]), ValueError),
        (lambda: root([None]), TypeError),
        (lambda: node_hash(b"\0" * 32, b"\0" * 31), ValueError),
        (lambda: node_hash("a" * 32, b"\0" * 32), TypeError),
        (lambda: CompactTree().append(b"\0" * 33), ValueError),
        (lambda: CompactTree.from_bytes(3, b"\0" * 32), ValueError),
        (lambda: CompactTree.from_bytes(3, b"\0" * 65), ValueError),
        (lambda: CompactTree.from_bytes(-1, b""), ValueError),
        (lambda: CompactTree.from_bytes(0, "x"), TypeError),
        (lambda: CompactTree.from_bytes("1", b"\0" * 32), TypeError),
    ],
)
def test_generators_reject_bad_input(call, error):
    with pytest.raises(error):
        call()


_L = _leaves(8, b"malformed")
_R = root(_L)
_P = inclusion_proof(3, _L)
_R4 = root(_L[:4])
_C = consistency_proof(4, _L)
_G = consistency_proof(3, _L)
_R3 = root(_L[:3])


@pytest.mark.parametrize(
    "args",
    [
        (3, 8, _L[3], [*_P[:-1], _P[-1][:31]], _R),  # short element
        (3, 8, _L[3], [*_P[:-1], _P[-1] + b"\0"], _R),  # long element
        (3, 8, _L[3], [*_P[:-1], None], _R),
        (3, 8, _L[3], [*_P[:-1], _P[-1].hex()], _R),
        (3, 8, _L[3], None, _R),
        (3, 8, _L[3], 5, _R),
        (3, 8, _L[3], b"".join(_P), _R),
        (3, 8, _L[3][:31], _P, _R),
        (3, 8, _L[3], _P, _R[:31]),
        (3, 8, _L[3].hex(), _P, _R),
        (3, 8, _L[3], _P, None),
        (3, 8, memoryview(_L[3]), _P, _R),
        ("3", 8, _L[3], _P, _R),
        (3, 8.0, _L[3], _P, _R),
        (3, True, _L[3], _P, _R),
        (-1, 8, _L[3], _P, _R),
        (8, 8, _L[3], _P, _R),
        (0, 0, _L[3], [], _R),
        (3, -8, _L[3], _P, _R),
        (3, 2**70, _L[3], _P, _R),
        (3, 8, _L[3], [_P[0]] * 1000, _R),
    ],
)
def test_verify_inclusion_never_raises_on_garbage(args):
    assert verify_inclusion(3, 8, _L[3], _P, _R)  # the unmutated call is valid
    assert verify_inclusion(*args) is False


@pytest.mark.parametrize(
    "args",
    [
        (4, 8, _R4, _R, [_C[0][:31]]),
        (3, 8, _R3, _R, [*_G[:-1], None]),
        (3, 8, _R3, _R, [None, *_G[1:]]),
        (3, 8, _R3, _R, [_G[0].hex(), *_G[1:]]),
        (3, 8, _R3, _R, None),
        (3, 8, _R3, _R, 7),
        (3, 8, _R3, _R, b"".join(_G)),
        (3, 8, _R3[:31], _R, _G),
        (3, 8, _R3, None, _G),
        (3, 8, "x", _R, _G),
        ("3", 8, _R3, _R, _G),
        (3, 8.0, _R3, _R, _G),
        (True, 8, _R3, _R, _G),
        (-3, 8, _R3, _R, _G),
        (3, -8, _R3, _R, _G),
        (9, 8, _R3, _R, _G),
        (3, 2**70, _R3, _R, _G),
        (3, 8, _R3, _R, [_G[0]] * 1000),
        (0, 0, b"", b"", []),
    ],
)
def test_verify_consistency_never_raises_on_garbage(args):
    assert verify_consistency(4, 8, _R4, _R, _C)
    assert verify_consistency(3, 8, _R3, _R, _G)  # the unmutated calls are valid
    assert verify_consistency(*args) is False


def test_leaf_and_node_hash_are_the_rfc_definitions():
    assert leaf_hash(b"abc") == _sha(b"\x00abc")
    assert leaf_hash(bytearray(b"abc")) == leaf_hash(memoryview(b"abc")) == _sha(b"\x00abc")
    a, b = _L[0], _L[1]
    assert node_hash(a, b) == _sha(b"\x01" + a + b)
    assert node_hash(bytearray(a), b) == node_hash(a, b)
    assert root([a]) == a
    assert root([a, b]) == node_hash(a, b)


def test_repr_and_unhashable():
    tree = CompactTree()
    tree.append(_L[0])
    assert "size=1" in repr(tree)
    assert _L[0].hex() in repr(tree)
    with pytest.raises(TypeError):
        hash(tree)
