"""RFC 9162 section 2.1 Merkle hashing and proofs: known answers, then properties."""

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vectors import VECTORS
from traceless.privacy.translog.merkle import (
    EMPTY_ROOT,
    InvalidProofError,
    MerkleTree,
    TreeSizeError,
    leaf_hash,
    merkle_tree_hash,
    node_hash,
    verify_consistency,
    verify_inclusion,
)

PROBES = VECTORS / "merkle" / "transparency-dev-testdata"
INCLUSION = sorted((PROBES / "inclusion").rglob("*.json"))
CONSISTENCY = sorted((PROBES / "consistency").rglob("*.json"))


def _b64(value):
    return base64.b64decode(value or "")


def _proof(probe):
    return [_b64(p) for p in probe["proof"] or []]


def test_all_probes_are_present():
    # parametrize over an empty list would only skip: a missing vector directory must fail
    assert len(INCLUSION) == 98 and len(CONSISTENCY) == 98


@pytest.mark.parametrize("path", INCLUSION, ids=lambda p: str(p.relative_to(PROBES)))
def test_inclusion_probe(path):
    probe = json.loads(path.read_text())
    args = (_b64(probe["leafHash"]), probe["leafIdx"], probe["treeSize"], _proof(probe), _b64(probe["root"]))
    if probe["wantErr"]:
        with pytest.raises(InvalidProofError):
            verify_inclusion(*args)
    else:
        verify_inclusion(*args)


@pytest.mark.parametrize("path", CONSISTENCY, ids=lambda p: str(p.relative_to(PROBES)))
def test_consistency_probe(path):
    probe = json.loads(path.read_text())
    args = (probe["size1"], probe["size2"], _proof(probe), _b64(probe["root1"]), _b64(probe["root2"]))
    if probe["wantErr"]:
        with pytest.raises(InvalidProofError):
            verify_consistency(*args)
    else:
        verify_consistency(*args)


def test_reference_tree_roots():
    ref = json.loads((VECTORS / "merkle" / "rfc9162-reference-tree.json").read_text())
    leaves = [bytes.fromhex(x) for x in ref["leaf_inputs_hex"]]
    roots = [bytes.fromhex(x) for x in ref["root_hashes_by_tree_size_hex"]]
    assert len(leaves) == 8 and len(roots) == 9
    tree = MerkleTree([leaf_hash(x) for x in leaves])
    for size, want in enumerate(roots):
        assert merkle_tree_hash(leaves[:size]) == want
        assert tree.root(size) == want
    assert roots[0] == EMPTY_ROOT


def test_hash_prefixes_separate_leaves_from_nodes():
    a, b = leaf_hash(b"a"), leaf_hash(b"b")
    assert leaf_hash(a + b) != node_hash(a, b)
    assert node_hash(a, b) != node_hash(b, a)


def test_generation_rejects_out_of_range():
    tree = MerkleTree([leaf_hash(bytes([i])) for i in range(5)])
    with pytest.raises(TreeSizeError):
        tree.inclusion_proof(5, 5)
    with pytest.raises(TreeSizeError):
        tree.inclusion_proof(0, 6)
    with pytest.raises(TreeSizeError):
        tree.consistency_proof(0, 3)
    with pytest.raises(TreeSizeError):
        tree.consistency_proof(4, 3)
    with pytest.raises(TreeSizeError):
        tree.root(6)


def _leaves(n):
    return [f"leaf-{i}".encode() for i in range(n)]


def _flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8 % len(out)] ^= 1 << (bit % 8)
    return bytes(out)


# One tree of 300 leaves serves every example: roots of smaller sizes come from the same tree.
TREE = MerkleTree([leaf_hash(x) for x in _leaves(300)])
LEAVES = _leaves(300)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))))
def test_inclusion_proofs_verify_and_match_reference(size_index):
    size, index = size_index
    proof = TREE.inclusion_proof(index, size)
    root = TREE.root(size)
    assert root == merkle_tree_hash(LEAVES[:size])
    verify_inclusion(leaf_hash(LEAVES[index]), index, size, proof, root)


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))), st.data())
def test_tampered_inclusion_proofs_fail(size_index, data):
    size, index = size_index
    proof = TREE.inclusion_proof(index, size)
    root, lh = TREE.root(size), leaf_hash(LEAVES[index])
    bit = data.draw(st.integers(0, 255))
    if proof:
        k = data.draw(st.integers(0, len(proof) - 1))
        bad = proof[:k] + [_flip(proof[k], bit)] + proof[k + 1 :]
        with pytest.raises(InvalidProofError):
            verify_inclusion(lh, index, size, bad, root)
    with pytest.raises(InvalidProofError):
        verify_inclusion(_flip(lh, bit), index, size, proof, root)
    with pytest.raises(InvalidProofError):
        verify_inclusion(lh, index, size, proof, _flip(root, bit))
    other = data.draw(st.integers(0, size - 1).filter(lambda i: i != index))
    with pytest.raises(InvalidProofError):
        verify_inclusion(lh, other, size, proof, root)
    # A wrong size is checked against the root of that size: an inclusion proof binds the size
    # only through the root (the STH signs both), e.g. leaf 0's path is shaped alike in sizes 5, 6.
    wrong = data.draw(st.integers(max(1, index), 300).filter(lambda n: n != size))
    with pytest.raises(InvalidProofError):
        verify_inclusion(lh, index, wrong, proof, TREE.root(wrong))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.integers(1, n), st.just(n))))
def test_consistency_proofs_verify(sizes):
    first, second = sizes
    proof = TREE.consistency_proof(first, second)
    verify_consistency(first, second, proof, TREE.root(first), TREE.root(second))
    assert (proof == []) == (first == second)


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 300).flatmap(lambda n: st.tuples(st.integers(1, n - 1), st.just(n))), st.data())
def test_tampered_consistency_proofs_fail(sizes, data):
    first, second = sizes
    proof = TREE.consistency_proof(first, second)
    r1, r2 = TREE.root(first), TREE.root(second)
    bit = data.draw(st.integers(0, 255))
    k = data.draw(st.integers(0, len(proof) - 1))
    bad = proof[:k] + [_flip(proof[k], bit)] + proof[k + 1 :]
    with pytest.raises(InvalidProofError):
        verify_consistency(first, second, bad, r1, r2)
    with pytest.raises(InvalidProofError):
        verify_consistency(first, second, proof, _flip(r1, bit), r2)
    with pytest.raises(InvalidProofError):
        verify_consistency(first, second, proof, r1, _flip(r2, bit))
    with pytest.raises(InvalidProofError):
        verify_consistency(first, second, proof[:-1], r1, r2)
    f2 = data.draw(st.integers(1, second).filter(lambda m: m != first))
    with pytest.raises(InvalidProofError):
        verify_consistency(f2, second, proof, TREE.root(f2), r2)
    s2 = data.draw(st.integers(first + 1, 300).filter(lambda n: n != second))
    with pytest.raises(InvalidProofError):
        verify_consistency(first, s2, proof, r1, TREE.root(s2))
