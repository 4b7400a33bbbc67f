"""Oblivious HTTP key configurations (RFC 9458 §3.1) and `application/ohttp-keys` (§3.2).

    Key Config {
      Key Identifier (8),
      HPKE KEM ID (16),
      HPKE Public Key (Npk * 8),
      HPKE Symmetric Algorithms Length (16) = 4..65532,
      HPKE Symmetric Algorithms (32) ...,      # (KDF ID (16), AEAD ID (16)) pairs
    }

`application/ohttp-keys` is a list of configs, each prefixed by a 2-byte length. §3.2 says a
client MUST discard a collection with encoding errors, so `decode_ohttp_keys` rejects the whole
body on any error; only a config whose KEM is unknown is skipped (its length prefix makes that
unambiguous), since a gateway may offer KEMs this library does not implement.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from traceless.privacy.errors import UnsupportedAlgorithmError
from traceless.privacy.hpke.aead import AeadId
from traceless.privacy.hpke.context import Suite
from traceless.privacy.hpke.kem import KEM_PARAMS, KemId, deserialize_public_key, kem_id_from_int
from traceless.privacy.ohttp.errors import KeyConfigError
from traceless.privacy.wire import ByteReader

MAX_SYMMETRIC_ALGORITHMS = 65532 // 4


@dataclass(frozen=True, slots=True)
class SymmetricAlgorithm:
    """One (KDF, AEAD) pair a gateway accepts with its key. Ids are wire values, maybe unknown."""

    kdf_id: int
    aead_id: int

    def __post_init__(self) -> None:
        if not (0 <= self.kdf_id <= 0xFFFF and 0 <= self.aead_id <= 0xFFFF):
            raise KeyConfigError("KDF and AEAD ids are 16-bit values")

    def suite(self, kem_id: KemId) -> Suite:
        """The HPKE suite for this pair; unknown ids or export-only: UnsupportedAlgorithmError."""
        suite = Suite.from_ids(kem_id, self.kdf_id, self.aead_id)
        if suite.aead_id is AeadId.EXPORT_ONLY:
            raise UnsupportedAlgorithmError("OHTTP needs an AEAD; export-only cannot encrypt")
        return suite

    def is_supported(self, kem_id: KemId) -> bool:
        try:
            self.suite(kem_id)
        except UnsupportedAlgorithmError:
            return False
        return True


@dataclass(frozen=True, slots=True)
class KeyConfig:
    """A gateway's public key configuration (RFC 9458 §3.1)."""

    key_id: int
    kem_id: KemId
    public_key: bytes
    symmetric_algorithms: tuple[SymmetricAlgorithm, ...]

    def __post_init__(self) -> None:
        if not 0 <= self.key_id <= 0xFF:
            raise KeyConfigError(f"key_id must be 0..255, got {self.key_id}")
        object.__setattr__(self, "kem_id", kem_id_from_int(self.kem_id))
        object.__setattr__(self, "public_key", bytes(self.public_key))
        try:
            deserialize_public_key(self.kem_id, self.public_key)
        except ValueError:
            raise KeyConfigError(f"invalid {self.kem_id.name} public key") from None
        algorithms = tuple(self.symmetric_algorithms)
        if not 1 <= len(algorithms) <= MAX_SYMMETRIC_ALGORITHMS:
            raise KeyConfigError(f"need 1..{MAX_SYMMETRIC_ALGORITHMS} symmetric algorithms, got {len(algorithms)}")
        if not all(isinstance(a, SymmetricAlgorithm) for a in algorithms):
            raise KeyConfigError("symmetric_algorithms must hold SymmetricAlgorithm values")
        object.__setattr__(self, "symmetric_algorithms", algorithms)

    def encode(self) -> bytes:
        algorithms = b"".join(
            a.kdf_id.to_bytes(2, "big") + a.aead_id.to_bytes(2, "big") for a in self.symmetric_algorithms
        )
        return (
            bytes([self.key_id])
            + self.kem_id.to_bytes(2, "big")
            + self.public_key
            + len(algorithms).to_bytes(2, "big")
            + algorithms
        )

    @classmethod
    def decode(cls, data: bytes) -> KeyConfig:
        """Parse exactly one config (no trailing bytes). Unknown KEM: UnsupportedAlgorithmError."""
        r = ByteReader(data, KeyConfigError)
        key_id = r.read_uint(1, "key identifier")
        kem_id = kem_id_from_int(r.read_uint(2, "KEM id"))
        public_key = r.read(KEM_PARAMS[kem_id].n_pk, "public key")
        length = r.read_uint(2, "symmetric algorithms length")
        if length < 4 or length % 4 or length > 65532:
            raise KeyConfigError(f"symmetric algorithms length must be a multiple of 4 in 4..65532, got {length}")
        pairs = ByteReader(r.read(length, "symmetric algorithms"), KeyConfigError)
        algorithms = []
        while not pairs.at_end():
            kdf_id = pairs.read_uint(2, "KDF id")
            algorithms.append(SymmetricAlgorithm(kdf_id, pairs.read_uint(2, "AEAD id")))
        if not r.at_end():
            raise KeyConfigError(f"{r.remaining} bytes after the key config")
        return cls(key_id, kem_id, public_key, tuple(algorithms))

    def select(self, preferred: SymmetricAlgorithm | None = None) -> tuple[SymmetricAlgorithm, Suite]:
        """The pair to use: `preferred` if offered and supported, else the first supported one."""
        if preferred is not None:
            if preferred not in self.symmetric_algorithms:
                raise UnsupportedAlgorithmError("the key config does not offer that KDF/AEAD pair")
            return preferred, preferred.suite(self.kem_id)
        for algorithm in self.symmetric_algorithms:
            if algorithm.is_supported(self.kem_id):
                return algorithm, algorithm.suite(self.kem_id)
        raise UnsupportedAlgorithmError("the key config offers no supported KDF/AEAD pair")


def encode_ohttp_keys(configs: Iterable[KeyConfig]) -> bytes:
    """`application/ohttp-keys` body: each config prefixed with its 2-byte length (§3.2)."""
    out = []
    for config in configs:
        encoded = config.encode()
        if len(encoded) > 0xFFFF:
            raise KeyConfigError("a key config longer than 65535 bytes cannot be length-prefixed")
        out.append(len(encoded).to_bytes(2, "big") + encoded)
    if not out:
        raise KeyConfigError("application/ohttp-keys needs at least one key config")
    return b"".join(out)


def decode_ohttp_keys(data: bytes) -> tuple[KeyConfig, ...]:
    """Configs with supported KEMs, in order. Any encoding error rejects the whole body."""
    r = ByteReader(data, KeyConfigError)
    if r.at_end():
        raise KeyConfigError("empty application/ohttp-keys body")
    configs = []
    while not r.at_end():
        encoded = r.read(r.read_uint(2, "key config length"), "key config")
        if len(encoded) < 3:
            raise KeyConfigError("key config shorter than its key id and KEM id")
        if int.from_bytes(encoded[1:3], "big") not in KEM_PARAMS:
            continue  # a KEM we do not implement: skip this config, keep the others
        configs.append(KeyConfig.decode(encoded))
    return tuple(configs)
