"""Certificate-chain checks shared by the hardware verifiers, on `cryptography`'s primitives.

Vendor chains are short and fixed (AMD ARK -> ASK -> VCEK, Intel root -> PCK CA -> PCK leaf,
NVIDIA device root -> ... -> GPU leaf), so each link is checked directly: the issuer's name and
signature, the validity window at the verification time, and that every issuer is a CA. A root
is trusted by its public key: the caller pins roots, and a presented root counts only when its
key and subject equal a pinned one (vendors re-issue root certificates with the same key).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPublicKeyTypes
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.utils import CryptographyDeprecationWarning

from traceless.privacy.attestation.evidence import CheckFailed, MalformedEvidenceError

_PEM_BEGIN = b"-----BEGIN CERTIFICATE-----"
# Key kinds that can sign a certificate or CRL (cryptography >= 44; later versions add ML-DSA).
_ISSUER_KEYS = (
    ec.EllipticCurvePublicKey,
    rsa.RSAPublicKey,
    dsa.DSAPublicKey,
    ed25519.Ed25519PublicKey,
    ed448.Ed448PublicKey,
)


def load_certificate(data: bytes, what: str) -> x509.Certificate:
    """One certificate, PEM or DER. AMD's VCEKs carry serial number 0, which `cryptography`
    parses with a deprecation warning; the warning is silenced here, where it is expected."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CryptographyDeprecationWarning)
            if data.lstrip().startswith(_PEM_BEGIN):
                return x509.load_pem_x509_certificate(data)
            return x509.load_der_x509_certificate(data)
    except ValueError:
        raise MalformedEvidenceError(f"{what}: not a PEM or DER X.509 certificate") from None


def load_pem_chain(data: bytes, what: str) -> tuple[x509.Certificate, ...]:
    """Concatenated PEM certificates, leaf first. Bytes outside the PEM blocks are refused."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CryptographyDeprecationWarning)
            chain = tuple(x509.load_pem_x509_certificates(data))
    except ValueError:
        raise MalformedEvidenceError(f"{what}: not a PEM certificate chain") from None
    rebuilt = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chain)
    if rebuilt.split() != data.rstrip(b"\x00").split():
        raise MalformedEvidenceError(f"{what}: data outside the PEM certificates")
    return chain


def public_key_der(cert: x509.Certificate) -> bytes:
    return cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def common_name(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return str(names[0].value) if names else cert.subject.rfc4514_string()


def is_pinned(cert: x509.Certificate, roots: Iterable[x509.Certificate]) -> bool:
    """The certificate is one of the pinned roots: same subject, same public key, self-signed."""
    key = public_key_der(cert)
    if not any(r.subject == cert.subject and public_key_der(r) == key for r in roots):
        return False
    try:
        cert.verify_directly_issued_by(cert)
    except (InvalidSignature, UnsupportedAlgorithm, ValueError, TypeError):
        return False
    return True


def check_valid_at(cert: x509.Certificate, at: datetime, what: str) -> None:
    if not cert.not_valid_before_utc <= at <= cert.not_valid_after_utc:
        raise CheckFailed(
            f"{what} ({common_name(cert)}) is not valid at {at.isoformat()}: "
            f"valid {cert.not_valid_before_utc.isoformat()} to {cert.not_valid_after_utc.isoformat()}"
        )


def check_issued_by(child: x509.Certificate, issuer: x509.Certificate, at: datetime, what: str) -> None:
    """`child` names and is signed by `issuer`, which is a CA; both are valid at `at`."""
    if child.issuer != issuer.subject:
        raise CheckFailed(
            f"{what} ({common_name(child)}) is issued by {child.issuer.rfc4514_string()}, not by {common_name(issuer)}"
        )
    try:
        basic = issuer.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        basic = None
    if basic is not None and not basic.ca:
        raise CheckFailed(f"{common_name(issuer)} is not a CA certificate")
    try:
        child.verify_directly_issued_by(issuer)
    except (InvalidSignature, UnsupportedAlgorithm, ValueError, TypeError) as e:  # TypeError: key kind
        raise CheckFailed(
            f"{what} ({common_name(child)}): signature by {common_name(issuer)} does not verify ({type(e).__name__})"
        ) from None
    check_valid_at(child, at, what)
    check_valid_at(issuer, at, f"issuer of {what}")


def check_chain(
    chain: Sequence[x509.Certificate], roots: Sequence[x509.Certificate], at: datetime, names: Sequence[str]
) -> x509.Certificate:
    """Leaf-first `chain` links up to a pinned root and returns that root. The chain may end with
    the root itself, which then must be pinned; the pinned certificate is what verifies the link.
    `names` label the chain's certificates in messages ("VCEK", "ASK", ...)."""
    certs = list(chain)
    if certs and certs[-1].subject == certs[-1].issuer:
        presented = certs.pop()
        if not is_pinned(presented, roots):
            raise CheckFailed(f"the chain's root ({common_name(presented)}) is not a pinned root")
    if not certs:
        raise CheckFailed("no certificate below the root")
    label = [names[i] if i < len(names) else f"certificate {i}" for i in range(len(certs))]
    for i in range(len(certs) - 1):
        check_issued_by(certs[i], certs[i + 1], at, label[i])
    candidates = [r for r in roots if r.subject == certs[-1].issuer]
    if not candidates:
        raise CheckFailed(
            f"{label[-1]} ({common_name(certs[-1])}) is issued by "
            f"{certs[-1].issuer.rfc4514_string()}, which is not a pinned root"
        )
    for root in candidates[:-1]:
        try:
            check_issued_by(certs[-1], root, at, label[-1])
            return root
        except CheckFailed:
            continue  # another pinned root of the same name may hold the key
    check_issued_by(certs[-1], candidates[-1], at, label[-1])
    return candidates[-1]


def ecdsa_signature(raw: bytes, byteorder: Literal["little", "big"]) -> bytes:
    """DER signature from raw r || s of equal length (AMD writes them little-endian, Intel and
    NVIDIA big-endian)."""
    half = len(raw) // 2
    r, s = int.from_bytes(raw[:half], byteorder), int.from_bytes(raw[half:], byteorder)
    return encode_dss_signature(r, s)


def issuer_public_key(cert: x509.Certificate, what: str) -> CertificateIssuerPublicKeyTypes:
    """The certificate's public key, as a key that can verify a signature it made (a CRL's)."""
    key = cert.public_key()
    if not isinstance(key, _ISSUER_KEYS):
        raise CheckFailed(f"{what} key ({type(key).__name__}) cannot verify signatures")
    return key


def ec_public_key(cert: x509.Certificate, curve: type[ec.EllipticCurve], what: str) -> ec.EllipticCurvePublicKey:
    key = cert.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, curve):
        raise CheckFailed(f"{what} key is not an ECDSA {curve.name} key")
    return key
