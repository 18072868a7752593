"""Tests for gantry.security.merkle against a straight-from-RFC-6962 recursive reference."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from functools import cache

import pytest

from gantry.security.merkle import (
    EMPTY_ROOT,
    MerkleTree,
    StreamingRoot,
    leaf_hash,
    node_hash,
    verify_consistency,
    verify_inclusion,
)

MAX_SIZE = 70

# --------------------------------------------------------------------------------------------
# Reference implementation: RFC 6962 §2.1 MTH, PATH and PROOF, written as literally as possible
# (over leaf hashes, so MTH of a single entry is that entry's leaf hash).
# --------------------------------------------------------------------------------------------


def _ref_node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """k: the largest power of two smaller than n (n > 1)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


_RNG = random.Random(6962)
LEAVES: list[bytes] = [
    hashlib.sha256(b"\x00" + _RNG.randbytes(_RNG.randrange(0, 40))).digest()
    for _ in range(2 * MAX_SIZE + 2)  # extra leaves for the "wrong size" checks
]


@cache
def ref_mth(lo: int, hi: int) -> bytes:
    """MTH(D[lo:hi]) over LEAVES."""
    n = hi - lo
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return LEAVES[lo]
    k = _split(n)
    return _ref_node(ref_mth(lo, lo + k), ref_mth(lo + k, hi))


def ref_path(m: int, lo: int, hi: int) -> list[tuple[bytes, str]]:
    """PATH(m, D[lo:hi]) with each sibling's side ('L' or 'R') as seen from the path."""
    n = hi - lo
    if n == 1:
        return []
    k = _split(n)
    if m < k:
        return [*ref_path(m, lo, lo + k), (ref_mth(lo + k, hi), "R")]
    return [*ref_path(m - k, lo + k, hi), (ref_mth(lo, lo + k), "L")]


def ref_subproof(m: int, lo: int, hi: int, complete: bool) -> list[tuple[bytes, str]]:
    """SUBPROOF(m, D[lo:hi], b) with each element's role ('S'tart, 'L'eft or 'R'ight)."""
    n = hi - lo
    if m == n:
        return [] if complete else [(ref_mth(lo, hi), "S")]
    k = _split(n)
    if m <= k:
        return [*ref_subproof(m, lo, lo + k, complete), (ref_mth(lo + k, hi), "R")]
    return [*ref_subproof(m - k, lo + k, hi, False), (ref_mth(lo, lo + k), "L")]


@cache
def ref_inclusion(m: int, n: int) -> tuple[list[bytes], str]:
    path = ref_path(m, 0, n)
    return [h for h, _ in path], "".join(side for _, side in path)


@cache
def ref_consistency(m: int, n: int) -> tuple[list[bytes], str]:
    proof = ref_subproof(m, 0, n, True) if 0 < m < n else []
    return [h for h, _ in proof], "".join(role for _, role in proof)


@pytest.fixture(scope="module")
def tree() -> MerkleTree:
    t = MerkleTree()
    for h in LEAVES[:MAX_SIZE]:
        t.append(h)
    return t


def _flip(data: bytes, position: int) -> bytes:
    out = bytearray(data)
    out[position] ^= 0x01
    return bytes(out)


def _nearby(x: int, lo: int, hi: int) -> list[int]:
    """A spread of values in [lo, hi) around x (neighbours, halves, doubles, bit flips, ends)."""
    top = 1 << x.bit_length()
    candidates = {x - 2, x - 1, x + 1, x + 2, x // 2, 2 * x, x ^ 1, top // 2, top, lo, hi - 1}
    return sorted(c for c in candidates if lo <= c < hi and c != x)


def _mutated_lists(proof: list[bytes]) -> list[list[bytes]]:
    """Proof lists that must never verify: one flipped byte anywhere, truncated, extended."""
    other = hashlib.sha256(b"not in the tree").digest()
    out: list[list[bytes]] = []
    for i, element in enumerate(proof):
        for position in (0, 31):
            out.append([*proof[:i], _flip(element, position), *proof[i + 1 :]])
    if proof:
        out += [proof[:-1], proof[1:], [*proof, proof[-1]]]
    out += [[*proof, other], [other, *proof], [*proof, EMPTY_ROOT]]
    if len(proof) > 1:
        out.append([proof[1], proof[0], *proof[2:]])
    return out


# --------------------------------------------------------------------------------------------
# Hashing primitives and known answers
# --------------------------------------------------------------------------------------------

CT_TEST_LEAVES = [
    b"",
    b"\x00",
    b"\x10",
    b"\x20\x21",
    b"\x30\x31",
    b"\x40\x41\x42\x43",
    b"\x50\x51\x52\x53\x54\x55\x56\x57",
    b"\x60\x61\x62\x63\x64\x65\x66\x67\x68\x69\x6a\x6b\x6c\x6d\x6e\x6f",
]

# Roots of the first 1..8 CT test leaves (certificate-transparency merkle_tree_test.cc).
CT_TEST_ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]


def test_hash_primitives() -> None:
    assert EMPTY_ROOT.hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert leaf_hash(b"abc") == hashlib.sha256(b"\x00abc").digest()
    a, b = leaf_hash(b"a"), leaf_hash(b"b")
    assert node_hash(a, b) == hashlib.sha256(b"\x01" + a + b).digest()
    assert node_hash(a, b) != node_hash(b, a)
    # Domain separation: a leaf whose data looks like two hashes is not an interior node.
    assert leaf_hash(a + b) != node_hash(a, b)


def test_known_answer_ct_test_vectors() -> None:
    hashes = [leaf_hash(d) for d in CT_TEST_LEAVES]
    t = MerkleTree.from_leaf_hashes(hashes)
    stream = StreamingRoot()
    assert t.root(0) == stream.root() == EMPTY_ROOT
    for size, expected in enumerate(CT_TEST_ROOTS, start=1):
        # The same leaves through an independent reference computation.
        def mth(items: list[bytes]) -> bytes:
            if len(items) == 1:
                return items[0]
            k = _split(len(items))
            return _ref_node(mth(items[:k]), mth(items[k:]))

        stream.add(hashes[size - 1])
        assert mth(hashes[:size]).hex() == expected
        assert t.root(size).hex() == expected
        assert stream.root().hex() == expected
    assert t.root().hex() == "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"


# --------------------------------------------------------------------------------------------
# MerkleTree against the reference
# --------------------------------------------------------------------------------------------


def test_roots_match_reference_for_every_size(tree: MerkleTree) -> None:
    assert MerkleTree().root() == EMPTY_ROOT
    assert tree.size == MAX_SIZE
    for n in range(MAX_SIZE + 1):
        assert tree.root(n) == ref_mth(0, n), n
    assert tree.root() == ref_mth(0, MAX_SIZE)


def test_roots_while_growing() -> None:
    t = MerkleTree()
    for n, h in enumerate(LEAVES[:MAX_SIZE]):
        assert t.root() == ref_mth(0, n)
        assert t.append(h) == n
        assert t.leaf(n) == h
    assert [t.leaf(i) for i in range(t.size)] == LEAVES[:MAX_SIZE]


def test_inclusion_proofs_match_reference(tree: MerkleTree) -> None:
    for n in range(1, MAX_SIZE + 1):
        root = ref_mth(0, n)
        for m in range(n):
            expected, _ = ref_inclusion(m, n)
            proof = tree.inclusion_proof(m, n)
            assert proof == expected, (m, n)
            assert verify_inclusion(LEAVES[m], m, n, proof, root), (m, n)
    assert tree.inclusion_proof(3) == ref_inclusion(3, MAX_SIZE)[0]


def test_consistency_proofs_match_reference(tree: MerkleTree) -> None:
    for n in range(MAX_SIZE + 1):
        for m in range(n + 1):
            expected, _ = ref_consistency(m, n)
            proof = tree.consistency_proof(m, n)
            assert proof == expected, (m, n)
            assert verify_consistency(m, n, ref_mth(0, m), ref_mth(0, n), proof), (m, n)
    assert tree.consistency_proof(5) == ref_consistency(5, MAX_SIZE)[0]


def test_from_leaf_hashes_and_extend_match_incremental_appends(tree: MerkleTree) -> None:
    rng = random.Random(1)
    for n in range(MAX_SIZE + 1):
        built = MerkleTree.from_leaf_hashes(LEAVES[:n])
        incremental = MerkleTree()
        for h in LEAVES[:n]:
            incremental.append(h)
        # Mixed batches of random sizes, including empty ones.
        mixed = MerkleTree()
        pos = 0
        while pos < n:
            step = rng.randrange(0, 9)
            if step == 1:
                mixed.append(LEAVES[pos])
            else:
                mixed.extend(iter(LEAVES[pos : min(pos + step, n)]))
            pos = mixed.size
        assert built.size == incremental.size == mixed.size == n
        assert built._levels == incremental._levels == mixed._levels, n
        assert built.root() == ref_mth(0, n)
    assert MerkleTree.from_leaf_hashes(LEAVES[:MAX_SIZE])._levels == tree._levels


def test_levels_are_compact_perfect_subtrees(tree: MerkleTree) -> None:
    levels = tree._levels
    for level, row in enumerate(levels):
        assert isinstance(row, bytearray)
        width = 1 << level
        assert len(row) == 32 * (MAX_SIZE // width)
        for i in range(len(row) // 32):
            assert row[32 * i : 32 * i + 32] == ref_mth(i * width, (i + 1) * width)


def test_larger_tree_against_streaming_root() -> None:
    rng = random.Random(7)
    hashes = [rng.randbytes(32) for _ in range(1100)]
    t = MerkleTree.from_leaf_hashes(hashes[:600])
    t.extend(hashes[600:])
    stream = StreamingRoot()
    assert stream.size == 0
    assert stream.root() == t.root(0)
    for n, h in enumerate(hashes, start=1):
        stream.add(h)
        assert stream.size == n
        assert stream.root() == t.root(n), n
    for n in (1, 2, 3, 511, 512, 513, 1023, 1024, 1025, 1100):
        root = t.root(n)
        for m in sorted({0, 1, n // 2, n - 2, n - 1} & set(range(n))):
            proof = t.inclusion_proof(m, n)
            assert verify_inclusion(hashes[m], m, n, proof, root)
            assert len(proof) <= (n - 1).bit_length()
        for first in (1, 2, 3, 256, 511, 512, 513, 1000):
            if first <= n:
                proof = t.consistency_proof(first, n)
                assert verify_consistency(first, n, t.root(first), root, proof), (first, n)


def test_streaming_root_matches_tree_at_every_size(tree: MerkleTree) -> None:
    stream = StreamingRoot()
    assert stream.root() == EMPTY_ROOT
    for n, h in enumerate(LEAVES[:MAX_SIZE], start=1):
        stream.add(h)
        assert stream.root() == tree.root(n) == ref_mth(0, n)
        # O(log n) memory: one frontier entry per set bit of the size.
        assert len(stream._frontier) == n.bit_count()


# --------------------------------------------------------------------------------------------
# Verification rejects everything that is not a correct proof
# --------------------------------------------------------------------------------------------


def test_verify_inclusion_rejects_modified_proofs() -> None:
    wrong_leaf = hashlib.sha256(b"wrong leaf").digest()
    for n in range(1, MAX_SIZE + 1):
        root = ref_mth(0, n)
        for m in range(n):
            proof, shape = ref_inclusion(m, n)
            leaf = LEAVES[m]
            assert verify_inclusion(leaf, m, n, proof, root)
            for bad in _mutated_lists(proof):
                assert not verify_inclusion(leaf, m, n, bad, root), (m, n, bad)
            for position in (0, 31):
                assert not verify_inclusion(_flip(leaf, position), m, n, proof, root)
                assert not verify_inclusion(leaf, m, n, proof, _flip(root, position))
            assert not verify_inclusion(wrong_leaf, m, n, proof, root)
            assert not verify_inclusion(leaf, m, n, proof, ref_mth(0, n - 1))
            assert not verify_inclusion(leaf, m, n, proof, root[:31])
            assert not verify_inclusion(leaf[:31], m, n, proof, root)
            for bad_index in (-1, n, n + 1):
                assert not verify_inclusion(leaf, bad_index, n, proof, root)
            # Any other index (a path has a unique shape per index) or another size. A size
            # whose audit path for this index has exactly the same left/right shape verifies
            # identically: that is inherent to RFC 6962 and checked here explicitly.
            for other_m in _nearby(m, 0, n):
                assert not verify_inclusion(leaf, other_m, n, proof, root), (m, other_m, n)
            for other_n in _nearby(n, 0, 2 * MAX_SIZE + 2):
                same_shape = m < other_n and ref_inclusion(m, other_n)[1] == shape
                assert verify_inclusion(leaf, m, other_n, proof, root) == same_shape, (m, n)
    assert not verify_inclusion(LEAVES[0], 0, 0, [], EMPTY_ROOT)
    assert verify_inclusion(LEAVES[0], 0, 1, [], LEAVES[0])
    assert not verify_inclusion(LEAVES[0], 0, 1, [LEAVES[1]], LEAVES[0])


def test_verify_consistency_rejects_modified_proofs() -> None:
    for n in range(2, MAX_SIZE + 1):
        second_root = ref_mth(0, n)
        for m in range(1, n):
            proof, shape = ref_consistency(m, n)
            first_root = ref_mth(0, m)
            assert verify_consistency(m, n, first_root, second_root, proof)
            for bad in _mutated_lists(proof):
                assert not verify_consistency(m, n, first_root, second_root, bad), (m, n, bad)
            for position in (0, 31):
                assert not verify_consistency(m, n, _flip(first_root, position), second_root, proof)
                assert not verify_consistency(m, n, first_root, _flip(second_root, position), proof)
            assert not verify_consistency(m, n, second_root, first_root, proof)
            assert not verify_consistency(m, n, first_root, ref_mth(0, n - 1), proof)
            assert not verify_consistency(m, n, ref_mth(0, m - 1), second_root, proof)
            assert not verify_consistency(m, n, first_root[:31], second_root, proof)
            assert not verify_consistency(n, m, second_root, first_root, proof)
            assert not verify_consistency(m, n, first_root, second_root, [])
            # Other sizes verify only where the proof would be interpreted identically, which
            # RFC 6962 cannot distinguish (e.g. m=2: n=3 and n=4 read the proof the same way).
            for other_n in (n, n - 1, n + 1, n + 2, 2 * n, 1 << n.bit_length()):
                for other_m in (m - 1, m, m + 1, m // 2, 2 * m, m ^ 1, 0, other_n):
                    if (other_m, other_n) == (m, n):
                        continue
                    valid = 0 < other_m < other_n
                    same_shape = valid and ref_consistency(other_m, other_n)[1] == shape
                    got = verify_consistency(other_m, other_n, first_root, second_root, proof)
                    assert got == same_shape, (m, n, other_m, other_n)


def test_verify_consistency_trivial_cases() -> None:
    root5 = ref_mth(0, 5)
    assert verify_consistency(5, 5, root5, root5, [])
    assert not verify_consistency(5, 5, root5, root5, [root5])
    assert not verify_consistency(5, 5, root5, ref_mth(0, 6), [])
    assert verify_consistency(0, 5, EMPTY_ROOT, root5, [])
    assert verify_consistency(0, 0, EMPTY_ROOT, EMPTY_ROOT, [])
    assert not verify_consistency(0, 5, root5, root5, [])
    assert not verify_consistency(0, 5, EMPTY_ROOT, root5, [root5])
    assert not verify_consistency(-1, 5, EMPTY_ROOT, root5, [])
    assert not verify_consistency(6, 5, ref_mth(0, 6), root5, [])


# --------------------------------------------------------------------------------------------
# Argument validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: t.leaf(5), "index 5 is outside a tree of size 5"),
        (lambda t: t.leaf(-1), "index -1 is outside a tree of size 5"),
        (lambda t: t.inclusion_proof(10), "index 10 is outside a tree of size 5"),
        (lambda t: t.inclusion_proof(3, 3), "index 3 is outside a tree of size 3"),
        (lambda t: t.inclusion_proof(0, 0), "index 0 is outside a tree of size 0"),
        (lambda t: t.inclusion_proof(0, 6), "tree size 6 exceeds the current tree size 5"),
        (lambda t: t.root(6), "tree size 6 exceeds the current tree size 5"),
        (lambda t: t.root(-1), "tree size must be non-negative, got -1"),
        (lambda t: t.consistency_proof(4, 3), "first size 4 is larger than second size 3"),
        (lambda t: t.consistency_proof(6), "first size 6 is larger than second size 5"),
        (lambda t: t.consistency_proof(-1), "first size must be non-negative, got -1"),
        (lambda t: t.consistency_proof(1, 9), "second size 9 exceeds the current tree size 5"),
        (lambda t: t.append(b"short"), "leaf hash must be 32 bytes, got 5"),
        (lambda t: t.extend([LEAVES[0], bytes(33)]), "leaf hash must be 32 bytes, got 33"),
    ],
)
def test_out_of_range_arguments_raise_value_error(
    call: Callable[[MerkleTree], object], message: str
) -> None:
    t = MerkleTree.from_leaf_hashes(LEAVES[:5])
    levels = [bytes(row) for row in t._levels]
    with pytest.raises(ValueError, match=f"^{message}$"):
        call(t)
    # A rejected call leaves the tree untouched.
    assert [bytes(row) for row in t._levels] == levels
    assert t.size == 5


def test_wrong_types_are_rejected() -> None:
    t = MerkleTree()
    with pytest.raises(TypeError):
        t.append("0" * 32)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="32 bytes"):
        StreamingRoot().add(b"")
    assert t.size == 0
    assert MerkleTree.from_leaf_hashes([]).root() == EMPTY_ROOT
    assert MerkleTree().consistency_proof(0) == []
