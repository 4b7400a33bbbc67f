"""Mechanics shared by plain and chunked Oblivious HTTP (RFC 9458 §4.3, §4.4;
draft-ietf-ohai-chunked-ohttp §6): the request header, the HPKE context setup on both sides,
and the response key derivation.

    hdr  = key_id (8) || kem_id (16) || kdf_id (16) || aead_id (16)
    info = label || 0x00 || hdr
    secret         = context.Export(response_label, max(Nn, Nk))
    prk            = Extract(salt = enc || response_nonce, ikm = secret)
    aead_key       = Expand(prk, "key", Nk)
    aead_nonce     = Expand(prk, "nonce", Nn)

Extract/Expand here are the suite KDF's plain HKDF, not HPKE's labeled variants.
"""

from __future__ import annotations

from dataclasses import dataclass

from traceless.privacy.errors import MalformedMessageError, UnsupportedAlgorithmError
from traceless.privacy.hpke import context as hpke
from traceless.privacy.hpke import kem as hpke_kem
from traceless.privacy.hpke.context import RecipientContext, SenderContext, Suite
from traceless.privacy.hpke.kdf import Kdf
from traceless.privacy.hpke.kem import KemPrivateKey
from traceless.privacy.ohttp.errors import UnknownKeyIdError
from traceless.privacy.ohttp.keys import KeyConfig, SymmetricAlgorithm
from traceless.privacy.wire import ByteReader

REQUEST_LABEL = b"message/bhttp request"
RESPONSE_LABEL = b"message/bhttp response"
CHUNKED_REQUEST_LABEL = b"message/bhttp chunked request"
CHUNKED_RESPONSE_LABEL = b"message/bhttp chunked response"


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """`hdr` of an Encapsulated Request: key and algorithm identifiers (§4.1)."""

    key_id: int
    kem_id: int
    kdf_id: int
    aead_id: int

    def encode(self) -> bytes:
        ids = (self.kem_id, self.kdf_id, self.aead_id)
        return bytes([self.key_id]) + b"".join(i.to_bytes(2, "big") for i in ids)

    def info(self, label: bytes) -> bytes:
        return label + b"\x00" + self.encode()

    @classmethod
    def read(cls, r: ByteReader) -> RequestHeader:
        key_id = r.read_uint(1, "key id")
        kem_id, kdf_id = r.read_uint(2, "KEM id"), r.read_uint(2, "KDF id")
        return cls(key_id, kem_id, kdf_id, r.read_uint(2, "AEAD id"))


@dataclass(frozen=True, slots=True, repr=False)
class ResponseSecret:
    """What protects one response: the suite, the request's `enc` and the exported secret."""

    suite: Suite
    enc: bytes
    secret: bytes

    @property
    def nonce_length(self) -> int:
        """Length of response_nonce: max(Nn, Nk)."""
        return max(self.suite.n_n, self.suite.n_k)

    def derive(self, response_nonce: bytes) -> tuple[bytes, bytes]:
        """(aead_key, aead_nonce) for a response that starts with `response_nonce`."""
        if len(response_nonce) != self.nonce_length:
            raise ValueError(f"response nonce must be {self.nonce_length} bytes, got {len(response_nonce)}")
        kdf = Kdf(self.suite.kdf_id, b"")
        prk = kdf.extract(self.enc + response_nonce, self.secret)
        return kdf.expand(prk, b"key", self.suite.n_k), kdf.expand(prk, b"nonce", self.suite.n_n)


def export_response_secret(
    context: SenderContext | RecipientContext, enc: bytes, response_label: bytes
) -> ResponseSecret:
    """Step 1 of §4.4 on either side: secret = context.Export(label, max(Nn, Nk))."""
    suite = context.suite
    return ResponseSecret(suite, enc, context.export(response_label, max(suite.n_n, suite.n_k)))


def seal_request_context(
    config: KeyConfig,
    label: bytes,
    algorithm: SymmetricAlgorithm | None,
    ephemeral_secret_key: bytes | None,
) -> tuple[bytes, bytes, SenderContext]:
    """Client side of §4.3 up to the Seal: returns (hdr || enc, enc, sending context)."""
    chosen, suite = config.select(algorithm)
    header = RequestHeader(config.key_id, config.kem_id, chosen.kdf_id, chosen.aead_id)
    ephemeral = None
    if ephemeral_secret_key is not None:  # known-answer tests only
        ephemeral = hpke_kem.deserialize_private_key(config.kem_id, ephemeral_secret_key)
    enc, context = hpke.setup_base_s(suite, config.public_key, header.info(label), _ephemeral_for_tests=ephemeral)
    return header.encode() + enc, enc, context


def open_request_context(
    enc_request: bytes, config: KeyConfig, private_key: KemPrivateKey, label: bytes
) -> tuple[ByteReader, bytes, RecipientContext]:
    """Gateway side of §4.3 up to the Open: returns (reader at the ciphertext, enc, context).

    Header problems are typed (UnknownKeyIdError, UnsupportedAlgorithmError,
    MalformedMessageError); an `enc` the KEM rejects is the opaque DecryptError.
    """
    r = ByteReader(enc_request, MalformedMessageError)
    header = RequestHeader.read(r)
    if header.key_id != config.key_id:
        raise UnknownKeyIdError(f"unknown key id {header.key_id}")
    if header.kem_id != config.kem_id:
        raise UnsupportedAlgorithmError(f"key {config.key_id} does not use KEM 0x{header.kem_id:04x}")
    algorithm = SymmetricAlgorithm(header.kdf_id, header.aead_id)
    if algorithm not in config.symmetric_algorithms:
        raise UnsupportedAlgorithmError(
            f"key {config.key_id} does not allow KDF 0x{header.kdf_id:04x} with AEAD 0x{header.aead_id:04x}"
        )
    suite = algorithm.suite(config.kem_id)
    enc = r.read(suite.n_enc, "encapsulated key")
    return r, enc, hpke.setup_base_r(suite, enc, private_key, header.info(label))
