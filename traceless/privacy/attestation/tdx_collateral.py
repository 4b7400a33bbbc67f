"""Intel PCS collateral for a TDX quote, and the checks that need it.

Collateral is what Intel's Provisioning Certification Service publishes for a platform family
(FMSPC): TCB info (which TCB levels exist and their status), the TD quoting enclave's identity,
and CRLs for the PCK CA and the root. The JSON documents are signed by the "Intel SGX TCB Signing"
certificate, which PCS sends in an HTTP header (TCB-Info-Issuer-Chain), not in the body; it is part
of the collateral here. Each document is valid from `issueDate` to `nextUpdate`; a CRL from
thisUpdate to nextUpdate. Collateral is public and signed, so where it came from does not matter.

The TCB level evaluation (PCK certificate SVNs and the TD's TEE_TCB_SVN against the TCB info
levels, the QE identity match) is delegated to `dcap-qvl` (Phala Network, MIT, Rust core),
which re-verifies the whole quote against the same collateral and the pinned root.

Directory layout for `TdxCollateral.from_dir`:
    tcb_info.json         PCS body of /tdx/certification/v4/tcb: {"tcbInfo": {...}, "signature": hex}
    qe_identity.json      PCS body of /tdx/certification/v4/qe/identity: {"enclaveIdentity": ..., "signature"}
    tcb_signing_chain.pem the TCB-Info-Issuer-Chain header (TCB signing certificate, then root)
    pck_crl.der           PCS /sgx/certification/v4/pckcrl (DER or PEM)
    root_crl.der          Intel SGX Root CA CRL (DER or PEM)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding

from traceless.privacy.attestation import certs
from traceless.privacy.attestation.evidence import CheckFailed, MalformedEvidenceError

FILES = ("tcb_info.json", "qe_identity.json", "tcb_signing_chain.pem", "pck_crl.der", "root_crl.der")


@dataclass(frozen=True, slots=True)
class TdxCollateral:
    tcb_info: bytes
    qe_identity: bytes
    tcb_signing_chain: bytes
    pck_crl: bytes
    root_crl: bytes

    @classmethod
    def from_dir(cls, path: Path) -> TdxCollateral:
        missing = [f for f in FILES if not (path / f).is_file()]
        if missing:
            raise MalformedEvidenceError(f"collateral directory lacks {', '.join(missing)}")
        return cls(*((path / f).read_bytes() for f in FILES))


@dataclass(frozen=True, slots=True)
class SignedJson:
    """A PCS document: the exact bytes Intel signed, the parsed object and the raw signature."""

    raw: bytes
    body: dict
    signature: bytes  # r || s, big-endian, 64 bytes


def signed_json(document: bytes, member: str) -> SignedJson:
    """Split {"<member>": {...}, "signature": "hex"} keeping the member's exact bytes (the signature
    covers them as sent, so re-serializing the parsed object would not verify)."""
    try:
        text = document.decode("utf-8")
        decoder = json.JSONDecoder()
        spans = _top_level_spans(text, decoder)
        if set(spans) != {member, "signature"}:
            raise MalformedEvidenceError(f"collateral is not {{{member!r}, 'signature'}}")
        start, end = spans[member]
        body = json.loads(text[start:end])
        sig_start, sig_end = spans["signature"]
        signature = bytes.fromhex(json.loads(text[sig_start:sig_end]))
    except (ValueError, TypeError, RecursionError) as e:  # RecursionError: hostile nesting depth
        raise MalformedEvidenceError(
            f"collateral {member}: not a signed PCS JSON document ({type(e).__name__})"
        ) from None
    if not isinstance(body, dict) or len(signature) != 64:
        raise MalformedEvidenceError(f"collateral {member}: body is not an object or signature is not 64 bytes")
    return SignedJson(raw=text[start:end].encode("utf-8"), body=body, signature=signature)


def _top_level_spans(text: str, decoder: json.JSONDecoder) -> dict[str, tuple[int, int]]:
    """Character spans of the values of a JSON object's members."""
    ws = " \t\r\n"
    pos = len(text) - len(text.lstrip(ws))
    if text[pos : pos + 1] != "{":
        raise ValueError("not an object")
    pos += 1
    spans: dict[str, tuple[int, int]] = {}
    while True:
        key, pos = decoder.raw_decode(text, len(text) - len(text[pos:].lstrip(ws)))
        pos = len(text) - len(text[pos:].lstrip(ws))
        if text[pos : pos + 1] != ":" or not isinstance(key, str) or key in spans:
            raise ValueError("bad member")
        start = len(text) - len(text[pos + 1 :].lstrip(ws))
        _, end = decoder.raw_decode(text, start)
        spans[key] = (start, end)
        pos = len(text) - len(text[end:].lstrip(ws))
        if text[pos : pos + 1] == "}" and not text[pos + 1 :].strip(ws):
            return spans
        if text[pos : pos + 1] != ",":
            raise ValueError("bad separator")
        pos += 1


def load_crl(data: bytes, what: str) -> x509.CertificateRevocationList:
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            return x509.load_pem_x509_crl(data)
        return x509.load_der_x509_crl(data)
    except ValueError:
        raise MalformedEvidenceError(f"{what}: not a DER or PEM CRL") from None


def _json_time(body: dict, key: str, what: str) -> datetime:
    try:
        value = datetime.fromisoformat(body[key])
    except (KeyError, TypeError, ValueError):
        raise MalformedEvidenceError(f"{what}: {key} is missing or not an ISO 8601 time") from None
    if value.tzinfo is None:
        raise MalformedEvidenceError(f"{what}: {key} has no time zone")
    return value


@dataclass(frozen=True, slots=True)
class CheckedCollateral:
    tcb_info: SignedJson
    qe_identity: SignedJson
    tcb_signing: x509.Certificate
    pck_crl: x509.CertificateRevocationList
    root_crl: x509.CertificateRevocationList


def check_signatures(
    col: TdxCollateral, roots: list[x509.Certificate], pck_ca: x509.Certificate, at: datetime
) -> tuple[CheckedCollateral, str]:
    """TCB signing certificate under a pinned root; TCB info, QE identity and both CRLs signed."""
    chain = certs.load_pem_chain(col.tcb_signing_chain, "TCB signing chain")
    root = certs.check_chain(chain, roots, at, ["TCB signing certificate"])
    signing = chain[0]
    key = certs.ec_public_key(signing, ec.SECP256R1, "TCB signing")
    tcb_info = signed_json(col.tcb_info, "tcbInfo")
    qe_identity = signed_json(col.qe_identity, "enclaveIdentity")
    for doc, what in ((tcb_info, "TCB info"), (qe_identity, "QE identity")):
        try:
            key.verify(certs.ecdsa_signature(doc.signature, "big"), doc.raw, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            raise CheckFailed(f"{what} signature does not verify under the TCB signing key") from None
    pck_crl, root_crl = load_crl(col.pck_crl, "PCK CRL"), load_crl(col.root_crl, "root CRL")
    for crl, issuer, what in ((pck_crl, pck_ca, "PCK CRL"), (root_crl, root, "root CRL")):
        if crl.issuer != issuer.subject or not crl.is_signature_valid(certs.issuer_public_key(issuer, what)):
            raise CheckFailed(f"{what} is not signed by {certs.common_name(issuer)}")
    return CheckedCollateral(tcb_info, qe_identity, signing, pck_crl, root_crl), (
        "TCB info and QE identity signed by the Intel TCB signing key (under the pinned root); "
        f"PCK CRL signed by {certs.common_name(pck_ca)}, root CRL by {certs.common_name(root)}"
    )


def check_current(col: CheckedCollateral, at: datetime) -> tuple[None, str]:
    """Every piece of collateral is inside its validity window at `at`."""
    for doc, member, what in ((col.tcb_info, "issueDate", "TCB info"), (col.qe_identity, "issueDate", "QE identity")):
        issued, expires = _json_time(doc.body, member, what), _json_time(doc.body, "nextUpdate", what)
        if not issued <= at < expires:
            raise CheckFailed(f"{what} is valid {issued.isoformat()} to {expires.isoformat()}, not at {at.isoformat()}")
    expiries = [
        _json_time(col.tcb_info.body, "nextUpdate", "TCB info"),
        _json_time(col.qe_identity.body, "nextUpdate", "QE identity"),
    ]
    for crl, what in ((col.pck_crl, "PCK CRL"), (col.root_crl, "root CRL")):
        next_update = crl.next_update_utc
        if next_update is None or not crl.last_update_utc <= at < next_update:
            raise CheckFailed(
                f"{what} is not current at {at.isoformat()} (next update "
                f"{next_update.isoformat() if next_update else 'absent'})"
            )
        expiries.append(next_update)
    soonest = min(expiries)
    return None, f"TCB info, QE identity and CRLs are current at {at.isoformat()} (first expiry {soonest.isoformat()})"


def check_revocation(col: CheckedCollateral, pck_chain: list[x509.Certificate]) -> tuple[None, str]:
    """Neither the PCK certificate, its CA nor the TCB signing certificate is revoked."""
    leaf, ca = pck_chain[0], pck_chain[1]
    for crl, cert, what in (
        (col.pck_crl, leaf, "PCK certificate"),
        (col.root_crl, ca, "PCK CA"),
        (col.root_crl, col.tcb_signing, "TCB signing certificate"),
    ):
        if crl.get_revoked_certificate_by_serial_number(cert.serial_number) is not None:
            raise CheckFailed(f"the {what} ({certs.common_name(cert)}) is revoked")
    return None, "PCK certificate, PCK CA and TCB signing certificate are not on the CRLs"


def tcb_status(
    quote: bytes, col: CheckedCollateral, raw: TdxCollateral, pck_issuer_chain: bytes, root_der: bytes, at: datetime
) -> tuple[str, tuple[str, ...]]:
    """dcap-qvl's verdict for the quote under this collateral and the pinned root: the TCB status
    of the matching TCB level ("UpToDate", "OutOfDate", ...) and the Intel advisories it lists.
    dcap-qvl raises ValueError when it cannot match a TCB level or any of its own checks fails."""
    import dcap_qvl  # imported here: a 6 MB native module that only this check needs

    collateral = dcap_qvl.QuoteCollateralV3(
        pck_crl_issuer_chain=pck_issuer_chain.decode("ascii"),
        root_ca_crl=col.root_crl.public_bytes(Encoding.DER),
        pck_crl=col.pck_crl.public_bytes(Encoding.DER),
        tcb_info_issuer_chain=raw.tcb_signing_chain.decode("ascii"),
        tcb_info=col.tcb_info.raw.decode("utf-8"),
        tcb_info_signature=col.tcb_info.signature,
        qe_identity_issuer_chain=raw.tcb_signing_chain.decode("ascii"),
        qe_identity=col.qe_identity.raw.decode("utf-8"),
        qe_identity_signature=col.qe_identity.signature,
    )
    report = dcap_qvl.verify_with_root_ca(quote, collateral, root_der, int(at.timestamp()))
    return str(report.status), tuple(str(a) for a in report.advisory_ids)
