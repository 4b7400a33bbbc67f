"""Hybrid Public Key Encryption, base mode (RFC 9180 §5.1, §5.1.1, §5.2, §5.3, §6.1).

    enc, ctx = setup_base_s(suite, pk_r, info)     # sender
    ctx      = setup_base_r(suite, enc, sk_r, info) # recipient
    ctx.seal(aad, pt) / ctx.open(aad, ct) / ctx.export(exporter_context, length)
    seal_base(...) / open_base(...)                 # single-shot (§6.1)

The primitives (DH, HKDF, AEAD) are `cryptography`'s; this module is the key schedule and the
context state machine. State rules (STYLE rule 7): `open` advances the sequence number only
after the tag verified, and every failure of `setup_base_r` or `open` is the one opaque
`DecryptError`. A context is not thread-safe; use one per message exchange.
"""

from __future__ import annotations

from dataclasses import dataclass

from traceless.privacy.errors import UnsupportedAlgorithmError
from traceless.privacy.hpke import kem as hpke_kem
from traceless.privacy.hpke.aead import AeadId, AeadKey, aead_id_from_int, aead_sizes
from traceless.privacy.hpke.errors import SequenceOverflowError
from traceless.privacy.hpke.kdf import Kdf, KdfId, kdf_id_from_int
from traceless.privacy.hpke.kem import KemId, KemPrivateKey, kem_id_from_int

MODE_BASE = 0x00


@dataclass(frozen=True, slots=True)
class Suite:
    """An HPKE cipher suite: (KEM, KDF, AEAD) identifiers and the sizes they imply."""

    kem_id: KemId
    kdf_id: KdfId
    aead_id: AeadId

    @classmethod
    def from_ids(cls, kem_id: int, kdf_id: int, aead_id: int) -> Suite:
        """Suite from wire values; unknown ids raise UnsupportedAlgorithmError."""
        return cls(kem_id_from_int(kem_id), kdf_id_from_int(kdf_id), aead_id_from_int(aead_id))

    @property
    def suite_id(self) -> bytes:
        """ "HPKE" || I2OSP(kem_id, 2) || I2OSP(kdf_id, 2) || I2OSP(aead_id, 2) (§5.1)."""
        ids = (self.kem_id, self.kdf_id, self.aead_id)
        return b"HPKE" + b"".join(i.to_bytes(2, "big") for i in ids)

    @property
    def kdf(self) -> Kdf:
        return Kdf(self.kdf_id, self.suite_id)

    @property
    def n_enc(self) -> int:
        return hpke_kem.KEM_PARAMS[self.kem_id].n_enc

    @property
    def n_k(self) -> int:
        return aead_sizes(self.aead_id)[0]

    @property
    def n_n(self) -> int:
        return aead_sizes(self.aead_id)[1]

    @property
    def n_t(self) -> int:
        return aead_sizes(self.aead_id)[2]


@dataclass(frozen=True, slots=True, repr=False)
class KeySchedule:
    """Outputs of KeyScheduleBase (§5.1): AEAD key, base nonce and exporter secret."""

    key: bytes
    base_nonce: bytes
    exporter_secret: bytes


def key_schedule_base(suite: Suite, shared_secret: bytes, info: bytes) -> KeySchedule:
    """KeySchedule(mode_base, shared_secret, info, psk="", psk_id="") (§5.1)."""
    kdf = suite.kdf
    psk_id_hash = kdf.labeled_extract(b"", b"psk_id_hash", b"")
    info_hash = kdf.labeled_extract(b"", b"info_hash", info)
    key_schedule_context = bytes([MODE_BASE]) + psk_id_hash + info_hash
    secret = kdf.labeled_extract(shared_secret, b"secret", b"")
    return KeySchedule(
        key=kdf.labeled_expand(secret, b"key", key_schedule_context, suite.n_k),
        base_nonce=kdf.labeled_expand(secret, b"base_nonce", key_schedule_context, suite.n_n),
        exporter_secret=kdf.labeled_expand(secret, b"exp", key_schedule_context, kdf.n_h),
    )


class _Context:
    """Shared state of sender and recipient contexts: AEAD key, nonce sequence, exporter."""

    __slots__ = ("suite", "_aead", "_base_nonce", "_seq", "_exporter_secret")

    def __init__(self, suite: Suite, schedule: KeySchedule) -> None:
        self.suite = suite
        export_only = suite.aead_id is AeadId.EXPORT_ONLY
        self._aead = None if export_only else AeadKey(suite.aead_id, schedule.key)
        self._base_nonce = schedule.base_nonce
        self._seq = 0
        self._exporter_secret = schedule.exporter_secret

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.suite}, seq={self._seq}, <redacted>)"

    @property
    def seq(self) -> int:
        return self._seq

    def _require_aead(self) -> AeadKey:
        if self._aead is None:
            raise UnsupportedAlgorithmError("export-only suite: seal and open are not available")
        if self._seq >= (1 << (8 * self.suite.n_n)) - 1:
            raise SequenceOverflowError("HPKE sequence number exhausted")
        return self._aead

    def _compute_nonce(self) -> bytes:
        # ComputeNonce(seq) = base_nonce XOR I2OSP(seq, Nn)  (§5.2)
        n_n = self.suite.n_n
        return (int.from_bytes(self._base_nonce, "big") ^ self._seq).to_bytes(n_n, "big")

    def export(self, exporter_context: bytes, length: int) -> bytes:
        """Export(exporter_context, L) = LabeledExpand(exporter_secret, "sec", ctx, L) (§5.3)."""
        kdf = self.suite.kdf
        if not 0 < length <= 255 * kdf.n_h:
            raise ValueError(f"export length must be in 1..{255 * kdf.n_h}, got {length}")
        return kdf.labeled_expand(self._exporter_secret, b"sec", exporter_context, length)


class SenderContext(_Context):
    """ContextS (§5.2): seals messages in order and exports secrets."""

    __slots__ = ()

    def seal(self, aad: bytes, pt: bytes) -> bytes:
        aead = self._require_aead()
        ct = aead.seal(self._compute_nonce(), aad, pt)
        self._seq += 1
        return ct


class RecipientContext(_Context):
    """ContextR (§5.2): opens messages in order and exports secrets."""

    __slots__ = ()

    def open(self, aad: bytes, ct: bytes) -> bytes:
        """Open the next message. On failure raises DecryptError and the context is unchanged."""
        aead = self._require_aead()
        pt = aead.open(self._compute_nonce(), aad, ct)  # raises before any state change
        self._seq += 1
        return pt

    def open_into(self, aad: bytes, ct: bytes) -> bytearray:
        """As `open`, into a bytearray the caller owns and can zero."""
        aead = self._require_aead()
        pt = aead.open_into(self._compute_nonce(), aad, ct)  # raises before any state change
        self._seq += 1
        return pt


def setup_base_s(
    suite: Suite, pk_r: bytes, info: bytes, *, _ephemeral_for_tests: KemPrivateKey | None = None
) -> tuple[bytes, SenderContext]:
    """SetupBaseS(pkR, info) -> (enc, context).

    `_ephemeral_for_tests` is for known-answer tests only: it replaces the fresh ephemeral key,
    which production code must never do (a reused ephemeral key links requests and leaks them).
    """
    shared_secret, enc = hpke_kem.encap(suite.kem_id, pk_r, _ephemeral_for_tests)
    return enc, SenderContext(suite, key_schedule_base(suite, shared_secret, info))


def setup_base_r(suite: Suite, enc: bytes, sk_r: KemPrivateKey, info: bytes) -> RecipientContext:
    """SetupBaseR(enc, skR, info) -> context. An invalid `enc` raises DecryptError."""
    if sk_r.kem_id is not suite.kem_id:
        raise UnsupportedAlgorithmError("private key belongs to another KEM than the suite's")
    shared_secret = hpke_kem.decap(enc, sk_r)
    return RecipientContext(suite, key_schedule_base(suite, shared_secret, info))


def seal_base(suite: Suite, pk_r: bytes, info: bytes, aad: bytes, pt: bytes) -> tuple[bytes, bytes]:
    """Single-shot SealBase(pkR, info, aad, pt) -> (enc, ct) (§6.1)."""
    enc, ctx = setup_base_s(suite, pk_r, info)
    return enc, ctx.seal(aad, pt)


def open_base(suite: Suite, enc: bytes, sk_r: KemPrivateKey, info: bytes, aad: bytes, ct: bytes) -> bytes:
    """Single-shot OpenBase(enc, skR, info, aad, ct) -> pt (§6.1); failures are DecryptError."""
    return setup_base_r(suite, enc, sk_r, info).open(aad, ct)
