"""HPKE base mode against RFC 9180 Appendix A, plus state and error properties."""

from __future__ import annotations

import itertools

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vectors import shared_vectors
from traceless.privacy.errors import DecryptError, MalformedMessageError, UnsupportedAlgorithmError
from traceless.privacy.hpke import context as hpke
from traceless.privacy.hpke import kem as hpke_kem
from traceless.privacy.hpke.aead import AeadId
from traceless.privacy.hpke.context import Suite
from traceless.privacy.hpke.kdf import KdfId
from traceless.privacy.hpke.kem import KEM_PARAMS, KemId

ALL_VECTORS = shared_vectors("hpke/rfc9180-appendix-a.json")["vectors"]
BASE_VECTORS = [v for v in ALL_VECTORS if v["mode"] == hpke.MODE_BASE]
SEALING_AEADS = [AeadId.AES_128_GCM, AeadId.AES_256_GCM, AeadId.CHACHA20_POLY1305]
ALL_SUITES = [Suite(k, f, a) for k, f, a in itertools.product(KemId, KdfId, SEALING_AEADS)]


def _ids(v: dict) -> str:
    return v["suite"]


def _h(s: str) -> bytes:
    return bytes.fromhex(s)


def _suite(v: dict) -> Suite:
    return Suite.from_ids(v["kem_id"], v["kdf_id"], v["aead_id"])


def _sender(v: dict) -> tuple[bytes, hpke.SenderContext]:
    suite = _suite(v)
    eph = hpke_kem.deserialize_private_key(suite.kem_id, _h(v["skEm"]))
    return hpke.setup_base_s(suite, _h(v["pkRm"]), _h(v["info"]), _ephemeral_for_tests=eph)


def _recipient(v: dict) -> hpke.RecipientContext:
    suite = _suite(v)
    sk_r = hpke_kem.deserialize_private_key(suite.kem_id, _h(v["skRm"]))
    return hpke.setup_base_r(suite, _h(v["enc"]), sk_r, _h(v["info"]))


def test_every_base_suite_in_the_appendix_is_supported() -> None:
    # Appendix A has 7 suites; base mode of each must load (none silently dropped).
    assert len(BASE_VECTORS) == 7
    aeads = {_suite(v).aead_id for v in BASE_VECTORS}
    assert aeads >= {AeadId.AES_128_GCM, AeadId.CHACHA20_POLY1305}


@pytest.mark.parametrize("v", BASE_VECTORS, ids=_ids)
def test_derive_key_pair_matches_vector(v: dict) -> None:
    kem_id = _suite(v).kem_id
    assert hpke_kem.derive_key_pair(kem_id, _h(v["ikmE"])).public_key_bytes == _h(v["pkEm"])
    assert hpke_kem.derive_key_pair(kem_id, _h(v["ikmR"])).public_key_bytes == _h(v["pkRm"])
    assert hpke_kem.deserialize_private_key(kem_id, _h(v["skRm"])).public_key_bytes == _h(v["pkRm"])


@pytest.mark.parametrize("v", BASE_VECTORS, ids=_ids)
def test_encap_and_key_schedule_match_vector(v: dict) -> None:
    suite = _suite(v)
    eph = hpke_kem.deserialize_private_key(suite.kem_id, _h(v["skEm"]))
    shared_secret, enc = hpke_kem.encap(suite.kem_id, _h(v["pkRm"]), eph)
    assert enc == _h(v["enc"])
    assert shared_secret == _h(v["shared_secret"])
    sk_r = hpke_kem.deserialize_private_key(suite.kem_id, _h(v["skRm"]))
    assert hpke_kem.decap(enc, sk_r) == _h(v["shared_secret"])
    schedule = hpke.key_schedule_base(suite, shared_secret, _h(v["info"]))
    assert schedule.key == _h(v["key"])
    assert schedule.base_nonce == _h(v["base_nonce"])
    assert schedule.exporter_secret == _h(v["exporter_secret"])


@pytest.mark.parametrize("v", [v for v in BASE_VECTORS if "encryptions" in v], ids=_ids)
def test_seal_and_open_match_vector_at_every_sequence_number(v: dict) -> None:
    enc, sender = _sender(v)
    assert enc == _h(v["enc"])
    recipient = _recipient(v)
    for e in v["encryptions"]:
        # Vectors skip sequence numbers (…4, 255, 256); fill the gaps with throwaway messages.
        while sender.seq < e["sequence number"]:
            recipient.open(b"gap", sender.seal(b"gap", b""))
        assert sender.seal(_h(e["aad"]), _h(e["pt"])) == _h(e["ct"])
        assert recipient.open(_h(e["aad"]), _h(e["ct"])) == _h(e["pt"])
    assert sender.seq == recipient.seq == v["encryptions"][-1]["sequence number"] + 1


@pytest.mark.parametrize("v", BASE_VECTORS, ids=_ids)
def test_exports_match_vector_on_both_sides(v: dict) -> None:
    _, sender = _sender(v)
    recipient = _recipient(v)
    assert v["exports"], "every suite has export vectors"
    for x in v["exports"]:
        want = _h(x["exported_value"])
        assert sender.export(_h(x["exporter_context"]), x["L"]) == want
        assert recipient.export(_h(x["exporter_context"]), x["L"]) == want


def test_export_only_suite_refuses_seal_and_open() -> None:
    v = next(v for v in BASE_VECTORS if v["aead_id"] == AeadId.EXPORT_ONLY)
    _, sender = _sender(v)
    with pytest.raises(UnsupportedAlgorithmError):
        sender.seal(b"", b"pt")
    with pytest.raises(UnsupportedAlgorithmError):
        _recipient(v).open(b"", b"\x00" * 16)


def test_failed_open_changes_no_state() -> None:
    v = BASE_VECTORS[0]
    recipient = _recipient(v)
    first = v["encryptions"][0]
    bad = bytearray(_h(first["ct"]))
    bad[-1] ^= 1
    for tampered in (bytes(bad), b"", _h(first["ct"])[:-1], _h(first["ct"]) + b"\x00"):
        with pytest.raises(DecryptError) as info:
            recipient.open(_h(first["aad"]), tampered)
        assert str(info.value) == "decryption failed"
        assert info.value.__cause__ is None and info.value.__suppress_context__
        assert recipient.seq == 0
    with pytest.raises(DecryptError):
        recipient.open(b"wrong aad", _h(first["ct"]))
    assert recipient.open(_h(first["aad"]), _h(first["ct"])) == _h(first["pt"])
    assert recipient.seq == 1


def test_setup_base_r_rejects_bad_enc_opaquely() -> None:
    sk = hpke_kem.generate_key_pair(KemId.DHKEM_P256_HKDF_SHA256)
    suite = Suite(KemId.DHKEM_P256_HKDF_SHA256, KdfId.HKDF_SHA256, AeadId.AES_128_GCM)
    not_on_curve = b"\x04" + b"\x01" * 64
    for enc in (b"", not_on_curve, sk.public_key_bytes[:-1]):
        with pytest.raises(DecryptError):
            hpke.setup_base_r(suite, enc, sk, b"info")
    x_sk = hpke_kem.generate_key_pair(KemId.DHKEM_X25519_HKDF_SHA256)
    x_suite = Suite(KemId.DHKEM_X25519_HKDF_SHA256, KdfId.HKDF_SHA256, AeadId.AES_128_GCM)
    with pytest.raises(DecryptError):  # low-order point: all-zero DH output
        hpke.setup_base_r(x_suite, bytes(32), x_sk, b"info")
    with pytest.raises(MalformedMessageError):
        hpke.setup_base_s(x_suite, bytes(32), b"info")


@pytest.mark.parametrize(
    ("kem", "kdf", "aead"),
    [(0x0022, 1, 1), (0x0020, 0x0004, 1), (0x0020, 1, 0x0004), (0, 0, 0), (0xFFFF, 1, 1)],
)
def test_unknown_algorithm_ids_are_typed_errors(kem: int, kdf: int, aead: int) -> None:
    with pytest.raises(UnsupportedAlgorithmError):
        Suite.from_ids(kem, kdf, aead)


def test_nist_group_orders_are_right() -> None:
    # (order - 1) * G = -G has G's x coordinate; a wrong constant would break DeriveKeyPair.
    for params in (p for p in KEM_PARAMS.values() if p.curve is not None):
        g = ec.derive_private_key(1, params.curve()).public_key().public_numbers()
        minus_g_key = ec.derive_private_key(params.order - 1, params.curve()).public_key()
        minus_g = minus_g_key.public_numbers()
        assert (g.x, g.y) != (minus_g.x, minus_g.y) and g.x == minus_g.x
        with pytest.raises(ValueError):
            hpke_kem.deserialize_private_key(
                next(k for k, p in KEM_PARAMS.items() if p == params), params.order.to_bytes(params.n_sk, "big")
            )


def test_repr_redacts_key_material() -> None:
    sk = hpke_kem.generate_key_pair(KemId.DHKEM_X25519_HKDF_SHA256)
    suite = Suite(KemId.DHKEM_X25519_HKDF_SHA256, KdfId.HKDF_SHA256, AeadId.AES_128_GCM)
    _, ctx = hpke.setup_base_s(suite, sk.public_key_bytes, b"")
    assert "redacted" in repr(sk) and "redacted" in repr(ctx)
    assert ctx._aead is not None and "redacted" in repr(ctx._aead)


@settings(max_examples=60, deadline=None)
@given(
    suite=st.sampled_from(ALL_SUITES),
    info=st.binary(max_size=64),
    aad=st.binary(max_size=64),
    pt=st.binary(max_size=512),
    data=st.data(),
)
def test_single_shot_round_trip_and_bit_flips(suite: Suite, info: bytes, aad: bytes, pt: bytes, data) -> None:
    sk = hpke_kem.generate_key_pair(suite.kem_id)
    enc, ct = hpke.seal_base(suite, sk.public_key_bytes, info, aad, pt)
    assert len(enc) == suite.n_enc and len(ct) == len(pt) + suite.n_t
    assert hpke.open_base(suite, enc, sk, info, aad, ct) == pt
    blob = bytearray(enc + ct)
    bit = data.draw(st.integers(0, 8 * len(blob) - 1), label="bit")
    blob[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(DecryptError):
        hpke.open_base(suite, bytes(blob[: len(enc)]), sk, info, aad, bytes(blob[len(enc) :]))
