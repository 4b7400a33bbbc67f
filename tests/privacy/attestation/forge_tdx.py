"""Synthetic TDX quotes (v4, TD report 1.0) under a test Intel-shaped chain: a P-256 root, PCK CA
and PCK certificate; a QE report signed by the PCK key and binding the attestation key; a quote
signed by the attestation key. The verifier runs on them unchanged, with the test root pinned."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from datetime import UTC, datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from traceless.privacy.attestation.tdx_quote import ECDSA_P256, TEE_TDX

_EC = ec.ECDSA(hashes.SHA256())


@dataclass(frozen=True, slots=True)
class ForgedTdx:
    quote: bytes
    root: bytes  # DER: pin it with TdxTrust(roots=(root,))
    mr_td: bytes
    rtmrs: tuple[bytes, bytes, bytes, bytes]


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, issuer: str, key, signer, ca: bool) -> x509.Certificate:
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(datetime(2020, 1, 1, tzinfo=UTC))
        .not_valid_after(datetime(2050, 1, 1, tzinfo=UTC))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(signer, hashes.SHA256())
    )


def _raw_signature(key: ec.EllipticCurvePrivateKey, data: bytes) -> bytes:
    r, s = decode_dss_signature(key.sign(data, _EC))
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")


def forge_tdx_quote(
    report_data: bytes = bytes(64), td_attributes: int = 0x10000000, mr_config_id: bytes = bytes(48)
) -> ForgedTdx:
    """A valid v4 quote; `td_attributes` bit 0 is DEBUG (the default sets only SEPT_VE_DISABLE);
    `mr_config_id` is the host-set MRCONFIGID (48 bytes)."""
    root_key, ca_key, pck_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    root = _cert("Test SGX Root CA", "Test SGX Root CA", root_key, root_key, True)
    ca = _cert("Test SGX PCK Platform CA", "Test SGX Root CA", ca_key, root_key, True)
    pck = _cert("Test SGX PCK Certificate", "Test SGX PCK Platform CA", pck_key, ca_key, False)
    chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (pck, ca, root))
    attestation_key = ec.generate_private_key(ec.SECP256R1())
    point = attestation_key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )[1:]
    auth = bytes(range(32))
    qe_report = bytearray(384)
    qe_report[320:352] = hashlib.sha256(point + auth).digest()
    cert_data = (
        bytes(qe_report)
        + _raw_signature(pck_key, bytes(qe_report))
        + struct.pack("<H", len(auth))
        + auth
        + struct.pack("<HI", 5, len(chain))
        + chain
    )
    header = struct.pack("<HHI", 4, ECDSA_P256, TEE_TDX) + bytes(4) + bytes(16) + bytes(20)
    mr_td, rtmrs = bytes([0x11]) * 48, tuple(bytes([0x20 + i]) * 48 for i in range(4))
    body = (
        bytes(16)
        + bytes(48) * 2
        + bytes(8)
        + struct.pack("<Q", td_attributes)
        + bytes(8)
        + mr_td
        + mr_config_id
        + bytes(48) * 2
        + b"".join(rtmrs)
        + report_data
    )  # MRCONFIGID, MROWNER, MROWNERCONFIG
    signature_data = (
        _raw_signature(attestation_key, header + body) + point + struct.pack("<HI", 6, len(cert_data)) + cert_data
    )
    quote = header + body + struct.pack("<I", len(signature_data)) + signature_data
    return ForgedTdx(quote=quote, root=root.public_bytes(serialization.Encoding.DER), mr_td=mr_td, rtmrs=rtmrs)  # type: ignore[arg-type]
