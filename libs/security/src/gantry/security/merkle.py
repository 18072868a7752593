"""RFC 6962 (Certificate Transparency) Merkle trees, proofs and client-side verification.

Hashing follows RFC 6962 §2.1 (identical in RFC 9162 §2.1.1):

* leaf hash ``SHA-256(0x00 || leaf)``;
* interior node ``SHA-256(0x01 || left || right)``;
* the root of the empty tree is ``SHA-256("")``;
* a tree of ``n > 1`` leaves is split at ``k``, the largest power of two smaller than ``n``.

:class:`MerkleTree` is the server side: an append-only tree over leaf *hashes* that keeps every
complete (perfect, aligned) subtree, so roots, inclusion proofs and consistency proofs for any
earlier tree size cost ``O(log n)`` hashes. :func:`verify_inclusion` and
:func:`verify_consistency` are the client side: they implement the RFC 9162 §2.1.3.2 and §2.1.4.2
algorithms and need no trust in whoever produced the proof. :class:`StreamingRoot` recomputes
roots from a stream of leaf hashes in ``O(log n)`` memory.

This module depends on nothing but :mod:`hashlib`. Instances are not thread-safe; callers that
share a tree between threads must serialise access.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Final

__all__ = [
    "EMPTY_ROOT",
    "HASH_SIZE",
    "MerkleTree",
    "StreamingRoot",
    "leaf_hash",
    "node_hash",
    "verify_consistency",
    "verify_inclusion",
    "verify_subtree_inclusion",
]

HASH_SIZE: Final = 32
"""Size in bytes of every hash in the tree (SHA-256)."""

_LEAF_PREFIX: Final = b"\x00"
_NODE_PREFIX: Final = b"\x01"
_NODE_HASHER: Final = hashlib.sha256(_NODE_PREFIX)

EMPTY_ROOT: Final[bytes] = hashlib.sha256(b"").digest()
"""Root hash of the empty tree, ``SHA-256("")``."""


def leaf_hash(data: bytes) -> bytes:
    """Return the RFC 6962 leaf hash ``SHA-256(0x00 || data)``."""
    return hashlib.sha256(_LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """Return the RFC 6962 interior node hash ``SHA-256(0x01 || left || right)``."""
    h = _NODE_HASHER.copy()
    h.update(left)
    h.update(right)
    return h.digest()


def _hash_pairs(level: bytearray, first_pair: int, end_pair: int) -> bytes:
    """Hash the adjacent pairs ``first_pair .. end_pair - 1`` of a packed level into parents."""
    base = _NODE_HASHER
    step = 2 * HASH_SIZE

    def parent(pair: memoryview) -> bytes:
        h = base.copy()
        h.update(pair)
        return h.digest()

    with memoryview(level) as view:
        return b"".join(
            [parent(view[i : i + step]) for i in range(first_pair * step, end_pair * step, step)]
        )


def _fold(pieces: list[bytes]) -> bytes:
    """Combine perfect subtrees (largest first, left to right) into the RFC 6962 root."""
    if not pieces:
        return EMPTY_ROOT
    acc = pieces[-1]
    for piece in reversed(pieces[:-1]):
        acc = node_hash(piece, acc)
    return acc


def _largest_power_of_two_below(n: int) -> int:
    """Return ``k``, the largest power of two strictly smaller than ``n`` (``n >= 2``)."""
    return 1 << ((n - 1).bit_length() - 1)


def _check_hash(value: bytes, what: str) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"{what} must be bytes, got {type(value).__name__}")
    value = bytes(value)
    if len(value) != HASH_SIZE:
        raise ValueError(f"{what} must be {HASH_SIZE} bytes, got {len(value)}")
    return value


def _is_hash(value: object) -> bool:
    return isinstance(value, bytes | bytearray) and len(value) == HASH_SIZE


class MerkleTree:
    """An append-only in-memory RFC 6962 Merkle tree over leaf hashes.

    Every complete subtree is stored: level ``L`` is a :class:`bytearray` holding the
    concatenated 32-byte hashes of the aligned perfect subtrees of ``2**L`` leaves, in order
    (level 0 holds the leaf hashes). A tree of ``n`` leaves therefore holds fewer than ``2n``
    hashes (64 bytes per leaf), and the root, inclusion proof or consistency proof for *any*
    tree size up to :attr:`size` is assembled from ``O(log n)`` stored nodes.

    Appending is amortised ``O(1)`` hashes; :meth:`extend` and :meth:`from_leaf_hashes` hash
    new nodes level by level in bulk.
    """

    __slots__ = ("_levels", "_size")

    def __init__(self) -> None:
        """Create an empty tree."""
        self._levels: list[bytearray] = [bytearray()]
        self._size = 0

    @classmethod
    def from_leaf_hashes(cls, hashes: Iterable[bytes]) -> MerkleTree:
        """Build a tree from an iterable of 32-byte leaf hashes in bulk."""
        tree = cls()
        tree.extend(hashes)
        return tree

    @property
    def size(self) -> int:
        """Number of leaves in the tree."""
        return self._size

    def __repr__(self) -> str:
        """Return a short description showing the size and current root."""
        return f"MerkleTree(size={self._size}, root={self.root().hex()})"

    # -- mutation ---------------------------------------------------------------------------

    def append(self, leaf_hash: bytes) -> int:
        """Append one 32-byte leaf hash and return its index."""
        value = _check_hash(leaf_hash, "leaf hash")
        levels = self._levels
        index = self._size
        levels[0] += value
        self._size = index + 1
        # Each trailing one bit of the new leaf's index completes a perfect subtree.
        level = 0
        node = value
        while index & 1:
            row = levels[level]
            node = node_hash(bytes(row[-2 * HASH_SIZE : -HASH_SIZE]), node)
            level += 1
            if level == len(levels):
                levels.append(bytearray())
            levels[level] += node
            index >>= 1
        return self._size - 1

    def extend(self, hashes: Iterable[bytes]) -> None:
        """Append many 32-byte leaf hashes, hashing the new interior nodes level by level."""
        values = list(hashes)
        if not values:
            return
        try:
            packed = b"".join(values)
        except TypeError:
            packed = b""
        if len(packed) != HASH_SIZE * len(values) or set(map(len, values)) != {HASH_SIZE}:
            for value in values:  # locate the offending hash for the error message
                _check_hash(value, "leaf hash")
            raise ValueError("leaf hashes must be 32 bytes each")
        levels = self._levels
        levels[0] += packed
        self._size += len(values)
        level = 0
        while True:
            count = len(levels[level]) // HASH_SIZE
            if count < 2:
                break
            if level + 1 == len(levels):
                levels.append(bytearray())
            have = len(levels[level + 1]) // HASH_SIZE
            want = count // 2
            if have == want:
                break
            levels[level + 1] += _hash_pairs(levels[level], have, want)
            level += 1

    # -- queries ----------------------------------------------------------------------------

    def leaf(self, index: int) -> bytes:
        """Return the leaf hash at ``index``."""
        self._check_index(index, self._size)
        return self._node(0, index)

    def root(self, tree_size: int | None = None) -> bytes:
        """Return the root of the first ``tree_size`` leaves (default: the whole tree).

        ``O(log n)``: the root is folded from the perfect subtrees that make up ``tree_size``.
        """
        n = self._check_size(tree_size, "tree size")
        return self._range_hash(0, n)

    def subtree_root(self, first: int, level: int) -> bytes:
        """Return the root of the aligned perfect subtree of ``2**level`` leaves at ``first``.

        ``first`` must be a multiple of ``2**level`` and the subtree complete (inside
        :attr:`size`); the node is stored, so this costs no hashing.
        """
        if level < 0 or first < 0 or first % (1 << level):
            raise ValueError(
                f"a subtree of level {level} must start at a multiple of {1 << max(level, 0)}, "
                f"not {first}"
            )
        if first + (1 << level) > self._size:
            raise ValueError(
                f"subtree [{first}, {first + (1 << level)}) is not complete in a tree of size "
                f"{self._size}"
            )
        return self._node(level, first >> level)

    def inclusion_proof(self, index: int, tree_size: int | None = None) -> list[bytes]:
        """Return the audit path for leaf ``index`` in the tree of ``tree_size`` leaves.

        This is ``PATH(index, D[tree_size])`` of RFC 6962 §2.1.1 (the inclusion proof of
        RFC 9162 §2.1.3.1): sibling hashes ordered from the leaf up to the root.
        """
        n = self._check_size(tree_size, "tree size")
        self._check_index(index, n)
        upper: list[bytes] = []  # siblings collected top-down while the range is imperfect
        lo, hi = 0, n
        while (hi - lo) & (hi - lo - 1):
            mid = lo + _largest_power_of_two_below(hi - lo)
            if index < mid:
                upper.append(self._range_hash(mid, hi))
                hi = mid
            else:
                upper.append(self._range_hash(lo, mid))
                lo = mid
        # [lo, hi) is now an aligned perfect subtree: its siblings are stored nodes.
        height = (hi - lo).bit_length() - 1
        proof = [self._node(level, (index >> level) ^ 1) for level in range(height)]
        proof.extend(reversed(upper))
        return proof

    def consistency_proof(self, first: int, second: int | None = None) -> list[bytes]:
        """Return the proof that the tree of ``first`` leaves is a prefix of ``second`` leaves.

        This is ``PROOF(first, D[second])`` of RFC 6962 §2.1.2 (RFC 9162 §2.1.4.1). The proof
        is empty when ``first`` is 0 or equal to ``second``.
        """
        n = self._check_size(second, "second size")
        if first < 0:
            raise ValueError(f"first size must be non-negative, got {first}")
        if first > n:
            raise ValueError(f"first size {first} is larger than second size {n}")
        if first in (0, n):
            return []
        top_down: list[bytes] = []
        lo, hi, m, complete = 0, n, first, True
        while m != hi - lo:
            k = _largest_power_of_two_below(hi - lo)
            if m <= k:
                top_down.append(self._range_hash(lo + k, hi))
                hi = lo + k
            else:
                top_down.append(self._range_hash(lo, lo + k))
                lo += k
                m -= k
                complete = False
        if not complete:
            top_down.append(self._range_hash(lo, hi))
        top_down.reverse()
        return top_down

    # -- internals --------------------------------------------------------------------------

    def _node(self, level: int, index: int) -> bytes:
        start = index * HASH_SIZE
        return bytes(self._levels[level][start : start + HASH_SIZE])

    def _range_hash(self, start: int, end: int) -> bytes:
        """Return ``MTH(D[start:end])`` for a range produced by the RFC 6962 split rule.

        Such a range starts at a multiple of a power of two at least as large as its length, so
        its binary decomposition (largest part first) consists of stored aligned subtrees.
        """
        pieces: list[bytes] = []
        remaining = end - start
        position = start
        level = remaining.bit_length() - 1
        while level >= 0:
            if remaining >> level & 1:
                pieces.append(self._node(level, position >> level))
                position += 1 << level
            level -= 1
        return _fold(pieces)

    def _check_size(self, tree_size: int | None, what: str) -> int:
        if tree_size is None:
            return self._size
        if tree_size < 0:
            raise ValueError(f"{what} must be non-negative, got {tree_size}")
        if tree_size > self._size:
            raise ValueError(f"{what} {tree_size} exceeds the current tree size {self._size}")
        return tree_size

    @staticmethod
    def _check_index(index: int, tree_size: int) -> None:
        if not 0 <= index < tree_size:
            raise ValueError(f"index {index} is outside a tree of size {tree_size}")


class StreamingRoot:
    """Root of a stream of leaf hashes, in ``O(log n)`` memory (a compact-range frontier).

    The frontier holds the roots of the perfect subtrees that make up the leaves seen so far,
    largest first (one per set bit of :attr:`size`). :meth:`root` may be called at any point,
    so a verifier can replay a log once and compare against checkpoints at many sizes.
    """

    __slots__ = ("_frontier", "_size")

    def __init__(self) -> None:
        """Start with no leaves."""
        self._frontier: list[bytes] = []
        self._size = 0

    @property
    def size(self) -> int:
        """Number of leaf hashes added so far."""
        return self._size

    def add(self, leaf_hash: bytes) -> None:
        """Add the next 32-byte leaf hash."""
        node = _check_hash(leaf_hash, "leaf hash")
        frontier = self._frontier
        index = self._size
        while index & 1:
            node = node_hash(frontier.pop(), node)
            index >>= 1
        frontier.append(node)
        self._size += 1

    def root(self) -> bytes:
        """Return the root of all leaf hashes added so far (:data:`EMPTY_ROOT` if none)."""
        return _fold(self._frontier)


def _root_from_inclusion(
    leaf_hash: bytes, index: int, tree_size: int, proof: Sequence[bytes]
) -> bytes | None:
    """Recompute the root from an audit path (RFC 9162 §2.1.3.2), or None if malformed."""
    if not 0 <= index < tree_size or not _is_hash(leaf_hash):
        return None
    return _climb(bytes(leaf_hash), index, tree_size - 1, proof)


def _climb(node: bytes, fn: int, sn: int, proof: Sequence[bytes]) -> bytes | None:
    """The RFC 9162 §2.1.3.2 loop from ``node`` at index ``fn`` of a level whose last index is
    ``sn``: the root, or None if the path is malformed or of the wrong length."""
    r = node
    for p in proof:
        if sn == 0 or not _is_hash(p):
            return None
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while fn and not fn & 1:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return r if sn == 0 else None


def verify_inclusion(
    leaf_hash: bytes, index: int, tree_size: int, proof: Sequence[bytes], root: bytes
) -> bool:
    """Check an inclusion proof (RFC 9162 §2.1.3.2) against a trusted ``root``.

    Returns True only if ``proof`` shows that ``leaf_hash`` is leaf ``index`` of a tree of
    ``tree_size`` leaves whose root is ``root``. Malformed input (negative or out-of-range
    index, hashes that are not 32 bytes, a proof of the wrong length) yields False.

    Note that, inherently to RFC 6962, the audit path binds the *shape* of the path rather
    than the exact size: a size whose audit path for ``index`` has the same sequence of
    left/right siblings verifies identically (e.g. index 0 in sizes 3 and 4).
    """
    if not _is_hash(root):
        return False
    computed = _root_from_inclusion(leaf_hash, index, tree_size, proof)
    return computed is not None and computed == root


def verify_subtree_inclusion(
    subtree_root: bytes,
    first: int,
    level: int,
    tree_size: int,
    outer_path: Sequence[bytes],
    root: bytes,
) -> bool:
    """Check that the aligned perfect subtree of ``2**level`` leaves starting at leaf ``first``
    with root ``subtree_root`` is part of the tree of ``tree_size`` leaves with ``root``.

    For such a subtree inside the tree (``first`` a multiple of ``2**level`` and
    ``first + 2**level <= tree_size``), the audit path of leaf ``first`` is the ``level``
    siblings inside the subtree followed by ``outer_path``; the verification loop of RFC 9162
    §2.1.3.2, after climbing those ``level`` steps, stands at the subtree's root. So the
    subtree is proven by ``outer_path`` alone (``inclusion_proof(first, tree_size)[level:]``).
    Malformed input yields False.
    """
    if not (_is_hash(root) and _is_hash(subtree_root)) or level < 0 or first < 0:
        return False
    if first % (1 << level) or first + (1 << level) > tree_size:
        return False
    computed = _climb(bytes(subtree_root), first >> level, (tree_size - 1) >> level, outer_path)
    return computed is not None and computed == root


def verify_consistency(
    first_size: int,
    second_size: int,
    first_root: bytes,
    second_root: bytes,
    proof: Sequence[bytes],
) -> bool:
    """Check a consistency proof (RFC 9162 §2.1.4.2) between two trusted roots.

    Returns True only if ``proof`` shows that the tree of ``first_size`` leaves with root
    ``first_root`` is a prefix of the tree of ``second_size`` leaves with root ``second_root``.
    Equal sizes need an empty proof and equal roots; a first size of 0 needs an empty proof and
    ``first_root == EMPTY_ROOT`` (every tree extends the empty one). Malformed input yields
    False.
    """
    if not (_is_hash(first_root) and _is_hash(second_root)):
        return False
    if not 0 <= first_size <= second_size:
        return False
    if first_size == second_size:
        return not proof and first_root == second_root
    if first_size == 0:
        return not proof and first_root == EMPTY_ROOT
    if not proof or not all(_is_hash(c) for c in proof):
        return False
    path = list(proof)
    if (first_size & (first_size - 1)) == 0:  # an exact power of two: the first tree is a node
        path.insert(0, first_root)
    fn, sn = first_size - 1, second_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = bytes(path[0])
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while fn and not fn & 1:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == first_root and sr == second_root
