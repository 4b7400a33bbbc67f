"""OHTTP key configurations and application/ohttp-keys (RFC 9458 §3)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vectors import shared_vectors
from traceless.privacy.errors import UnsupportedAlgorithmError
from traceless.privacy.hpke import kem as hpke_kem
from traceless.privacy.hpke.aead import AeadId
from traceless.privacy.hpke.kdf import KdfId
from traceless.privacy.hpke.kem import KemId
from traceless.privacy.ohttp.errors import KeyConfigError
from traceless.privacy.ohttp.keys import KeyConfig, SymmetricAlgorithm, decode_ohttp_keys, encode_ohttp_keys

VECTOR = shared_vectors("ohttp/rfc9458-appendix-a.json")
APPENDIX_CONFIG = bytes.fromhex(VECTOR["key_config"])


def _config(key_id: int = 1, kem_id: KemId = KemId.DHKEM_X25519_HKDF_SHA256, pairs=((1, 1),)) -> KeyConfig:
    pk = hpke_kem.generate_key_pair(kem_id).public_key_bytes
    return KeyConfig(key_id, kem_id, pk, tuple(SymmetricAlgorithm(k, a) for k, a in pairs))


def test_appendix_a_key_config_decodes_and_reencodes() -> None:
    config = KeyConfig.decode(APPENDIX_CONFIG)
    assert config.key_id == 1
    assert config.kem_id is KemId.DHKEM_X25519_HKDF_SHA256
    assert config.public_key == APPENDIX_CONFIG[3:35]
    assert config.symmetric_algorithms == (
        SymmetricAlgorithm(KdfId.HKDF_SHA256, AeadId.AES_128_GCM),
        SymmetricAlgorithm(KdfId.HKDF_SHA256, AeadId.CHACHA20_POLY1305),
    )
    assert config.encode() == APPENDIX_CONFIG


def test_ohttp_keys_prefixes_each_config_with_its_length() -> None:
    other = _config(7, KemId.DHKEM_P256_HKDF_SHA256, ((1, 2), (3, 1)))
    body = encode_ohttp_keys([KeyConfig.decode(APPENDIX_CONFIG), other])
    assert body[:2] == len(APPENDIX_CONFIG).to_bytes(2, "big")
    assert body[2 : 2 + len(APPENDIX_CONFIG)] == APPENDIX_CONFIG
    assert decode_ohttp_keys(body) == (KeyConfig.decode(APPENDIX_CONFIG), other)


def test_configs_with_unknown_kems_are_skipped_not_misparsed() -> None:
    unknown = bytes([9]) + (0x0042).to_bytes(2, "big") + b"\xaa" * 40 + b"\x00\x04\x00\x01\x00\x01"
    known = encode_ohttp_keys([KeyConfig.decode(APPENDIX_CONFIG)])
    body = len(unknown).to_bytes(2, "big") + unknown + known
    assert decode_ohttp_keys(body) == (KeyConfig.decode(APPENDIX_CONFIG),)
    with pytest.raises(UnsupportedAlgorithmError):
        KeyConfig.decode(unknown)


@pytest.mark.parametrize(
    "body",
    [
        b"",  # empty collection
        b"\x00",  # half a length
        len(APPENDIX_CONFIG).to_bytes(2, "big") + APPENDIX_CONFIG[:-1],  # config cut short
        (len(APPENDIX_CONFIG) + 1).to_bytes(2, "big") + APPENDIX_CONFIG + b"\x00",  # trailing byte
        b"\x00\x02\x01\x00",  # shorter than key id + KEM id
        b"\x00\x00",  # zero-length config
    ],
)
def test_malformed_ohttp_keys_reject_the_whole_body(body: bytes) -> None:
    with pytest.raises(KeyConfigError):
        decode_ohttp_keys(body)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c[:-1],  # half a pair
        lambda c: c[:35] + b"\x00\x00",  # zero symmetric algorithms
        lambda c: c[:35] + b"\x00\x03\x00\x01\x00",  # length not a multiple of 4
        lambda c: c[:35] + b"\x00\x0c" + c[37:],  # length beyond the data
        lambda c: c + b"\x00",  # trailing byte
        lambda c: c[:20],  # public key cut short
        lambda c: b"",
    ],
)
def test_malformed_key_config_is_a_typed_error(mutate) -> None:
    with pytest.raises(KeyConfigError):
        KeyConfig.decode(mutate(APPENDIX_CONFIG))


def test_invalid_public_key_and_fields_are_rejected() -> None:
    with pytest.raises(KeyConfigError):  # not a point on P-256
        not_on_curve = b"\x04" + b"\x01" * 64
        KeyConfig(1, KemId.DHKEM_P256_HKDF_SHA256, not_on_curve, (SymmetricAlgorithm(1, 1),))
    with pytest.raises(KeyConfigError):
        _config(key_id=256)
    with pytest.raises(KeyConfigError):
        _config(pairs=())
    with pytest.raises(KeyConfigError):
        SymmetricAlgorithm(0x10000, 1)
    with pytest.raises(UnsupportedAlgorithmError):
        KeyConfig(1, 0x0099, b"", (SymmetricAlgorithm(1, 1),))  # type: ignore[arg-type]


def test_select_prefers_the_first_supported_pair() -> None:
    config = _config(pairs=((0x0099, 1), (1, AeadId.EXPORT_ONLY), (1, 3), (1, 1)))
    algorithm, suite = config.select()
    assert algorithm == SymmetricAlgorithm(1, 3) and suite.aead_id is AeadId.CHACHA20_POLY1305
    assert config.select(SymmetricAlgorithm(1, 1))[0] == SymmetricAlgorithm(1, 1)
    with pytest.raises(UnsupportedAlgorithmError):  # not offered
        config.select(SymmetricAlgorithm(1, 2))
    with pytest.raises(UnsupportedAlgorithmError):  # offered but unknown to us
        config.select(SymmetricAlgorithm(0x0099, 1))
    with pytest.raises(UnsupportedAlgorithmError):
        _config(pairs=((0x0099, 1), (1, AeadId.EXPORT_ONLY))).select()


_pairs = st.lists(st.tuples(st.integers(0, 0xFFFF), st.integers(0, 0xFFFF)), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(key_id=st.integers(0, 255), kem_id=st.sampled_from(list(KemId)), pairs=_pairs)
def test_key_config_round_trip(key_id: int, kem_id: KemId, pairs) -> None:
    config = _config(key_id, kem_id, pairs)
    assert KeyConfig.decode(config.encode()) == config
    assert decode_ohttp_keys(encode_ohttp_keys([config, config])) == (config, config)


@settings(max_examples=300, deadline=None)
@given(
    body=st.one_of(
        st.binary(max_size=120),
        st.binary(max_size=60).map(lambda b: b"\x00\x2d" + APPENDIX_CONFIG + b),
    )
)
def test_arbitrary_bytes_never_crash_the_keys_decoder(body: bytes) -> None:
    try:
        decode_ohttp_keys(body)
    except KeyConfigError:
        pass
