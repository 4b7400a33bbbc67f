"""Chunked Oblivious HTTP (draft-ietf-ohai-chunked-ohttp-08): streamed responses
(`message/ohttp-chunked-res`, §5, §6.2) and whole-buffer chunked requests (§4, §6.1).

    Chunked Encapsulated Response {
      Response Nonce (8 * max(Nn, Nk)),
      Non-Final Response Chunk { Length (i) = 1.., AEAD-Protected Chunk (..) } ...,
      Final Response Chunk Indicator (i) = 0,
      AEAD-Protected Final Response Chunk (..),        # runs to the end of the stream
    }
    chunk_nonce = aead_nonce XOR I2OSP(counter, Nn); AAD "" for non-final chunks, "final" last.

The request side uses info label "message/bhttp chunked request" and the response secret is
exported with "message/bhttp chunked response". Requests here are built and opened whole (one
buffer); only responses are processed incrementally.

The decryptor releases each non-final chunk as soon as it authenticates. A response is complete
only when `finish()` returns: a stream that stops without an authenticated final chunk, carries
bytes past it, or was tampered with anywhere raises the opaque DecryptError, after which the
decryptor refuses all further input.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from traceless.privacy.errors import DecryptError, MalformedMessageError
from traceless.privacy.hpke.aead import AeadKey
from traceless.privacy.hpke.errors import SequenceOverflowError
from traceless.privacy.hpke.kem import KemPrivateKey
from traceless.privacy.ohttp.encap import (
    CHUNKED_REQUEST_LABEL,
    CHUNKED_RESPONSE_LABEL,
    ResponseSecret,
    export_response_secret,
    open_request_context,
    seal_request_context,
)
from traceless.privacy.ohttp.errors import ChunkError
from traceless.privacy.ohttp.keys import KeyConfig, SymmetricAlgorithm
from traceless.privacy.wire import encode_varint, peek_varint

FINAL_AAD = b"final"
# §3: every receiver accepts chunks of 2**14 plaintext bytes; senders SHOULD not exceed it.
MAX_CHUNK_PLAINTEXT = 1 << 14
DEFAULT_MAX_CHUNK_LENGTH = 1 << 16  # what our decryptor accepts per chunk (plaintext bytes)


def split_chunks(data: bytes, size: int = MAX_CHUNK_PLAINTEXT) -> list[bytes]:
    """`data` in chunks of at most `size` bytes; the last (maybe empty) is the final chunk."""
    if size < 1:
        raise ChunkError("chunk size must be >= 1")
    pieces = [data[i : i + size] for i in range(0, len(data), size)]
    return pieces if pieces else [b""]


def _chunk_nonce(aead_nonce: bytes, counter: int) -> bytes:
    n_n = len(aead_nonce)
    if counter >= 1 << (8 * n_n):  # §6.2: at most 256**Nn chunks, or nonces repeat
        raise SequenceOverflowError("chunk counter exhausted the nonce space")
    return (int.from_bytes(aead_nonce, "big") ^ counter).to_bytes(n_n, "big")


# ---- requests (whole buffer) ------------------------------------------------------------------


def encapsulate_chunked_request(
    config: KeyConfig,
    chunks: Sequence[bytes],
    *,
    symmetric_algorithm: SymmetricAlgorithm | None = None,
    _ephemeral_secret_key_for_tests: bytes | None = None,
) -> tuple[bytes, ChunkedClientResponse]:
    """Client: `message/ohttp-chunked-req` from `chunks`, the last being the final one (§6.1).

    Use `split_chunks(request)` to cut a request. `_ephemeral_secret_key_for_tests` is for
    known-answer tests only; production requests must use a fresh ephemeral key.
    """
    if not chunks:
        raise ChunkError("a chunked request needs at least its final chunk")
    if any(len(c) > MAX_CHUNK_PLAINTEXT for c in chunks) or not all(chunks[:-1]):
        raise ChunkError(f"chunks hold at most {MAX_CHUNK_PLAINTEXT} bytes; only the final one may be empty")
    prefix, enc, context = seal_request_context(
        config, CHUNKED_REQUEST_LABEL, symmetric_algorithm, _ephemeral_secret_key_for_tests
    )
    out = [prefix]
    for chunk in chunks[:-1]:
        sealed = context.seal(b"", chunk)
        out.append(encode_varint(len(sealed)) + sealed)
    out.append(encode_varint(0) + context.seal(FINAL_AAD, chunks[-1]))
    secret = export_response_secret(context, enc, CHUNKED_RESPONSE_LABEL)
    return b"".join(out), ChunkedClientResponse(secret)


def decapsulate_chunked_request(
    enc_request: bytes, config: KeyConfig, private_key: KemPrivateKey, max_chunk_length: int
) -> tuple[bytes, ChunkedServerResponse]:
    """Gateway: open a whole `message/ohttp-chunked-req`. Framing errors after the header are
    DecryptError like tag failures: the chunk framing is part of what an attacker could alter."""
    buf, response = decapsulate_chunked_request_buffer(enc_request, config, private_key, max_chunk_length)
    out = bytes(buf)
    buf[:] = bytes(len(buf))
    return out, response


def decapsulate_chunked_request_buffer(
    enc_request: bytes, config: KeyConfig, private_key: KemPrivateKey, max_chunk_length: int
) -> tuple[bytearray, ChunkedServerResponse]:
    """As decapsulate_chunked_request, with the plaintext in a bytearray the caller must wipe."""
    r, enc, context = open_request_context(enc_request, config, private_key, CHUNKED_REQUEST_LABEL)
    limit = max_chunk_length + context.suite.n_t
    out = bytearray()
    try:
        while (length := r.read_varint("chunk length")) != 0:
            if length > limit:
                raise DecryptError()
            piece = context.open_into(b"", r.read(length, "chunk"))
            if not piece:  # §6: an empty non-final chunk counts as a decryption error
                raise DecryptError()
            out += piece
            piece[:] = bytes(len(piece))
        piece = context.open_into(FINAL_AAD, r.read_rest())
        out += piece
        piece[:] = bytes(len(piece))
    except MalformedMessageError:  # stream ended before the final chunk
        out[:] = bytes(len(out))
        raise DecryptError() from None
    except DecryptError:
        out[:] = bytes(len(out))
        raise
    secret = export_response_secret(context, enc, CHUNKED_RESPONSE_LABEL)
    return out, ChunkedServerResponse(secret)


# ---- responses (streamed) ---------------------------------------------------------------------


class ChunkedResponseEncryptor:
    """Gateway: seals response chunks in order. Concatenating its outputs gives the response;
    the first output starts with the response nonce. Not thread-safe."""

    __slots__ = ("_aead", "_aead_nonce", "_counter", "_prefix", "_finished")

    def __init__(self, secret: ResponseSecret, response_nonce: bytes) -> None:
        key, self._aead_nonce = secret.derive(response_nonce)
        self._aead = AeadKey(secret.suite.aead_id, key)
        self._counter = 0
        self._prefix = response_nonce  # sent once, in front of the first chunk
        self._finished = False

    def __repr__(self) -> str:
        state = "finished" if self._finished else "open"
        return f"ChunkedResponseEncryptor(chunks={self._counter}, {state}, <redacted>)"

    def _seal(self, aad: bytes, piece: bytes) -> bytes:
        sealed = self._aead.seal(_chunk_nonce(self._aead_nonce, self._counter), aad, piece)
        self._counter += 1
        return sealed

    def _start(self) -> bytes:
        if self._finished:
            raise ChunkError("the final chunk was already sealed")
        prefix, self._prefix = self._prefix, b""
        return prefix

    def seal_chunk(self, chunk: bytes) -> bytes:
        """Seal non-empty, non-final data (split into chunks of at most 16384 bytes)."""
        if not chunk:
            raise ChunkError("a non-final chunk must not be empty")
        out = [self._start()]
        for piece in split_chunks(chunk):
            sealed = self._seal(b"", piece)
            out.append(encode_varint(len(sealed)) + sealed)
        return b"".join(out)

    def seal_final(self, chunk: bytes = b"") -> bytes:
        """Seal the last data (may be empty) as the final chunk; nothing may follow."""
        pieces = split_chunks(chunk)
        out = [self.seal_chunk(b"".join(pieces[:-1]))] if len(pieces) > 1 else [self._start()]
        out.append(encode_varint(0) + self._seal(FINAL_AAD, pieces[-1]))
        self._finished = True
        return b"".join(out)


class ChunkedResponseDecryptor:
    """Client: decrypts a chunked response fed as arbitrary byte slices from the network."""

    __slots__ = ("_secret", "_limit", "_buffer", "_aead", "_aead_nonce", "_counter", "_in_final", "_state")

    def __init__(self, secret: ResponseSecret, max_chunk_length: int = DEFAULT_MAX_CHUNK_LENGTH) -> None:
        self._secret = secret
        self._limit = max_chunk_length + secret.suite.n_t  # largest sealed chunk accepted
        self._buffer = bytearray()
        self._aead: AeadKey | None = None  # set once the response nonce has arrived
        self._aead_nonce = b""
        self._counter = 0
        self._in_final = False  # the zero length indicator was read: the rest is the final chunk
        self._state = "open"  # "open" -> "done" (finish succeeded) or "failed"

    def __repr__(self) -> str:
        return f"ChunkedResponseDecryptor(chunks={self._counter}, state={self._state}, <redacted>)"

    def _fail(self) -> DecryptError:
        self._state = "failed"
        self._buffer.clear()
        self._aead = None
        return DecryptError()

    def _open(self, aad: bytes, sealed: bytes) -> bytes:
        if self._aead is None:  # no response nonce yet: nothing can authenticate
            raise self._fail()
        return self._aead.open(_chunk_nonce(self._aead_nonce, self._counter), aad, sealed)

    def _next_chunk(self) -> bytes | None:
        """Decrypt one complete non-final chunk from the buffer; None if more bytes are needed."""
        buf = self._buffer
        if self._aead is None:
            n = self._secret.nonce_length
            if len(buf) < n:
                return None
            key, self._aead_nonce = self._secret.derive(bytes(buf[:n]))
            self._aead = AeadKey(self._secret.suite.aead_id, key)
            del buf[:n]
        prefix = None if self._in_final else peek_varint(buf)
        if prefix is None:
            return None
        length, n = prefix
        if length == 0:  # Final Response Chunk Indicator: the rest of the stream is the last chunk
            self._in_final = True
            del buf[:n]
            return None
        if length > self._limit:
            raise self._fail()
        if len(buf) < n + length:
            return None
        plaintext = self._open(b"", bytes(buf[n : n + length]))
        if not plaintext:  # §6: an empty non-final chunk counts as a decryption error
            raise self._fail()
        self._counter += 1
        del buf[: n + length]
        return plaintext

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes from the stream; returns the non-final chunks they completed (maybe none)."""
        if self._state != "open":
            raise self._fail()
        self._buffer += data
        chunks = []
        try:
            while (chunk := self._next_chunk()) is not None:
                chunks.append(chunk)
        except DecryptError:
            raise self._fail() from None
        if self._in_final and len(self._buffer) > self._limit:
            raise self._fail()
        return chunks

    def finish(self) -> bytes:
        """The stream ended: authenticate and return the final chunk. Truncation is DecryptError."""
        if self._state != "open" or self._aead is None or not self._in_final:
            raise self._fail()
        try:
            final = self._open(FINAL_AAD, bytes(self._buffer))
        except DecryptError:
            raise self._fail() from None
        self._state = "done"
        self._buffer.clear()
        return final

    def decrypt_stream(self, stream: Iterable[bytes]) -> Iterator[bytes]:
        """Plaintext chunks of a whole byte stream, the final chunk last."""
        for data in stream:
            yield from self.feed(data)
        yield self.finish()


@dataclass(frozen=True, slots=True, repr=False)
class ChunkedServerResponse:
    """Gateway: the response secret of one decapsulated chunked request."""

    secret: ResponseSecret

    def encryptor(self, *, _response_nonce_for_tests: bytes | None = None) -> ChunkedResponseEncryptor:
        """An encryptor with a fresh random response nonce (pinned only by KATs)."""
        nonce = _response_nonce_for_tests
        if nonce is None:
            nonce = os.urandom(self.secret.nonce_length)
        return ChunkedResponseEncryptor(self.secret, nonce)


@dataclass(frozen=True, slots=True, repr=False)
class ChunkedClientResponse:
    """Client: what decrypts the chunked response to one chunked request."""

    secret: ResponseSecret

    def decryptor(self, max_chunk_length: int = DEFAULT_MAX_CHUNK_LENGTH) -> ChunkedResponseDecryptor:
        return ChunkedResponseDecryptor(self.secret, max_chunk_length)
