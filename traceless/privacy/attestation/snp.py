"""AMD SEV-SNP verification: a report, the VCEK (or VLEK) that signed it, AMD's chain to a pinned ARK.

Trust chain:  pinned ARK (RSA-4096, self-signed, one per product line)
                -> ASK (or ASVK for a VLEK)             RSA-PSS, SHA-384, salt 48
                  -> VCEK / VLEK (ECDSA P-384)          RSA-PSS, SHA-384, salt 48
                    -> report bytes [0, 0x2A0)          ECDSA P-384, SHA-384

A VCEK is derived by the AMD secure processor from the chip's secret and its firmware TCB, so a
report that verifies under a VCEK whose extensions name the report's CHIP_ID and REPORTED_TCB
was produced by that chip at that TCB. What the report then says about the guest (launch
measurement, policy, REPORT_DATA) is what the secure processor measured and was asked to sign.

    result = verify_snp(SnpEvidence(report, vcek), SnpTrust(arks, asks), SnpPolicy(...),
                        report_data=expected_64_bytes, at=now)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from traceless.privacy.attestation import certs
from traceless.privacy.attestation.evidence import CheckFailed, CheckRun, MalformedEvidenceError, VerificationResult
from traceless.privacy.attestation.snp_certs import (
    ARK_GUID,
    ASK_GUID,
    EndorsementExtensions,
    endorsement_extensions,
    parse_cert_table,
)
from traceless.privacy.attestation.snp_report import (
    ECDSA_P384_SHA384,
    ProductLine,
    Signer,
    SnpReport,
    TcbVersion,
    decode_tcb,
    parse_snp_report,
)

CHECKS = (
    "report-format",
    "cert-chain",
    "report-signature",
    "tcb-binding",
    "minimum-tcb",
    "guest-policy",
    "measurement",
    "report-data",
    "revocation",
)
STATEMENT = (
    "a genuine AMD secure processor, at the reported TCB, signed this report for an SEV-SNP guest "
    "with this launch measurement, guest policy and REPORT_DATA"
)
_PSS_SALT = 48


@dataclass(frozen=True, slots=True)
class SnpEvidence:
    """What a node hands a client. Certificates are DER or PEM; ASK and ARK may be omitted when the
    verifier pins them (`SnpTrust.asks`)."""

    report: bytes
    vcek: bytes  # the VCEK or VLEK certificate
    ask: bytes | None = None
    ark: bytes | None = None

    @classmethod
    def from_extended(cls, report: bytes, cert_table: bytes) -> SnpEvidence:
        """From configfs-tsm's `outblob` (the report) and `auxblob` (the GUID certificate table)."""
        table = parse_cert_table(cert_table)
        vcek = table.endorsement_key
        if vcek is None:
            raise MalformedEvidenceError("certificate table holds no VCEK or VLEK")
        return cls(report=report, vcek=vcek, ask=table.get(ASK_GUID), ark=table.get(ARK_GUID))


@dataclass(frozen=True, slots=True)
class SnpTrust:
    """Pinned AMD roots (ARKs, one per product line) and, optionally, known ASKs/ASVKs to use when
    the evidence carries none. Certificates are DER or PEM."""

    arks: tuple[bytes, ...]
    asks: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class SnpPolicy:
    minimum_tcb: TcbVersion | None = None  # compared with REPORTED_TCB, component by component
    measurements: frozenset[bytes] | None = None  # allowed launch measurements (48 bytes each)
    allow_migration_agent: bool = False
    allow_smt: bool = True
    max_vmpl: int = 3  # highest VMPL the report may have been requested from


@dataclass(frozen=True, slots=True)
class SnpClaims:
    product: str  # the VCEK's product name, e.g. "Milan-B0"
    signer: str  # "VCEK" or "VLEK"
    version: int
    measurement: bytes
    report_data: bytes
    host_data: bytes
    reported_tcb: TcbVersion
    current_tcb: TcbVersion
    committed_tcb: TcbVersion
    launch_tcb: TcbVersion
    chip_id: bytes
    guest_svn: int
    policy: int
    debug: bool
    migrate_ma: bool
    smt_allowed: bool
    vmpl: int
    family_id: bytes
    image_id: bytes
    id_key_digest: bytes
    author_key_digest: bytes
    report_id: bytes
    platform_info: int


def verify_snp(
    evidence: SnpEvidence,
    trust: SnpTrust,
    policy: SnpPolicy = SnpPolicy(),
    *,
    report_data: bytes | None = None,
    at: datetime | None = None,
) -> VerificationResult:
    """Verify SEV-SNP evidence; never raises on bad evidence (a failed check says why)."""
    when = at or datetime.now(UTC)
    run = CheckRun("snp", CHECKS, STATEMENT)
    return run.complete(lambda: _verify(run, evidence, trust, policy, report_data, when))


def _verify(
    run: CheckRun, ev: SnpEvidence, trust: SnpTrust, policy: SnpPolicy, report_data: bytes | None, at: datetime
) -> SnpClaims:
    # Each lambda runs at once, inside run.run, so it sees the values assigned just before it.
    report = run.run("report-format", lambda: _format(ev.report))
    chain = run.run("cert-chain", lambda: _chain(ev, trust, at))
    ext = run.run("report-signature", lambda: _signature(report, chain[0]))
    tcb = run.run("tcb-binding", lambda: _tcb_binding(report, ext))
    minimum_tcb, measurements = policy.minimum_tcb, policy.measurements
    if minimum_tcb is None:
        run.skip("minimum-tcb", "not run: the policy sets no minimum TCB")
    else:
        run.run("minimum-tcb", lambda: _minimum_tcb(tcb, minimum_tcb))
    run.run("guest-policy", lambda: _guest_policy(report, policy))
    if measurements is None:
        run.skip("measurement", "not run: no expected launch measurement given")
    else:
        run.run("measurement", lambda: _measurement(report, measurements))
    if report_data is None:
        run.skip("report-data", "not run: no expected REPORT_DATA given")
    else:
        run.run("report-data", lambda: _report_data(report, report_data))
    run.skip("revocation", "not run: AMD's ASK/VCEK revocation list (KDS CRL) is not consulted offline")
    return _claims(report, ext, tcb)


def _format(data: bytes) -> tuple[SnpReport, str]:
    report = parse_snp_report(data)
    if report.signature_algo != ECDSA_P384_SHA384:
        raise CheckFailed(f"signature algorithm {report.signature_algo} is not ECDSA P-384 with SHA-384 (1)")
    if report.signer is Signer.NONE:
        raise CheckFailed("the report is unsigned (KEY_INFO.SIGNING_KEY = none)")
    return report, f"SEV-SNP report version {report.version}, {len(data)} bytes, signed by the {report.signer.name}"


def _certificates(ev: SnpEvidence, trust: SnpTrust) -> list[x509.Certificate]:
    """[VCEK, ASK, ARK]: the ASK and ARK from the evidence or the pins; a presented ARK must be pinned."""
    roots = [certs.load_certificate(a, "pinned ARK") for a in trust.arks]
    vcek = certs.load_certificate(ev.vcek, "VCEK")
    if ev.ask is not None:
        ask = certs.load_certificate(ev.ask, "ASK")
    else:
        known = [certs.load_certificate(a, "pinned ASK") for a in trust.asks]
        pinned_ask = next((a for a in known if a.subject == vcek.issuer), None)
        if pinned_ask is None:
            raise CheckFailed(f"no ASK given and none pinned for the VCEK's issuer {vcek.issuer.rfc4514_string()}")
        ask = pinned_ask
    if ev.ark is not None:
        ark = certs.load_certificate(ev.ark, "ARK")
        if not certs.is_pinned(ark, roots):
            raise CheckFailed(f"the presented ARK ({certs.common_name(ark)}) is not a pinned root")
    else:
        pinned_ark = next((r for r in roots if r.subject == ask.issuer), None)
        if pinned_ark is None:
            raise CheckFailed(f"no pinned ARK named {ask.issuer.rfc4514_string()}")
        ark = pinned_ark
    return [vcek, ask, ark]


def _chain(ev: SnpEvidence, trust: SnpTrust, at: datetime) -> tuple[list[x509.Certificate], str]:
    chain = _certificates(ev, trust)
    vcek, ask, ark = chain
    for child, issuer, what in ((ask, ark, "ASK"), (vcek, ask, "VCEK")):
        params = child.signature_algorithm_parameters
        if not (
            isinstance(issuer.public_key(), rsa.RSAPublicKey)
            and isinstance(params, padding.PSS)
            and isinstance(child.signature_hash_algorithm, hashes.SHA384)
        ):
            raise CheckFailed(f"{what} is not signed with RSA-PSS SHA-384 by {certs.common_name(issuer)}")
        certs.check_issued_by(child, issuer, at, what)
    return chain, (
        f"{certs.common_name(vcek)} <- {certs.common_name(ask)} <- {certs.common_name(ark)} (pinned), "
        f"RSA-PSS SHA-384, all valid at {at.date().isoformat()}"
    )


def _signature(report: SnpReport, vcek: x509.Certificate) -> tuple[EndorsementExtensions, str]:
    ext = endorsement_extensions(vcek)
    kind = "VCEK" if ext.hwid is not None else "VLEK"
    if kind != report.signer.name:
        raise CheckFailed(f"the report says it is signed by the {report.signer.name}, the certificate is a {kind}")
    key = certs.ec_public_key(vcek, ec.SECP384R1, kind)
    signature = encode_dss_signature(report.signature_r, report.signature_s)
    key.verify(signature, report.signed_bytes, ec.ECDSA(hashes.SHA384()))
    return ext, f"ECDSA P-384/SHA-384 over bytes [0, 0x2A0) verifies with the {kind} ({ext.product_name})"


def _tcb_binding(report: SnpReport, ext: EndorsementExtensions) -> tuple[TcbVersion, str]:
    line = ext.product_line
    if report.product_line not in (None, line):
        raise CheckFailed(f"the report's CPUID names {report.product_line.value}, the VCEK {line.value}")
    reported = decode_tcb(report.reported_tcb, line)
    if reported != ext.tcb:
        raise CheckFailed(f"REPORTED_TCB ({reported}) differs from the {ext.product_name} VCEK's TCB ({ext.tcb})")
    if not line.has_fmc and tuple(report.reported_tcb[2:6]) != ext.reserved_spls:
        raise CheckFailed("REPORTED_TCB reserved bytes 2..5 differ from the VCEK's SPL extensions 4..7")
    if ext.hwid is None:
        return reported, f"REPORTED_TCB {reported} equals the VLEK's TCB (VLEKs carry no chip ID)"
    if report.mask_chip_key:
        return reported, f"REPORTED_TCB {reported} equals the VCEK's TCB; CHIP_ID is masked, not compared"
    if report.chip_id[: len(ext.hwid)] != ext.hwid or any(report.chip_id[len(ext.hwid) :]):
        raise CheckFailed("CHIP_ID differs from the VCEK's hwID")
    return reported, f"REPORTED_TCB {reported} and CHIP_ID equal the VCEK's TCB and hwID"


def _minimum_tcb(tcb: TcbVersion, minimum: TcbVersion) -> tuple[None, str]:
    if not tcb.at_least(minimum):
        raise CheckFailed(f"REPORTED_TCB ({tcb}) is below the policy's minimum ({minimum})")
    return None, f"REPORTED_TCB ({tcb}) is at least the minimum ({minimum})"


def _guest_policy(report: SnpReport, policy: SnpPolicy) -> tuple[None, str]:
    p = report.policy
    if p.debug:
        raise CheckFailed("guest policy allows debugging (bit 19): the host can read the guest's memory")
    if p.migrate_ma and not policy.allow_migration_agent:
        raise CheckFailed("guest policy allows a migration agent (bit 18)")
    if p.smt_allowed and not policy.allow_smt:
        raise CheckFailed("guest policy allows SMT (bit 16) and the policy forbids it")
    if report.vmpl > policy.max_vmpl:
        raise CheckFailed(f"report requested from VMPL {report.vmpl}, above {policy.max_vmpl}")
    return None, (
        f"debug off, migration agent {'allowed' if p.migrate_ma else 'off'}, SMT "
        f"{'allowed' if p.smt_allowed else 'off'}, VMPL {report.vmpl} (policy 0x{p.raw:x})"
    )


def _measurement(report: SnpReport, allowed: frozenset[bytes]) -> tuple[None, str]:
    if report.measurement not in allowed:
        raise CheckFailed(f"launch measurement {report.measurement.hex()[:16]}... is not an expected one")
    return None, f"launch measurement {report.measurement.hex()} is expected"


def _report_data(report: SnpReport, expected: bytes) -> tuple[None, str]:
    if len(expected) != 64:
        raise CheckFailed(f"expected REPORT_DATA is {len(expected)} bytes, not 64")
    if report.report_data != expected:
        raise CheckFailed("REPORT_DATA differs from the expected value")
    return None, "REPORT_DATA equals the expected value"


def _claims(r: SnpReport, ext: EndorsementExtensions, reported: TcbVersion) -> SnpClaims:
    line: ProductLine = ext.product_line
    return SnpClaims(
        product=ext.product_name,
        signer=r.signer.name,
        version=r.version,
        measurement=r.measurement,
        report_data=r.report_data,
        host_data=r.host_data,
        reported_tcb=reported,
        current_tcb=decode_tcb(r.current_tcb, line),
        committed_tcb=decode_tcb(r.committed_tcb, line),
        launch_tcb=decode_tcb(r.launch_tcb, line),
        chip_id=r.chip_id,
        guest_svn=r.guest_svn,
        policy=r.policy.raw,
        debug=r.policy.debug,
        migrate_ma=r.policy.migrate_ma,
        smt_allowed=r.policy.smt_allowed,
        vmpl=r.vmpl,
        family_id=r.family_id,
        image_id=r.image_id,
        id_key_digest=r.id_key_digest,
        author_key_digest=r.author_key_digest,
        report_id=r.report_id,
        platform_info=r.platform_info,
    )
