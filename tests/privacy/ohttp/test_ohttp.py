"""Oblivious HTTP requests and responses (RFC 9458 §4): Appendix A byte-for-byte, round trips,
tampering, bad input and the memory-only gateway key."""

from __future__ import annotations

import copy
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vectors import shared_vectors
from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.errors import DecryptError, MalformedMessageError, UnsupportedAlgorithmError
from traceless.privacy.hpke.aead import AeadId
from traceless.privacy.hpke.kem import KemId
from traceless.privacy.ohttp.encap import REQUEST_LABEL, RequestHeader
from traceless.privacy.ohttp.errors import MessageTooLargeError, UnknownKeyIdError
from traceless.privacy.ohttp.gateway import DEFAULT_SYMMETRIC_ALGORITHMS, OhttpServer, encapsulate_request
from traceless.privacy.ohttp.keys import KeyConfig, SymmetricAlgorithm

V = shared_vectors("ohttp/rfc9458-appendix-a.json")
H = bytes.fromhex
APPENDIX_ALGORITHMS = (SymmetricAlgorithm(1, 1), SymmetricAlgorithm(1, 3))
HEADER_AND_ENC = 7 + 32  # X25519: Nenc = 32


def _appendix_server() -> OhttpServer:
    secret_key = H(V["gateway_x25519_secret_key"])
    return OhttpServer(1, symmetric_algorithms=APPENDIX_ALGORITHMS, _secret_key_for_tests=secret_key)


def _flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


# ---- RFC 9458 Appendix A ----------------------------------------------------------------------


def test_appendix_a_key_config_and_info() -> None:
    server = _appendix_server()
    assert server.key_config.encode() == H(V["key_config"])
    assert server.ohttp_keys() == len(H(V["key_config"])).to_bytes(2, "big") + H(V["key_config"])
    assert RequestHeader(1, 0x20, 1, 1).info(REQUEST_LABEL) == H(V["hpke_info"])


def test_appendix_a_request_is_reproduced_byte_for_byte() -> None:
    config = KeyConfig.decode(H(V["key_config"]))
    ephemeral = H(V["client_ephemeral_secret_key"])
    enc_request, _ = encapsulate_request(config, H(V["request_bhttp"]), _ephemeral_secret_key_for_tests=ephemeral)
    assert enc_request == H(V["encapsulated_request"])
    assert enc_request[7:39] == H(V["client_ephemeral_public_key"])


def test_appendix_a_gateway_decapsulates_and_answers_byte_for_byte() -> None:
    request, response_ctx = _appendix_server().decapsulate_request(H(V["encapsulated_request"]))
    assert request == H(V["request_bhttp"])
    assert bhttp.decode_request(request).authority == b"example.com"
    secret = response_ctx.secret
    assert secret.secret == H(V["response_export_secret"])
    assert secret.enc + H(V["response_nonce"]) == H(V["response_salt"])
    nonce = H(V["response_nonce"])
    assert secret.derive(nonce) == (H(V["response_aead_key"]), H(V["response_aead_nonce"]))
    enc_response = response_ctx.encapsulate(H(V["response_bhttp"]), _response_nonce_for_tests=nonce)
    assert enc_response == H(V["encapsulated_response"])


def test_appendix_a_client_decapsulates_the_response() -> None:
    config = KeyConfig.decode(H(V["key_config"]))
    ephemeral = H(V["client_ephemeral_secret_key"])
    _, client_ctx = encapsulate_request(config, H(V["request_bhttp"]), _ephemeral_secret_key_for_tests=ephemeral)
    assert client_ctx.secret.secret == H(V["response_export_secret"])
    assert client_ctx.decapsulate(H(V["encapsulated_response"])) == H(V["response_bhttp"])
    assert bhttp.decode_response(H(V["response_bhttp"])).status == 200


# ---- normal operation -------------------------------------------------------------------------


def test_fresh_keys_and_nonces_each_time() -> None:
    a, b = OhttpServer(1), OhttpServer(1)
    assert a.key_config.public_key != b.key_config.public_key
    r1, _ = encapsulate_request(a.key_config, b"x")
    r2, _ = encapsulate_request(a.key_config, b"x")
    assert r1[7:39] != r2[7:39]  # fresh ephemeral key per request
    _, ctx = a.decapsulate_request(r1)
    assert ctx.encapsulate(b"y")[:16] != ctx.encapsulate(b"y")[:16]  # fresh response nonce


@settings(max_examples=40, deadline=None)
@given(
    request=st.binary(max_size=2000),
    response=st.binary(max_size=2000),
    algorithm=st.sampled_from(DEFAULT_SYMMETRIC_ALGORITHMS),
)
def test_round_trip(request: bytes, response: bytes, algorithm: SymmetricAlgorithm) -> None:
    server = OhttpServer(3)
    enc_request, client_ctx = encapsulate_request(server.key_config, request, symmetric_algorithm=algorithm)
    ids = (0x20, algorithm.kdf_id, algorithm.aead_id)
    assert enc_request[1:7] == b"".join(i.to_bytes(2, "big") for i in ids)
    got, server_ctx = server.decapsulate_request(enc_request)
    assert got == request
    assert client_ctx.decapsulate(server_ctx.encapsulate(response)) == response


@pytest.mark.parametrize("kem_id", list(KemId))
def test_round_trip_for_every_kem(kem_id: KemId) -> None:
    server = OhttpServer(9, kem_id=kem_id)
    enc_request, client_ctx = encapsulate_request(server.key_config, b"ping")
    request, server_ctx = server.decapsulate_request(enc_request)
    assert request == b"ping" and client_ctx.decapsulate(server_ctx.encapsulate(b"pong")) == b"pong"


# ---- tampering --------------------------------------------------------------------------------

_SERVER = OhttpServer(5)
_GOOD_REQUEST, _GOOD_CLIENT = encapsulate_request(_SERVER.key_config, b"the request body")
_GOOD_RESPONSE = _SERVER.decapsulate_request(_GOOD_REQUEST)[1].encapsulate(b"the response body")


def _assert_request_rejected(enc_request: bytes, bit: int) -> None:
    tampered = _flip(enc_request, bit)
    # The 7-byte header is public: a changed key id or algorithm gets its own typed error (or,
    # if it names another allowed pair, fails decryption). Past the header only DecryptError.
    header_errors = (UnknownKeyIdError, UnsupportedAlgorithmError, DecryptError)
    expected = header_errors if bit < 56 else DecryptError
    with pytest.raises(expected) as info:
        _SERVER.decapsulate_request(tampered)
    if isinstance(info.value, DecryptError):
        assert str(info.value) == "decryption failed"


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=300), data=st.data())
def test_any_flipped_request_bit_is_rejected_and_changes_no_state(body: bytes, data) -> None:
    enc_request, _ = encapsulate_request(_SERVER.key_config, body)
    bit = data.draw(st.integers(0, 8 * len(enc_request) - 1), label="bit")
    _assert_request_rejected(enc_request, bit)
    # The server is unchanged: the untouched request (and an older one) still decapsulate.
    assert _SERVER.decapsulate_request(enc_request)[0] == body
    assert _SERVER.decapsulate_request(_GOOD_REQUEST)[0] == b"the request body"


def test_every_single_bit_flip_of_one_request_is_rejected() -> None:
    for bit in range(8 * len(_GOOD_REQUEST)):
        _assert_request_rejected(_GOOD_REQUEST, bit)
    assert _SERVER.decapsulate_request(_GOOD_REQUEST)[0] == b"the request body"


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=300), data=st.data())
def test_any_flipped_response_bit_is_rejected(body: bytes, data) -> None:
    enc_response = _SERVER.decapsulate_request(_GOOD_REQUEST)[1].encapsulate(body)
    bit = data.draw(st.integers(0, 8 * len(enc_response) - 1), label="bit")
    with pytest.raises(DecryptError):
        _GOOD_CLIENT.decapsulate(_flip(enc_response, bit))
    assert _GOOD_CLIENT.decapsulate(enc_response) == body


def test_every_truncation_is_a_typed_error() -> None:
    for n in range(len(_GOOD_REQUEST)):
        expected = MalformedMessageError if n < HEADER_AND_ENC else DecryptError
        with pytest.raises(expected):
            _SERVER.decapsulate_request(_GOOD_REQUEST[:n])
    for n in range(len(_GOOD_RESPONSE)):
        with pytest.raises(DecryptError):
            _GOOD_CLIENT.decapsulate(_GOOD_RESPONSE[:n])
    with pytest.raises(DecryptError):
        _SERVER.decapsulate_request(_GOOD_REQUEST + b"\x00")
    with pytest.raises(DecryptError):
        _GOOD_CLIENT.decapsulate(_GOOD_RESPONSE + b"\x00")


def test_response_is_bound_to_its_request() -> None:
    _, other_client = encapsulate_request(_SERVER.key_config, b"the request body")
    with pytest.raises(DecryptError):
        other_client.decapsulate(_GOOD_RESPONSE)


# ---- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "error"),
    [
        (bytes([6]) + H("0020 0001 0001"), UnknownKeyIdError),
        (bytes([5]) + H("0010 0001 0001"), UnsupportedAlgorithmError),  # a KEM this key is not
        (bytes([5]) + H("0099 0001 0001"), UnsupportedAlgorithmError),  # unknown KEM
        (bytes([5]) + H("0020 0009 0001"), UnsupportedAlgorithmError),  # unknown KDF
        (bytes([5]) + H("0020 0001 0009"), UnsupportedAlgorithmError),  # unknown AEAD
        (bytes([5]) + H("0020 0003 0001"), UnsupportedAlgorithmError),  # known pair, not offered
        (bytes([5]) + H("0020 0001 ffff"), UnsupportedAlgorithmError),  # export-only
    ],
)
def test_header_errors_are_typed(header: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        _SERVER.decapsulate_request(header + _GOOD_REQUEST[7:])


def test_empty_and_oversized_requests() -> None:
    with pytest.raises(MalformedMessageError):
        _SERVER.decapsulate_request(b"")
    small = OhttpServer(5, max_request_length=64)
    request, _ = encapsulate_request(small.key_config, b"x" * 100)
    with pytest.raises(MessageTooLargeError):
        small.decapsulate_request(request)
    assert small.decapsulate_request(encapsulate_request(small.key_config, b"x")[0])[0] == b"x"


def test_server_refuses_algorithms_it_cannot_serve() -> None:
    with pytest.raises(UnsupportedAlgorithmError):
        OhttpServer(1, symmetric_algorithms=[SymmetricAlgorithm(1, AeadId.EXPORT_ONLY)])
    with pytest.raises(UnsupportedAlgorithmError):
        OhttpServer(1, symmetric_algorithms=[SymmetricAlgorithm(0x0042, 1)])


def test_decrypt_errors_are_indistinguishable() -> None:
    messages = set()
    last_bit = 8 * len(_GOOD_REQUEST) - 1
    for bad in (_flip(_GOOD_REQUEST, 60), _flip(_GOOD_REQUEST, last_bit), _GOOD_REQUEST[:-1]):
        with pytest.raises(DecryptError) as info:
            _SERVER.decapsulate_request(bad)
        messages.add((type(info.value), str(info.value), info.value.args, info.value.__cause__))
    assert messages == {(DecryptError, "decryption failed", ("decryption failed",), None)}


def test_gateway_key_is_memory_only() -> None:
    for obj in (_SERVER, _SERVER._private_key):
        with pytest.raises(TypeError):
            pickle.dumps(obj)
        with pytest.raises(TypeError):
            copy.deepcopy(obj)
        assert "redacted" in repr(obj)
    public_api = {name for name in dir(_SERVER) if not name.startswith("_")}
    assert public_api == {
        "key_config",
        "ohttp_keys",
        "decapsulate_request",
        "decapsulate_request_buffer",
        "decapsulate_chunked_request",
        "decapsulate_chunked_request_buffer",
    }


def test_decapsulate_into_a_wipeable_buffer() -> None:
    server = OhttpServer()
    enc, client = encapsulate_request(server.key_config, b"plaintext the node must wipe")
    buf, response = server.decapsulate_request_buffer(enc)
    assert isinstance(buf, bytearray) and bytes(buf) == b"plaintext the node must wipe"
    buf[:] = bytes(len(buf))  # the caller owns it: zeroing it leaves no copy behind in this object
    assert client.decapsulate(response.encapsulate(b"ok")) == b"ok"
    for bad in (_flip(enc, len(enc) * 8 - 1), enc[:-1]):
        with pytest.raises(DecryptError):
            server.decapsulate_request_buffer(bad)
