"""HPKE key derivation: HKDF and the labeled variants (RFC 9180 §4, §7.2).

HKDF-Extract and HKDF-Expand come from `cryptography`; this module only adds HPKE's labels:

    LabeledExtract(salt, label, ikm)   = Extract(salt, "HPKE-v1" || suite_id || label || ikm)
    LabeledExpand(prk, label, info, L) = Expand(prk, I2OSP(L, 2) || "HPKE-v1" || suite_id
                                                || label || info, L)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand

from traceless.privacy.errors import UnsupportedAlgorithmError

HPKE_VERSION = b"HPKE-v1"


class KdfId(enum.IntEnum):
    """HPKE KDF identifiers (RFC 9180 §7.2)."""

    HKDF_SHA256 = 0x0001
    HKDF_SHA384 = 0x0002
    HKDF_SHA512 = 0x0003


_HASHES: dict[KdfId, type[hashes.HashAlgorithm]] = {
    KdfId.HKDF_SHA256: hashes.SHA256,
    KdfId.HKDF_SHA384: hashes.SHA384,
    KdfId.HKDF_SHA512: hashes.SHA512,
}


def kdf_id_from_int(value: int) -> KdfId:
    try:
        return KdfId(value)
    except ValueError:
        raise UnsupportedAlgorithmError(f"unsupported HPKE KDF id 0x{value:04x}") from None


@dataclass(frozen=True, slots=True)
class Kdf:
    """One HKDF instance bound to an HPKE `suite_id` (the KEM's or the full suite's)."""

    kdf_id: KdfId
    suite_id: bytes

    @property
    def n_h(self) -> int:
        """Nh: output size of Extract, in bytes."""
        return self._hash().digest_size

    def _hash(self) -> hashes.HashAlgorithm:
        return _HASHES[self.kdf_id]()

    def extract(self, salt: bytes, ikm: bytes) -> bytes:
        return HKDF.extract(self._hash(), salt, ikm)

    def expand(self, prk: bytes, info: bytes, length: int) -> bytes:
        if not 0 <= length <= 255 * self.n_h:
            raise ValueError(f"HKDF-Expand length must be in 0..{255 * self.n_h}, got {length}")
        return HKDFExpand(self._hash(), length, info).derive(prk)

    def labeled_extract(self, salt: bytes, label: bytes, ikm: bytes) -> bytes:
        return self.extract(salt, HPKE_VERSION + self.suite_id + label + ikm)

    def labeled_expand(self, prk: bytes, label: bytes, info: bytes, length: int) -> bytes:
        if not 0 <= length < 1 << 16:
            raise ValueError(f"LabeledExpand length must fit in 2 bytes, got {length}")
        labeled_info = length.to_bytes(2, "big") + HPKE_VERSION + self.suite_id + label + info
        return self.expand(prk, labeled_info, length)
