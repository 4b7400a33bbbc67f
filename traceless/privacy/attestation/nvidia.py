"""NVIDIA Hopper (H100) GPU attestation: an SPDM measurement report signed by the GPU's attestation
key, whose certificate chains to NVIDIA's device identity root.

Trust chain:  pinned NVIDIA Device Identity CA (ECDSA P-384)
                -> NVIDIA GH100 Identity -> GH100 Provisioner ICA -> GH100 GSP BROM (per chip)
                  -> GSP FMC leaf (the attestation key; its TCG DICE FWID names the firmware)
                    -> request || response without the signature   ECDSA P-384, SHA-384

What this verifier does NOT do (each is a check reported as not run): it checks no certificate's
revocation (NVIDIA's OCSP service is online-only), and it does not parse or verify NVIDIA's
reference integrity manifests (RIM, signed SWID XML): measurements are compared only with
reference values the caller supplies, {block index: allowed digests}, taken from a RIM it verified.

    result = verify_nvidia(NvidiaEvidence(report, chain_pem), NvidiaTrust(roots=(nvidia_root,)),
                           NvidiaPolicy(reference=refs), nonce=client_nonce, at=now)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from traceless.privacy.attestation import certs
from traceless.privacy.attestation.evidence import CheckFailed, CheckRun, VerificationResult
from traceless.privacy.attestation.nvidia_spdm import NONCE_SIZE, SpdmReport, parse_spdm_report

CHECKS = (
    "report-format",
    "cert-chain",
    "fwid-binding",
    "report-signature",
    "nonce",
    "reference-measurements",
    "rim-signature",
    "revocation",
)
STATEMENT = (
    "a GPU holding an NVIDIA-certified attestation key signed these measurements in answer to this "
    "nonce, running the firmware its certificate names"
)
_TCG_DICE_FWID = "2.23.133.5.4.1"  # Hopper: the FWID is the extension value's last 48 bytes
_FWID_SIZE = 48


@dataclass(frozen=True, slots=True)
class NvidiaEvidence:
    report: bytes  # what nvmlDeviceGetConfComputeGpuAttestationReport returns (request || response)
    cert_chain: bytes  # PEM, leaf first, what nvmlDeviceGetConfComputeGpuCertificate returns


@dataclass(frozen=True, slots=True)
class NvidiaTrust:
    roots: tuple[bytes, ...]  # pinned NVIDIA device identity root(s), DER or PEM


@dataclass(frozen=True, slots=True)
class NvidiaPolicy:
    # block index -> allowed measurement values; every block the report holds must be listed
    reference: Mapping[int, frozenset[bytes]] | None = None


@dataclass(frozen=True, slots=True)
class NvidiaClaims:
    nonce: bytes
    measurements: Mapping[int, bytes]  # read-only
    driver_version: str | None
    vbios_version: str | None
    fwid: bytes | None
    leaf_subject: str


def verify_nvidia(
    evidence: NvidiaEvidence,
    trust: NvidiaTrust,
    policy: NvidiaPolicy = NvidiaPolicy(),
    *,
    nonce: bytes | None = None,
    at: datetime | None = None,
) -> VerificationResult:
    """Verify a GPU attestation report; never raises on bad evidence (a failed check says why)."""
    when = at or datetime.now(UTC)
    run = CheckRun("nvidia", CHECKS, STATEMENT)
    return run.complete(lambda: _verify(run, evidence, trust, policy, nonce, when))


def _verify(
    run: CheckRun, ev: NvidiaEvidence, trust: NvidiaTrust, policy: NvidiaPolicy, nonce: bytes | None, at: datetime
) -> NvidiaClaims:
    report = run.run("report-format", lambda: _format(ev.report))
    chain = run.run("cert-chain", lambda: _chain(ev.cert_chain, trust, at))
    if report.fwid is None:
        run.skip("fwid-binding", "not run: the report carries no FWID")
    else:
        run.run("fwid-binding", lambda: _fwid(report, chain[0]))
    run.run("report-signature", lambda: _signature(report, chain[0]))
    if nonce is None:
        run.skip("nonce", "not run: no expected nonce given")
    else:
        run.run("nonce", lambda: _nonce(report, nonce))
    reference = policy.reference
    if reference is None:
        run.skip("reference-measurements", "not run: no reference values (RIM) given")
    else:
        run.run("reference-measurements", lambda: _reference(report, reference))
    run.skip("rim-signature", "not run: RIM (SWID XML) parsing and signature checking are not implemented")
    run.skip("revocation", "not run: certificate revocation (NVIDIA OCSP) is not checked offline")
    return NvidiaClaims(
        nonce=report.nonce,
        measurements=report.measurements,
        driver_version=report.driver_version,
        vbios_version=report.vbios_version,
        fwid=report.fwid,
        leaf_subject=chain[0].subject.rfc4514_string(),
    )


def _format(data: bytes) -> tuple[SpdmReport, str]:
    report = parse_spdm_report(data)
    return report, (
        f"SPDM 1.{report.spdm_version & 0xF} GET_MEASUREMENTS: {len(report.measurements)} measurement "
        f"blocks, driver {report.driver_version}, VBIOS {report.vbios_version}"
    )


def _chain(pem: bytes, trust: NvidiaTrust, at: datetime) -> tuple[list[x509.Certificate], str]:
    chain = list(certs.load_pem_chain(pem, "GPU certificate chain"))
    roots = [certs.load_certificate(r, "pinned NVIDIA root") for r in trust.roots]
    root = certs.check_chain(chain, roots, at, ["GPU attestation certificate"])
    names = " <- ".join(certs.common_name(c) for c in chain if c.subject != c.issuer)
    return chain, f"{names} <- {certs.common_name(root)} (pinned), valid at {at.date().isoformat()}"


def _certificate_fwid(leaf: x509.Certificate) -> bytes | None:
    for ext in leaf.extensions:
        if ext.oid.dotted_string == _TCG_DICE_FWID and isinstance(ext.value, x509.UnrecognizedExtension):
            value = ext.value.value
            return value[-_FWID_SIZE:] if len(value) >= _FWID_SIZE else None
    return None


def _fwid(report: SpdmReport, leaf: x509.Certificate) -> tuple[None, str]:
    leaf_fwid = _certificate_fwid(leaf)
    if leaf_fwid is None:
        raise CheckFailed("the report carries an FWID but the attestation certificate has none")
    if report.fwid != leaf_fwid:
        raise CheckFailed("the report's FWID differs from the attestation certificate's TCG DICE FWID")
    return None, f"the report's FWID equals the certificate's ({leaf_fwid.hex()[:16]}...)"


def _signature(report: SpdmReport, leaf: x509.Certificate) -> tuple[None, str]:
    key = certs.ec_public_key(leaf, ec.SECP384R1, "GPU attestation")
    key.verify(certs.ecdsa_signature(report.signature, "big"), report.signed_bytes, ec.ECDSA(hashes.SHA384()))
    return None, f"ECDSA P-384/SHA-384 over request || response ({len(report.signed_bytes)} bytes) verifies"


def _nonce(report: SpdmReport, expected: bytes) -> tuple[None, str]:
    if len(expected) != NONCE_SIZE:
        raise CheckFailed(f"expected nonce is {len(expected)} bytes, not {NONCE_SIZE}")
    if report.nonce != expected:
        raise CheckFailed("the request's nonce differs from the expected nonce")
    return None, "the signed request carries the expected nonce"


def _reference(report: SpdmReport, reference: Mapping[int, frozenset[bytes]]) -> tuple[None, str]:
    unlisted = sorted(set(report.measurements) - set(reference))
    if unlisted:
        raise CheckFailed(f"measurement blocks {unlisted[:8]} have no reference value")
    wrong = sorted(i for i, v in report.measurements.items() if v not in reference[i])
    if wrong:
        raise CheckFailed(f"measurement blocks {wrong[:8]} differ from the reference values")
    return None, f"all {len(report.measurements)} measurement blocks equal a reference value"
