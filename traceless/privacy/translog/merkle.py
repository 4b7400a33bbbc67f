"""Merkle tree hashing and proofs of RFC 9162 section 2.1 (Certificate Transparency v2).

Hashes (HASH = SHA-256):

    MTH({})        = HASH()                        (the empty tree)
    leaf hash      = HASH(0x00 || leaf_input)
    node hash      = HASH(0x01 || left || right)
    MTH(D[n])      = node(MTH(D[0:k]), MTH(D[k:n]))  k = largest power of two < n

`MerkleTree` holds the leaf hashes of a growing log and answers roots, inclusion proofs
(RFC 9162 2.1.3.1 PATH) and consistency proofs (2.1.4.1 PROOF/SUBPROOF) for any earlier tree size.
`verify_inclusion` and `verify_consistency` are the verification algorithms of 2.1.3.2 and 2.1.4.2;
they raise `InvalidProofError` and return nothing on success.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from traceless.errors import TracelessError

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()


class MerkleError(TracelessError):
    """Base class of Merkle tree errors."""


class InvalidProofError(MerkleError):
    """An inclusion or consistency proof does not verify (or its inputs are out of range)."""


class TreeSizeError(MerkleError, ValueError):
    """A proof or root was asked for an index or tree size the tree does not have."""


def leaf_hash(leaf_input: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + leaf_input).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two strictly smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def merkle_tree_hash(leaf_inputs: Sequence[bytes]) -> bytes:
    """MTH(D[n]) straight from the recursive definition (reference; O(n))."""
    if not leaf_inputs:
        return EMPTY_ROOT
    if len(leaf_inputs) == 1:
        return leaf_hash(leaf_inputs[0])
    k = _split(len(leaf_inputs))
    return node_hash(merkle_tree_hash(leaf_inputs[:k]), merkle_tree_hash(leaf_inputs[k:]))


class MerkleTree:
    """Leaf hashes plus every complete (perfect) subtree hash, kept as levels.

    levels[h][i] is the hash of the perfect subtree over leaves [i * 2**h, (i + 1) * 2**h), so
    appending costs O(log n) hashes and any subtree the RFC recursion visits is either one
    lookup or a fold of O(log n) lookups; proofs then cost O(log^2 n) hashes at most.
    """

    def __init__(self, leaf_hashes: Sequence[bytes] = ()) -> None:
        self._levels: list[list[bytes]] = [[]]
        for h in leaf_hashes:
            self.append(h)

    @property
    def size(self) -> int:
        return len(self._levels[0])

    def append(self, leaf_hash_: bytes) -> None:
        if len(leaf_hash_) != HASH_SIZE:
            raise ValueError("a leaf hash is 32 bytes")
        self._levels[0].append(leaf_hash_)
        h = 0
        while len(self._levels[h]) % 2 == 0:  # a perfect subtree of height h + 1 just closed
            if h + 1 == len(self._levels):
                self._levels.append([])
            pair = self._levels[h][-2:]
            self._levels[h + 1].append(node_hash(pair[0], pair[1]))
            h += 1

    def leaf_hash_at(self, index: int) -> bytes:
        return self._levels[0][index]

    def _subtree(self, start: int, end: int) -> bytes:
        """MTH(D[start:end]) for a range the RFC recursion produces (start aligned, end > start)."""
        n = end - start
        if (n & (n - 1)) == 0 and start % n == 0:  # perfect subtree: stored
            return self._levels[n.bit_length() - 1][start // n]
        k = _split(n)
        return node_hash(self._subtree(start, start + k), self._subtree(start + k, end))

    def _check_size(self, tree_size: int) -> None:
        if not 0 <= tree_size <= self.size:
            raise TreeSizeError(f"tree size {tree_size} outside 0..{self.size}")

    def root(self, tree_size: int | None = None) -> bytes:
        """MTH of the first `tree_size` leaves (default: all of them)."""
        n = self.size if tree_size is None else tree_size
        self._check_size(n)
        return EMPTY_ROOT if n == 0 else self._subtree(0, n)

    def inclusion_proof(self, leaf_index: int, tree_size: int) -> list[bytes]:
        """PATH(m, D[n]) of RFC 9162 2.1.3.1, ordered from the leaf up."""
        self._check_size(tree_size)
        if not 0 <= leaf_index < tree_size:
            raise TreeSizeError(f"leaf index {leaf_index} outside 0..{tree_size - 1}")
        return self._path(leaf_index, 0, tree_size)

    def _path(self, m: int, start: int, end: int) -> list[bytes]:
        if end - start == 1:
            return []
        k = _split(end - start)
        if m < k:
            return self._path(m, start, start + k) + [self._subtree(start + k, end)]
        return self._path(m - k, start + k, end) + [self._subtree(start, start + k)]

    def consistency_proof(self, first: int, second: int) -> list[bytes]:
        """PROOF(m, D[n]) of RFC 9162 2.1.4.1 (empty when first == second)."""
        self._check_size(second)
        if not 0 < first <= second:
            raise TreeSizeError(f"consistency needs 0 < first <= second, got {first}, {second}")
        return self._subproof(first, 0, second, True)

    def _subproof(self, m: int, start: int, end: int, b: bool) -> list[bytes]:
        n = end - start
        if m == n:
            return [] if b else [self._subtree(start, end)]
        k = _split(n)
        if m <= k:
            return self._subproof(m, start, start + k, b) + [self._subtree(start + k, end)]
        return self._subproof(m - k, start + k, end, False) + [self._subtree(start, start + k)]


def _check_hashes(proof: Sequence[bytes]) -> None:
    if any(len(p) != HASH_SIZE for p in proof):
        raise InvalidProofError("proof element is not 32 bytes")


def _shift_while(fn: int, sn: int, until_lsb_set: bool) -> tuple[int, int]:
    # "right-shift both fn and sn equally until LSB(fn) is set or fn is 0" (or "is not set").
    while fn and bool(fn & 1) != until_lsb_set:
        fn, sn = fn >> 1, sn >> 1
    return fn, sn


def verify_inclusion(
    leaf_hash_: bytes, leaf_index: int, tree_size: int, proof: Sequence[bytes], root_hash: bytes
) -> None:
    """RFC 9162 2.1.3.2: raise InvalidProofError unless `proof` proves the leaf is in the tree."""
    if len(leaf_hash_) != HASH_SIZE:
        raise InvalidProofError("leaf hash is not 32 bytes")
    if not 0 <= leaf_index < tree_size:
        raise InvalidProofError("leaf index is not below the tree size")
    _check_hashes(proof)
    fn, sn, r = leaf_index, tree_size - 1, leaf_hash_
    for p in proof:
        if sn == 0:
            raise InvalidProofError("inclusion proof is too long")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            fn, sn = _shift_while(fn, sn, until_lsb_set=True)
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0 or r != root_hash:
        raise InvalidProofError("inclusion proof does not lead to the root hash")


def verify_consistency(first: int, second: int, proof: Sequence[bytes], first_hash: bytes, second_hash: bytes) -> None:
    """RFC 9162 2.1.4.2: raise InvalidProofError unless tree `second` extends tree `first`.

    A proof from size 0 is refused: every tree extends the empty tree, so such a "proof"
    proves nothing and a caller asking for one has a bug.
    """
    if first <= 0 or first > second:
        raise InvalidProofError("consistency needs 0 < first <= second")
    if first == second:
        if proof or first_hash != second_hash:
            raise InvalidProofError("equal sizes need an empty proof and equal roots")
        return
    if not proof:
        raise InvalidProofError("consistency proof is empty")
    _check_hashes(proof)
    path = list(proof)
    if (first & (first - 1)) == 0:  # first is a power of two: its root is a node of the path
        path.insert(0, first_hash)
    fn, sn = first - 1, second - 1
    fn, sn = _shift_while(fn, sn, until_lsb_set=False)
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise InvalidProofError("consistency proof is too long")
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            fn, sn = _shift_while(fn, sn, until_lsb_set=True)
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0 or fr != first_hash or sr != second_hash:
        raise InvalidProofError("consistency proof does not lead to both roots")
