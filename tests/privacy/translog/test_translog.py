"""The on-disk transparency log: persistence, proofs, signed heads, and refusing bad directories."""

import json
import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization

from traceless.privacy.translog import log as tl
from traceless.privacy.translog.log import (
    DuplicateLeafError,
    InsecureKeyFileError,
    LeafNotFoundError,
    LogCorruptError,
    LogExistsError,
    LogNotFoundError,
    LogTruncatedError,
    TransparencyLog,
)
from traceless.privacy.translog.merkle import (
    TreeSizeError,
    leaf_hash,
    merkle_tree_hash,
    verify_consistency,
    verify_inclusion,
)
from traceless.privacy.translog.tree_head import SignedTreeHead, TreeHeadError

LEAVES = [bytes([i]) * 32 for i in range(7)]


@pytest.fixture
def log(tmp_path):
    log = TransparencyLog.create(tmp_path / "log")
    log.append_batch(LEAVES[:4])
    for leaf in LEAVES[4:]:
        log.append(leaf)
    return log


def test_new_log_is_empty_and_signed(tmp_path):
    log = TransparencyLog.create(tmp_path / "log")
    assert log.tree_size == 0 and log.sth.root_hash == merkle_tree_hash([])
    log.sth.verify(log.public_key)
    with pytest.raises(LogExistsError):
        TransparencyLog.create(tmp_path / "log")
    with pytest.raises(LogNotFoundError):
        TransparencyLog.open(tmp_path / "nothing-here")


def test_append_reopen_and_proofs_verify(log, tmp_path):
    reopened = TransparencyLog.open(tmp_path / "log")
    sth = reopened.sth
    assert sth == log.sth and sth.tree_size == 7
    assert sth.root_hash == merkle_tree_hash(LEAVES)
    sth.verify(reopened.public_key)
    assert reopened.get_entries(0, 6) == LEAVES
    assert reopened.get_entries(2, 3) == LEAVES[2:4]
    for size in range(1, 8):
        root = merkle_tree_hash(LEAVES[:size])
        for i in range(size):
            proof = reopened.inclusion_proof(leaf_hash(LEAVES[i]), size)
            assert proof.leaf_index == i and proof.tree_size == size
            verify_inclusion(leaf_hash(LEAVES[i]), i, size, proof.inclusion_path, root)
        verify_consistency(size, 7, reopened.consistency_proof(size, 7), root, sth.root_hash)


def test_lookups_out_of_range(log):
    with pytest.raises(LeafNotFoundError):
        log.inclusion_proof(leaf_hash(b"not there"))
    with pytest.raises(LeafNotFoundError):  # present, but not in the tree of size 3
        log.inclusion_proof(leaf_hash(LEAVES[5]), 3)
    for start, end in ((0, 7), (-1, 3), (4, 3)):
        with pytest.raises(TreeSizeError):
            log.get_entries(start, end)
    for first, second in ((3, 8), (0, 3), (5, 4)):
        with pytest.raises(TreeSizeError):
            log.consistency_proof(first, second)
    for size in (0, 8):
        with pytest.raises(TreeSizeError):
            log.inclusion_proof(leaf_hash(LEAVES[0]), size)


def test_duplicates_are_refused(log):
    with pytest.raises(DuplicateLeafError):
        log.append(LEAVES[2])
    with pytest.raises(DuplicateLeafError):
        log.append_batch([b"new", b"new"])
    assert log.tree_size == 7


def test_timestamps_never_go_back(log):
    before = log.sth.timestamp
    assert log.append(b"later").sth.timestamp >= before


def test_key_files(log, tmp_path):
    key_path = tmp_path / "log" / tl.SIGNING_KEY
    assert stat.S_IMODE(os.stat(key_path).st_mode) == 0o600
    key = serialization.load_pem_private_key(key_path.read_bytes(), None)
    assert key.public_key() == log.public_key
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    for name in (tl.ENTRIES, tl.STH, tl.PUBLIC_KEY):  # the secret is in the key file only
        assert raw not in (tmp_path / "log" / name).read_bytes()
    os.chmod(key_path, 0o644)
    with pytest.raises(InsecureKeyFileError):
        log.append(b"x")


def test_other_process_appends_are_seen_after_refresh(log, tmp_path):
    reader = TransparencyLog.open(tmp_path / "log")
    assert reader.refresh() is False
    log.append(b"eighth")
    assert reader.tree_size == 7
    assert reader.refresh() is True and reader.tree_size == 8
    assert reader.sth == log.sth


def _entries(tmp_path):
    return tmp_path / "log" / tl.ENTRIES


def test_truncated_entries_are_refused(log, tmp_path):
    data = _entries(tmp_path).read_bytes()
    for cut in (1, 33, len(data) - len(tl.MAGIC) - 1):
        _entries(tmp_path).write_bytes(data[: len(data) - cut])
        with pytest.raises(LogTruncatedError):
            TransparencyLog.open(tmp_path / "log")


@pytest.mark.parametrize("offset", [0, len(tl.MAGIC) + 2, len(tl.MAGIC) + 5, -1])
def test_corrupted_entries_are_refused(log, tmp_path, offset):
    data = bytearray(_entries(tmp_path).read_bytes())
    data[offset] ^= 0x01  # header, record length, leaf byte, last checksum byte
    _entries(tmp_path).write_bytes(bytes(data))
    with pytest.raises(LogCorruptError):
        TransparencyLog.open(tmp_path / "log")


def test_rewritten_entry_with_matching_checksum_is_refused(log, tmp_path):
    # Replace leaf 0 by another 32-byte leaf with a valid checksum: only the signed root catches it.
    data = bytearray(_entries(tmp_path).read_bytes())
    start = len(tl.MAGIC) + 4
    forged = b"\xff" * 32
    data[start : start + 64] = forged + leaf_hash(forged)
    _entries(tmp_path).write_bytes(bytes(data))
    with pytest.raises(LogCorruptError, match="root"):
        TransparencyLog.open(tmp_path / "log")


def test_tampered_tree_head_is_refused(log, tmp_path):
    path = tmp_path / "log" / tl.STH
    head = json.loads(path.read_text())
    head["timestamp"] += 1
    path.write_text(json.dumps(head))
    with pytest.raises(LogCorruptError, match="signature"):
        TransparencyLog.open(tmp_path / "log")
    path.write_text("{not json")
    with pytest.raises(LogCorruptError):
        TransparencyLog.open(tmp_path / "log")


def test_missing_file_is_refused(log, tmp_path):
    (tmp_path / "log" / tl.PUBLIC_KEY).unlink()
    with pytest.raises(LogCorruptError):
        TransparencyLog.open(tmp_path / "log")


def test_unsigned_tail_from_a_crashed_append_is_dropped(log, tmp_path):
    with open(_entries(tmp_path), "ab") as f:  # a record written, but its tree head never was
        f.write(len(b"ghost").to_bytes(4, "big") + b"ghost" + leaf_hash(b"ghost")[:10])
    reopened = TransparencyLog.open(tmp_path / "log")
    assert reopened.tree_size == 7
    reopened.append(b"real")
    again = TransparencyLog.open(tmp_path / "log")
    assert again.get_entries(0, 7) == LEAVES + [b"real"]
    assert again.sth.root_hash == merkle_tree_hash(LEAVES + [b"real"])


def test_thousands_of_entries(tmp_path):
    log = TransparencyLog.create(tmp_path / "log")
    leaves = [i.to_bytes(4, "big") for i in range(3000)]
    log.append_batch(leaves[:2999])
    log.append(leaves[2999])
    reopened = TransparencyLog.open(tmp_path / "log")
    assert reopened.sth.root_hash == merkle_tree_hash(leaves)
    proof = reopened.inclusion_proof(leaf_hash(leaves[1234]))
    verify_inclusion(leaf_hash(leaves[1234]), 1234, 3000, proof.inclusion_path, reopened.sth.root_hash)
    verify_consistency(
        1000, 3000, reopened.consistency_proof(1000, 3000), merkle_tree_hash(leaves[:1000]), reopened.sth.root_hash
    )


def test_tree_head_json_round_trip_and_rejects_malformed(log):
    sth = log.sth
    assert SignedTreeHead.from_json(json.loads(json.dumps(sth.to_json()))) == sth
    for bad in (
        {},
        [],
        {**sth.to_json(), "tree_size": -1},
        {**sth.to_json(), "root_hash": "AA=="},
        {**sth.to_json(), "tree_size": True},
        {**sth.to_json(), "signature": "!!"},
    ):
        with pytest.raises(TreeHeadError):
            SignedTreeHead.from_json(bad)
    forged = SignedTreeHead(sth.tree_size + 1, sth.timestamp, sth.root_hash, sth.signature)
    with pytest.raises(TreeHeadError):
        forged.verify(log.public_key)


def test_tree_head_signature_input_is_the_documented_encoding(log):
    from traceless.privacy.translog.tree_head import tree_head_signature_input

    root = bytes(range(32))
    want = b"traceless/sth/v1\x00" + (7).to_bytes(8, "big") + (1234).to_bytes(8, "big") + root
    assert tree_head_signature_input(7, 1234, root) == want
    sth = log.sth
    log.public_key.verify(sth.signature, tree_head_signature_input(sth.tree_size, sth.timestamp, sth.root_hash))
    with pytest.raises(TreeHeadError):
        tree_head_signature_input(2**64, 0, root)
