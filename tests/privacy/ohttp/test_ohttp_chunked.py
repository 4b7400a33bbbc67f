"""Chunked OHTTP (draft-ietf-ohai-chunked-ohttp): the draft's example byte-for-byte, streaming
decryption at arbitrary boundaries, tampering, truncation and trailing data."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vectors import local_vectors
from traceless.privacy.errors import DecryptError, MalformedMessageError
from traceless.privacy.hpke.aead import AeadKey
from traceless.privacy.ohttp import chunked as ohttp_chunked
from traceless.privacy.ohttp.chunked import (
    MAX_CHUNK_PLAINTEXT,
    ChunkedResponseDecryptor,
    encapsulate_chunked_request,
    split_chunks,
)
from traceless.privacy.ohttp.encap import CHUNKED_REQUEST_LABEL, CHUNKED_RESPONSE_LABEL, RequestHeader
from traceless.privacy.ohttp.errors import ChunkError
from traceless.privacy.ohttp.gateway import OhttpServer, encapsulate_request
from traceless.privacy.ohttp.keys import SymmetricAlgorithm
from traceless.privacy.wire import encode_varint

V = local_vectors("chunked-ohttp-draft-appendix-a.json")
H = bytes.fromhex


def _draft_server() -> OhttpServer:
    algorithms = (SymmetricAlgorithm(1, 1), SymmetricAlgorithm(1, 3))
    secret_key = H(V["gateway_x25519_secret_key"])
    return OhttpServer(1, symmetric_algorithms=algorithms, _secret_key_for_tests=secret_key)


def _split_by(data: bytes, lengths: list[int]) -> list[bytes]:
    out, start = [], 0
    for n in lengths[:-1]:
        out.append(data[start : start + n])
        start += n
    return out + [data[start:]]


def _flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def _decrypt_all(decryptor: ChunkedResponseDecryptor, pieces: list[bytes]) -> list[bytes]:
    return list(decryptor.decrypt_stream(pieces))


# ---- the draft's Appendix A example ------------------------------------------------------------


def test_labels_are_the_drafts() -> None:
    assert CHUNKED_REQUEST_LABEL == b"message/bhttp chunked request"
    assert CHUNKED_RESPONSE_LABEL == b"message/bhttp chunked response"
    assert RequestHeader(1, 0x20, 1, 1).info(CHUNKED_REQUEST_LABEL) == H(V["hpke_info"])


def test_draft_example_request_byte_for_byte() -> None:
    server = _draft_server()
    assert server.key_config.encode() == H(V["key_config"])
    chunks = _split_by(H(V["request_bhttp"]), V["request_chunk_plaintext_lengths"])
    ephemeral = H(V["client_ephemeral_secret_key"])
    enc_request, client_ctx = encapsulate_chunked_request(
        server.key_config, chunks, _ephemeral_secret_key_for_tests=ephemeral
    )
    assert enc_request == H("".join(V["encapsulated_request"]))
    assert client_ctx.secret.secret == H(V["response_export_secret"])
    request, server_ctx = server.decapsulate_chunked_request(enc_request)
    assert request == H(V["request_bhttp"])
    assert server_ctx.secret.secret == H(V["response_export_secret"])


def test_draft_example_response_byte_for_byte() -> None:
    enc_request = H("".join(V["encapsulated_request"]))
    _, server_ctx = _draft_server().decapsulate_chunked_request(enc_request)
    secret = server_ctx.secret
    assert secret.enc + H(V["response_nonce"]) == H(V["response_salt"])
    key, aead_nonce = secret.derive(H(V["response_nonce"]))
    assert (key, aead_nonce) == (H(V["response_aead_key"]), H(V["response_aead_nonce"]))
    nonces = [ohttp_chunked._chunk_nonce(aead_nonce, i) for i in range(3)]
    assert nonces == [H(n) for n in V["response_chunk_nonces"]]
    encryptor = server_ctx.encryptor(_response_nonce_for_tests=H(V["response_nonce"]))
    *body, final = _split_by(H(V["response_bhttp"]), V["response_chunk_plaintext_lengths"])
    out = [encryptor.seal_chunk(c) for c in body] + [encryptor.seal_final(final)]
    assert out[0] == H(V["encapsulated_response"][0]) + H(V["encapsulated_response"][1])
    assert out[1:] == [H(x) for x in V["encapsulated_response"][2:]]


def test_draft_example_response_decrypts_chunk_by_chunk() -> None:
    chunks = _split_by(H(V["request_bhttp"]), V["request_chunk_plaintext_lengths"])
    ephemeral = H(V["client_ephemeral_secret_key"])
    _, client_ctx = encapsulate_chunked_request(
        _draft_server().key_config, chunks, _ephemeral_secret_key_for_tests=ephemeral
    )
    decryptor = client_ctx.decryptor()
    got = [decryptor.feed(H(x)) for x in V["encapsulated_response"]]
    assert got == [[], [b"\x01"], [b"\x40\xc8"], []]  # the final chunk waits for the stream's end
    assert decryptor.finish() == b""


# ---- streaming --------------------------------------------------------------------------------

_SERVER = OhttpServer(2)
_ENC_REQUEST, _CLIENT_CTX = encapsulate_chunked_request(_SERVER.key_config, [b"prompt"])
_SERVER_CTX = _SERVER.decapsulate_chunked_request(_ENC_REQUEST)[1]


def _encrypt(chunks: list[bytes], final: bytes) -> bytes:
    encryptor = _SERVER_CTX.encryptor()
    return b"".join([encryptor.seal_chunk(c) for c in chunks] + [encryptor.seal_final(final)])


def _cuts(stream: bytes, points: list[int]) -> list[bytes]:
    bounds = sorted({0, len(stream), *(p % (len(stream) + 1) for p in points)})
    return [stream[a:b] for a, b in zip(bounds, bounds[1:])]


_chunks = st.lists(st.binary(min_size=1, max_size=200), max_size=8)


@settings(max_examples=150, deadline=None)
@given(
    chunks=_chunks,
    final=st.binary(max_size=200),
    points=st.lists(st.integers(0, 10_000), max_size=12),
)
def test_random_byte_boundaries_decode_to_the_same_chunks(chunks: list[bytes], final: bytes, points: list[int]) -> None:
    stream = _encrypt(chunks, final)
    assert _decrypt_all(_CLIENT_CTX.decryptor(), _cuts(stream, points)) == chunks + [final]
    assert _decrypt_all(_CLIENT_CTX.decryptor(), [bytes([b]) for b in stream]) == chunks + [final]


def test_large_chunks_are_split_to_the_drafts_size() -> None:
    data = bytes(range(256)) * 160  # 40960 bytes
    got = _decrypt_all(_CLIENT_CTX.decryptor(), [_encrypt([data], data)])
    assert [len(c) for c in got] == [MAX_CHUNK_PLAINTEXT, MAX_CHUNK_PLAINTEXT, 8192] * 2
    assert b"".join(got) == data + data
    assert split_chunks(b"") == [b""] and split_chunks(b"abc", 2) == [b"ab", b"c"]


@settings(max_examples=200, deadline=None)
@given(chunks=_chunks, final=st.binary(max_size=100), data=st.data())
def test_any_flipped_bit_is_rejected(chunks: list[bytes], final: bytes, data) -> None:
    stream = _encrypt(chunks, final)
    bit = data.draw(st.integers(0, 8 * len(stream) - 1), label="bit")
    points = data.draw(st.lists(st.integers(0, 10_000), max_size=4), label="cuts")
    decryptor = _CLIENT_CTX.decryptor()
    with pytest.raises(DecryptError):
        _decrypt_all(decryptor, _cuts(_flip(stream, bit), points))
    with pytest.raises(DecryptError):  # once failed, the decryptor accepts nothing more
        decryptor.feed(b"")


@settings(max_examples=100, deadline=None)
@given(chunks=_chunks, final=st.binary(max_size=100), data=st.data())
def test_truncated_streams_are_rejected(chunks: list[bytes], final: bytes, data) -> None:
    stream = _encrypt(chunks, final)
    cut = data.draw(st.integers(0, len(stream) - 1), label="cut")
    with pytest.raises(DecryptError):
        _decrypt_all(_CLIENT_CTX.decryptor(), [stream[:cut]])


def test_every_truncation_and_any_trailing_data_is_rejected() -> None:
    stream = _encrypt([b"alpha", b"beta"], b"omega")
    for cut in range(len(stream)):
        with pytest.raises(DecryptError):
            _decrypt_all(_CLIENT_CTX.decryptor(), [stream[:cut]])
    for extra in (b"\x00", b"\x01", stream[-17:]):
        with pytest.raises(DecryptError):
            _decrypt_all(_CLIENT_CTX.decryptor(), [stream, extra])
    decryptor = _CLIENT_CTX.decryptor()
    assert _decrypt_all(decryptor, [stream]) == [b"alpha", b"beta", b"omega"]
    with pytest.raises(DecryptError):  # data after the final chunk was accepted
        decryptor.feed(b"more")


def test_reordered_dropped_or_foreign_chunks_are_rejected() -> None:
    encryptor = _SERVER_CTX.encryptor()
    first, second = encryptor.seal_chunk(b"one"), encryptor.seal_chunk(b"two")
    final = encryptor.seal_final(b"end")
    nonce, first = first[:16], first[16:]
    for stream in (nonce + second + first + final, nonce + first + final, nonce + second + final):
        with pytest.raises(DecryptError):
            _decrypt_all(_CLIENT_CTX.decryptor(), [stream])
    other_ctx = encapsulate_chunked_request(_SERVER.key_config, [b"prompt"])[1]
    with pytest.raises(DecryptError):  # a response to another request
        _decrypt_all(other_ctx.decryptor(), [nonce + first + second + final])


def test_empty_non_final_and_oversized_chunks_are_rejected() -> None:
    nonce = bytes(16)
    key, aead_nonce = _CLIENT_CTX.secret.derive(nonce)
    aead = AeadKey(_CLIENT_CTX.secret.suite.aead_id, key)
    empty = aead.seal(aead_nonce, b"", b"")  # counter 0, validly sealed but empty
    final = aead.seal(ohttp_chunked._chunk_nonce(aead_nonce, 1), b"final", b"x")
    with pytest.raises(DecryptError):
        stream = nonce + encode_varint(len(empty)) + empty + b"\x00" + final
        _decrypt_all(_CLIENT_CTX.decryptor(), [stream])
    stream = _encrypt([b"y" * 100], b"z" * 100)
    with pytest.raises(DecryptError):
        _decrypt_all(_CLIENT_CTX.decryptor(max_chunk_length=99), [stream])
    got = _decrypt_all(_CLIENT_CTX.decryptor(max_chunk_length=100), [stream])
    assert got == [b"y" * 100, b"z" * 100]


def test_encryptor_misuse_is_a_typed_error() -> None:
    encryptor = _SERVER_CTX.encryptor()
    with pytest.raises(ChunkError):
        encryptor.seal_chunk(b"")
    encryptor.seal_final(b"")
    with pytest.raises(ChunkError):
        encryptor.seal_chunk(b"late")
    with pytest.raises(ChunkError):
        encryptor.seal_final(b"")
    with pytest.raises(ChunkError):
        encapsulate_chunked_request(_SERVER.key_config, [])
    with pytest.raises(ChunkError):
        encapsulate_chunked_request(_SERVER.key_config, [b"", b"final"])


# ---- chunked requests -------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(body=st.binary(max_size=300), size=st.integers(1, 64), data=st.data())
def test_chunked_request_round_trip_and_bit_flips(body: bytes, size: int, data) -> None:
    chunks = split_chunks(body, size)
    enc_request, client_ctx = encapsulate_chunked_request(_SERVER.key_config, chunks)
    request, server_ctx = _SERVER.decapsulate_chunked_request(enc_request)
    assert request == body
    response = server_ctx.encryptor().seal_final(b"ok")
    assert _decrypt_all(client_ctx.decryptor(), [response]) == [b"ok"]
    # Past the 56-bit public header every flip is a decryption failure.
    bit = data.draw(st.integers(56, 8 * len(enc_request) - 1), label="bit")
    with pytest.raises(DecryptError):
        _SERVER.decapsulate_chunked_request(_flip(enc_request, bit))
    cut = data.draw(st.integers(39, len(enc_request) - 1), label="cut")
    with pytest.raises(DecryptError):
        _SERVER.decapsulate_chunked_request(enc_request[:cut])
    assert _SERVER.decapsulate_chunked_request(enc_request)[0] == body  # server unchanged


def test_chunked_and_plain_messages_do_not_mix() -> None:
    plain, plain_ctx = encapsulate_request(_SERVER.key_config, b"x")
    with pytest.raises(DecryptError):
        _SERVER.decapsulate_chunked_request(plain)
    with pytest.raises(DecryptError):
        _SERVER.decapsulate_request(_ENC_REQUEST)
    with pytest.raises(MalformedMessageError):
        _SERVER.decapsulate_chunked_request(_ENC_REQUEST[:20])
    plain_response = _SERVER.decapsulate_request(plain)[1].encapsulate(b"y")
    chunked_as_plain = ChunkedResponseDecryptor(plain_ctx.secret)  # right key, wrong framing
    with pytest.raises(DecryptError):
        _decrypt_all(chunked_as_plain, [plain_response])
