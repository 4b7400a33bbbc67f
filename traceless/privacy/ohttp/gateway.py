"""Oblivious HTTP (RFC 9458): the gateway key holder and request/response encapsulation.

    §3    key configuration              ohttp_keys.KeyConfig, OhttpServer.ohttp_keys()
    §4.3  request  (message/ohttp-req)   encapsulate_request, OhttpServer.decapsulate_request
    §4.4  response (message/ohttp-res)   ServerResponse.encapsulate, ClientResponse.decapsulate
    chunked variant                      OhttpServer.decapsulate_chunked_request; see ohttp_chunked

Client:   enc_request, ctx = encapsulate_request(config, bhttp_request)
          bhttp_response = ctx.decapsulate(enc_response)
Gateway:  server = OhttpServer(key_id=1)        # fresh key pair, in memory only
          bhttp_request, ctx = server.decapsulate_request(enc_request)
          enc_response = ctx.encapsulate(bhttp_response)

Errors: a wrong key id, a KEM/KDF/AEAD the key does not allow, a truncated header or an
oversized request each raise their own typed error (the header is public, so this reveals
nothing). Everything that needs a key to check, including every response-side failure, is the
one opaque DecryptError. A failed decapsulation leaves the server unchanged and returns no
context. Arguments ending in `_for_tests` exist only for known-answer tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NoReturn

from traceless.privacy.errors import DecryptError
from traceless.privacy.hpke import kem as hpke_kem
from traceless.privacy.hpke.aead import AeadId, AeadKey
from traceless.privacy.hpke.kdf import KdfId
from traceless.privacy.hpke.kem import KemId
from traceless.privacy.ohttp.chunked import (
    DEFAULT_MAX_CHUNK_LENGTH,
    ChunkedClientResponse,
    ChunkedResponseDecryptor,
    ChunkedResponseEncryptor,
    ChunkedServerResponse,
    decapsulate_chunked_request,
    decapsulate_chunked_request_buffer,
    encapsulate_chunked_request,
)
from traceless.privacy.ohttp.encap import (
    REQUEST_LABEL,
    RESPONSE_LABEL,
    ResponseSecret,
    export_response_secret,
    open_request_context,
    seal_request_context,
)
from traceless.privacy.ohttp.errors import MessageTooLargeError
from traceless.privacy.ohttp.keys import KeyConfig, SymmetricAlgorithm, encode_ohttp_keys

__all__ = [
    "ChunkedClientResponse",
    "ChunkedResponseDecryptor",
    "ChunkedResponseEncryptor",
    "ChunkedServerResponse",
    "ClientResponse",
    "KeyConfig",
    "OhttpServer",
    "ServerResponse",
    "SymmetricAlgorithm",
    "encapsulate_chunked_request",
    "encapsulate_request",
]

# Preference order offered in the key config; AES-128-GCM first as in RFC 9458 Appendix A.
DEFAULT_SYMMETRIC_ALGORITHMS = (
    SymmetricAlgorithm(KdfId.HKDF_SHA256, AeadId.AES_128_GCM),
    SymmetricAlgorithm(KdfId.HKDF_SHA256, AeadId.AES_256_GCM),
    SymmetricAlgorithm(KdfId.HKDF_SHA256, AeadId.CHACHA20_POLY1305),
)
DEFAULT_MAX_REQUEST_LENGTH = 16 << 20


@dataclass(frozen=True, slots=True, repr=False)
class ClientResponse:
    """Client: decrypts the one response to an encapsulated request."""

    secret: ResponseSecret

    def decapsulate(self, enc_response: bytes) -> bytes:
        """enc_response = response_nonce || ct; any failure (short input too) is DecryptError."""
        n = self.secret.nonce_length
        if len(enc_response) < n + self.secret.suite.n_t:
            raise DecryptError()
        key, nonce = self.secret.derive(enc_response[:n])
        return AeadKey(self.secret.suite.aead_id, key).open(nonce, b"", enc_response[n:])


@dataclass(frozen=True, slots=True, repr=False)
class ServerResponse:
    """Gateway: encrypts the response to one decapsulated request."""

    secret: ResponseSecret

    def encapsulate(self, response: bytes, *, _response_nonce_for_tests: bytes | None = None) -> bytes:
        """message/ohttp-res: random response_nonce || Seal(aead_key, aead_nonce, "", response).

        `_response_nonce_for_tests` pins the nonce for known-answer tests only."""
        nonce = _response_nonce_for_tests
        if nonce is None:
            nonce = os.urandom(self.secret.nonce_length)
        key, aead_nonce = self.secret.derive(nonce)
        return nonce + AeadKey(self.secret.suite.aead_id, key).seal(aead_nonce, b"", response)


def encapsulate_request(
    config: KeyConfig,
    request: bytes,
    *,
    symmetric_algorithm: SymmetricAlgorithm | None = None,
    _ephemeral_secret_key_for_tests: bytes | None = None,
) -> tuple[bytes, ClientResponse]:
    """Client: message/ohttp-req for `request` (a binary HTTP message) to the gateway `config`.

    The KDF/AEAD pair is `symmetric_algorithm` if given, else the first supported one the
    config offers. `_ephemeral_secret_key_for_tests` pins the HPKE ephemeral key for
    known-answer tests; production code must never pass it (a reused key links requests).
    """
    prefix, enc, context = seal_request_context(
        config, REQUEST_LABEL, symmetric_algorithm, _ephemeral_secret_key_for_tests
    )
    enc_request = prefix + context.seal(b"", request)
    return enc_request, ClientResponse(export_response_secret(context, enc, RESPONSE_LABEL))


class OhttpServer:
    """Oblivious Gateway key holder: one HPKE key pair generated at construction.

    The private key exists only in this object's memory. There is no way to export, save or
    pickle it; a restart is a cryptographic erase (threat T10, docs/threat-model.md). Decapsulation changes
    no state, so the server may be shared by concurrent requests.
    """

    __slots__ = ("_config", "_private_key", "_max_request_length", "_max_chunk_length")

    def __init__(
        self,
        key_id: int = 0,
        *,
        kem_id: KemId = KemId.DHKEM_X25519_HKDF_SHA256,
        symmetric_algorithms: Iterable[SymmetricAlgorithm] = DEFAULT_SYMMETRIC_ALGORITHMS,
        max_request_length: int = DEFAULT_MAX_REQUEST_LENGTH,
        max_chunk_length: int = DEFAULT_MAX_CHUNK_LENGTH,
        _secret_key_for_tests: bytes | None = None,
    ) -> None:
        """`_secret_key_for_tests` loads a fixed key for known-answer tests; never use it to
        persist or share a gateway key."""
        algorithms = tuple(symmetric_algorithms)
        for algorithm in algorithms:
            algorithm.suite(kem_id)  # raises UnsupportedAlgorithmError for pairs we cannot serve
        if max_request_length < 1 or max_chunk_length < 1:
            raise ValueError("limits must be positive")
        if _secret_key_for_tests is None:
            self._private_key = hpke_kem.generate_key_pair(kem_id)
        else:
            self._private_key = hpke_kem.deserialize_private_key(kem_id, _secret_key_for_tests)
        self._config = KeyConfig(key_id, kem_id, self._private_key.public_key_bytes, algorithms)
        self._max_request_length = max_request_length
        self._max_chunk_length = max_chunk_length

    def __repr__(self) -> str:
        config = self._config
        return f"OhttpServer(key_id={config.key_id}, kem={config.kem_id.name}, <key redacted>)"

    def __reduce__(self) -> NoReturn:
        raise TypeError("OhttpServer holds a memory-only key and cannot be pickled or copied")

    @property
    def key_config(self) -> KeyConfig:
        return self._config

    def ohttp_keys(self) -> bytes:
        """Body of the `application/ohttp-keys` resource (RFC 9458 §3.2)."""
        return encode_ohttp_keys([self._config])

    def _check_length(self, enc_request: bytes) -> None:
        if len(enc_request) > self._max_request_length:
            raise MessageTooLargeError(f"encapsulated request over {self._max_request_length} bytes")

    def decapsulate_request(self, enc_request: bytes) -> tuple[bytes, ServerResponse]:
        """Open message/ohttp-req: (binary HTTP request, context for the response)."""
        self._check_length(enc_request)
        r, enc, context = open_request_context(enc_request, self._config, self._private_key, REQUEST_LABEL)
        request = context.open(b"", r.read_rest())
        return request, ServerResponse(export_response_secret(context, enc, RESPONSE_LABEL))

    def decapsulate_request_buffer(self, enc_request: bytes) -> tuple[bytearray, ServerResponse]:
        """As decapsulate_request, with the plaintext in a bytearray the caller owns and must
        zero when the request ends (a node holds decrypted requests only in wipeable buffers)."""
        self._check_length(enc_request)
        r, enc, context = open_request_context(enc_request, self._config, self._private_key, REQUEST_LABEL)
        request = context.open_into(b"", r.read_rest())
        return request, ServerResponse(export_response_secret(context, enc, RESPONSE_LABEL))

    def decapsulate_chunked_request(self, enc_request: bytes) -> tuple[bytes, ChunkedServerResponse]:
        """Open a whole message/ohttp-chunked-req; its response must be chunked too."""
        self._check_length(enc_request)
        return decapsulate_chunked_request(enc_request, self._config, self._private_key, self._max_chunk_length)

    def decapsulate_chunked_request_buffer(self, enc_request: bytes) -> tuple[bytearray, ChunkedServerResponse]:
        """As decapsulate_chunked_request, with the plaintext in a bytearray the caller must wipe."""
        self._check_length(enc_request)
        return decapsulate_chunked_request_buffer(enc_request, self._config, self._private_key, self._max_chunk_length)
