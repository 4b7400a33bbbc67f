"""HPKE AEAD algorithms (RFC 9180 §7.3) over `cryptography`'s AES-GCM and ChaCha20-Poly1305.

`AeadKey.open` turns every failure into the one opaque `DecryptError`; nothing about the
ciphertext, tag or key leaves this module in an error.
"""

from __future__ import annotations

import enum

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

from traceless.privacy.errors import DecryptError, UnsupportedAlgorithmError


class AeadId(enum.IntEnum):
    """HPKE AEAD identifiers (RFC 9180 §7.3)."""

    AES_128_GCM = 0x0001
    AES_256_GCM = 0x0002
    CHACHA20_POLY1305 = 0x0003
    EXPORT_ONLY = 0xFFFF


# (Nk, Nn, Nt): key, nonce and tag sizes in bytes. Export-only has no AEAD at all.
_SIZES: dict[AeadId, tuple[int, int, int]] = {
    AeadId.AES_128_GCM: (16, 12, 16),
    AeadId.AES_256_GCM: (32, 12, 16),
    AeadId.CHACHA20_POLY1305: (32, 12, 16),
    AeadId.EXPORT_ONLY: (0, 0, 0),
}


def aead_id_from_int(value: int) -> AeadId:
    try:
        return AeadId(value)
    except ValueError:
        raise UnsupportedAlgorithmError(f"unsupported HPKE AEAD id 0x{value:04x}") from None


def aead_sizes(aead_id: AeadId) -> tuple[int, int, int]:
    """(Nk, Nn, Nt) for `aead_id`."""
    return _SIZES[aead_id]


class AeadKey:
    """An AEAD keyed once; nonces are passed per call (RFC 5116 Seal/Open)."""

    __slots__ = ("_cipher", "_n_n", "_aead_id")

    def __init__(self, aead_id: AeadId, key: bytes) -> None:
        n_k, n_n, _ = _SIZES[aead_id]
        if aead_id is AeadId.EXPORT_ONLY:
            raise UnsupportedAlgorithmError("the export-only AEAD cannot seal or open")
        if len(key) != n_k:
            raise ValueError(f"AEAD key must be {n_k} bytes, got {len(key)}")
        self._n_n = n_n
        self._aead_id = aead_id
        self._cipher = ChaCha20Poly1305(key) if aead_id is AeadId.CHACHA20_POLY1305 else AESGCM(key)

    def __repr__(self) -> str:
        return "AeadKey(<redacted>)"

    def seal(self, nonce: bytes, aad: bytes, pt: bytes) -> bytes:
        if len(nonce) != self._n_n:
            raise ValueError(f"AEAD nonce must be {self._n_n} bytes, got {len(nonce)}")
        return self._cipher.encrypt(nonce, pt, aad)

    def open_into(self, nonce: bytes, aad: bytes, ct: bytes) -> bytearray:
        """Open into a new bytearray the caller owns, so it can zero the plaintext when done.
        (Plain `open` returns immutable bytes that live until garbage collection.)"""
        if len(nonce) != self._n_n:
            raise ValueError(f"AEAD nonce must be {self._n_n} bytes, got {len(nonce)}")
        n_t = _SIZES[self._aead_id][2]
        if len(ct) < n_t:
            raise DecryptError()
        out = bytearray(len(ct) - n_t)
        try:
            self._cipher.decrypt_into(nonce, ct, aad, out)
        except (InvalidTag, ValueError, OverflowError):
            out[:] = bytes(len(out))
            raise DecryptError() from None
        return out

    def open(self, nonce: bytes, aad: bytes, ct: bytes) -> bytes:
        if len(nonce) != self._n_n:
            raise ValueError(f"AEAD nonce must be {self._n_n} bytes, got {len(nonce)}")
        try:
            return self._cipher.decrypt(nonce, ct, aad)
        except (InvalidTag, ValueError, OverflowError):
            raise DecryptError() from None
