"""Synthetic NVIDIA GPU evidence for tests: NVIDIA's sample report with a chosen nonce, re-signed by
a test attestation key under a test root (the real sample binds NVIDIA's fixed nonce, so it can
stand only for a replayed report)."""

from __future__ import annotations

from datetime import UTC, datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from tests.vectors import vector_path
from traceless.privacy.attestation.nvidia import NvidiaEvidence, NvidiaTrust
from traceless.privacy.attestation.nvidia_spdm import NONCE_SIZE, SIGNATURE_SIZE, parse_spdm_report

_FWID_OID = x509.ObjectIdentifier("2.23.133.5.4.1")
NOT_BEFORE, NOT_AFTER = datetime(2020, 1, 1, tzinfo=UTC), datetime(2040, 1, 1, tzinfo=UTC)


def sample_report() -> bytes:
    text = vector_path("attestation/nvidia-h100/hopperAttestationReport.txt").read_bytes()
    return bytes.fromhex(text.decode())


def _cert(cn: str, issuer: str, key, signer, *, ca: bool, fwid: bytes | None = None) -> x509.Certificate:
    name = lambda n: x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, n)])  # noqa: E731
    builder = (
        x509.CertificateBuilder()
        .subject_name(name(cn))
        .issuer_name(name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOT_BEFORE)
        .not_valid_after(NOT_AFTER)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if fwid is not None:
        builder = builder.add_extension(x509.UnrecognizedExtension(_FWID_OID, b"\x30\x00" + fwid), critical=False)
    return builder.sign(signer, hashes.SHA384())


class GpuTestChain:
    """A test root and GPU attestation key; `evidence(nonce)` signs the sample report for `nonce`."""

    def __init__(self) -> None:
        self._fwid = parse_spdm_report(sample_report()).fwid
        root_key, self._leaf_key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
        root = _cert("Test GPU Root", "Test GPU Root", root_key, root_key, ca=True)
        leaf = _cert("Test GPU AK", "Test GPU Root", self._leaf_key, root_key, ca=False, fwid=self._fwid)
        self.pem_chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (leaf, root))
        self.trust = NvidiaTrust(roots=(root.public_bytes(serialization.Encoding.PEM),))

    def evidence(self, nonce: bytes) -> NvidiaEvidence:
        assert len(nonce) == NONCE_SIZE
        sample = sample_report()
        signed = sample[:4] + nonce + sample[4 + NONCE_SIZE : -SIGNATURE_SIZE]
        r, s = decode_dss_signature(self._leaf_key.sign(signed, ec.ECDSA(hashes.SHA384())))
        return NvidiaEvidence(report=signed + r.to_bytes(48, "big") + s.to_bytes(48, "big"), cert_chain=self.pem_chain)
