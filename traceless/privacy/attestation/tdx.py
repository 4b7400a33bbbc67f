"""Intel TDX quote verification (quote versions 4 and 5).

Trust chain:  pinned Intel SGX Root CA (ECDSA P-256)
                -> Intel SGX PCK Platform/Processor CA
                  -> PCK certificate (one per platform and TCB)  signs the QE report
                    -> QE report REPORTDATA = SHA-256(attestation key || QE auth data)
                      -> attestation key                          signs header + TD report
              collateral: TCB signing certificate (under the root) signs TCB info and QE
              identity; the root and the PCK CA sign their CRLs.

Without collateral the verifier proves the quote was produced by a quoting enclave on a platform
holding an Intel-certified PCK key (the first five checks); whether that platform's TCB is current,
and whether the quoting enclave is Intel's current one, needs collateral (the next four). The
result names every check that did not run.

    result = verify_tdx(quote, TdxTrust(roots=(intel_root,)), TdxPolicy(mr_td=...),
                        report_data=expected, collateral=TdxCollateral.from_dir(d), at=now)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from traceless.privacy.attestation import certs
from traceless.privacy.attestation.evidence import CheckFailed, CheckRun, VerificationResult
from traceless.privacy.attestation.tdx_collateral import (
    CheckedCollateral,
    TdxCollateral,
    check_current,
    check_revocation,
    check_signatures,
    tcb_status,
)
from traceless.privacy.attestation.tdx_quote import TdReport, TdxQuote, parse_tdx_quote

CHECKS = (
    "quote-format",
    "pck-chain",
    "qe-report-signature",
    "qe-binding",
    "quote-signature",
    "collateral-signatures",
    "collateral-current",
    "revocation",
    "tcb-status",
    "td-attributes",
    "mr-td",
    "rtmrs",
    "report-data",
)
STATEMENT = (
    "a TDX quoting enclave on a platform holding an Intel-certified PCK key signed this TD report "
    "(MRTD, RTMRs, attributes, REPORTDATA); with collateral, the platform's TCB level is as stated"
)
_NO_COLLATERAL = "not run: no collateral given (TCB info, QE identity, CRLs)"


@dataclass(frozen=True, slots=True)
class TdxTrust:
    roots: tuple[bytes, ...]  # pinned Intel SGX Root CA certificate(s), DER or PEM


@dataclass(frozen=True, slots=True)
class TdxPolicy:
    mr_td: frozenset[bytes] | None = None  # allowed MRTDs (48 bytes each)
    rtmrs: tuple[bytes | None, bytes | None, bytes | None, bytes | None] | None = None  # None: any value
    accepted_tcb_statuses: frozenset[str] = frozenset({"UpToDate"})


@dataclass(frozen=True, slots=True)
class TdxClaims:
    version: int
    mr_td: bytes
    rtmrs: tuple[bytes, bytes, bytes, bytes]
    report_data: bytes
    td_attributes: bytes
    xfam: bytes
    mr_config_id: bytes
    mr_owner: bytes
    mr_owner_config: bytes
    mr_seam: bytes
    mr_signer_seam: bytes
    tee_tcb_svn: bytes
    tee_tcb_svn2: bytes | None
    mr_service_td: bytes | None
    tcb_status: str | None  # None when no collateral was given
    advisory_ids: tuple[str, ...]


def verify_tdx(
    quote: bytes,
    trust: TdxTrust,
    policy: TdxPolicy = TdxPolicy(),
    *,
    report_data: bytes | None = None,
    collateral: TdxCollateral | None = None,
    at: datetime | None = None,
) -> VerificationResult:
    """Verify a TDX quote; never raises on bad evidence (a failed check says why)."""
    when = at or datetime.now(UTC)
    run = CheckRun("tdx", CHECKS, STATEMENT)
    return run.complete(lambda: _verify(run, quote, trust, policy, (report_data, collateral), when))


def _verify(
    run: CheckRun,
    data: bytes,
    trust: TdxTrust,
    policy: TdxPolicy,
    given: tuple[bytes | None, TdxCollateral | None],
    at: datetime,
) -> TdxClaims:
    report_data, collateral = given
    quote = run.run("quote-format", lambda: _format(data))
    chain, root, roots = run.run("pck-chain", lambda: _pck_chain(quote, trust, at))
    run.run("qe-report-signature", lambda: _qe_signature(quote, chain[0]))
    run.run("qe-binding", lambda: _qe_binding(quote))
    run.run("quote-signature", lambda: _quote_signature(quote))
    status: tuple[str | None, tuple[str, ...]] = (None, ())
    if collateral is None:
        for name in ("collateral-signatures", "collateral-current", "revocation", "tcb-status"):
            run.skip(name, _NO_COLLATERAL)
    else:
        checked = run.run("collateral-signatures", lambda: check_signatures(collateral, roots, chain[1], at))
        run.run("collateral-current", lambda: check_current(checked, at))
        run.run("revocation", lambda: check_revocation(checked, chain))
        status = run.run("tcb-status", lambda: _tcb_status(data, quote, checked, collateral, (root, at), policy))
    td = quote.td_report
    run.run("td-attributes", lambda: _attributes(td))
    _expectations(run, td, policy, report_data)
    return TdxClaims(
        version=quote.version,
        mr_td=td.mr_td,
        rtmrs=td.rtmrs,
        report_data=td.report_data,
        td_attributes=td.td_attributes,
        xfam=td.xfam,
        mr_config_id=td.mr_config_id,
        mr_owner=td.mr_owner,
        mr_owner_config=td.mr_owner_config,
        mr_seam=td.mr_seam,
        mr_signer_seam=td.mr_signer_seam,
        tee_tcb_svn=td.tee_tcb_svn,
        tee_tcb_svn2=td.tee_tcb_svn2,
        mr_service_td=td.mr_service_td,
        tcb_status=status[0],
        advisory_ids=status[1],
    )


def _format(data: bytes) -> tuple[TdxQuote, str]:
    quote = parse_tdx_quote(data)
    body = "TD report 1.5" if quote.td_report.mr_service_td is not None else "TD report 1.0"
    return quote, f"TDX quote v{quote.version}, {body}, {len(data)} bytes, ECDSA P-256 attestation key"


def _pck_chain(
    quote: TdxQuote, trust: TdxTrust, at: datetime
) -> tuple[tuple[list[x509.Certificate], x509.Certificate, list[x509.Certificate]], str]:
    roots = [certs.load_certificate(r, "pinned Intel root") for r in trust.roots]
    chain = list(certs.load_pem_chain(quote.pck_chain_pem, "PCK certificate chain"))
    root = certs.check_chain(chain, roots, at, ["PCK certificate", "PCK CA"])
    if len(chain) < 2 or chain[1].subject == chain[1].issuer:
        raise CheckFailed("the PCK chain has no PCK CA between the PCK certificate and the root")
    names = " <- ".join(certs.common_name(c) for c in chain[:2])
    return (chain, root, roots), f"{names} <- {certs.common_name(root)} (pinned), valid at {at.date().isoformat()}"


def _qe_signature(quote: TdxQuote, pck: x509.Certificate) -> tuple[None, str]:
    key = certs.ec_public_key(pck, ec.SECP256R1, "PCK")
    key.verify(certs.ecdsa_signature(quote.qe_report_signature, "big"), quote.qe_report.raw, ec.ECDSA(hashes.SHA256()))
    return None, "the PCK key signed the QE report (ECDSA P-256/SHA-256)"


def _qe_binding(quote: TdxQuote) -> tuple[None, str]:
    expected = hashlib.sha256(quote.attestation_key + quote.qe_auth_data).digest() + bytes(32)
    if quote.qe_report.report_data != expected:
        raise CheckFailed("QE report REPORTDATA is not SHA-256(attestation key || QE auth data) || zeros")
    return None, "the QE report binds the attestation key: REPORTDATA = SHA-256(key || QE auth data)"


def _quote_signature(quote: TdxQuote) -> tuple[None, str]:
    try:
        key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), b"\x04" + quote.attestation_key)
    except ValueError:
        raise CheckFailed("attestation key is not a P-256 point") from None
    key.verify(certs.ecdsa_signature(quote.signature, "big"), quote.signed_bytes, ec.ECDSA(hashes.SHA256()))
    return None, f"the attestation key signed the quote header and TD report ({len(quote.signed_bytes)} bytes)"


def _tcb_status(
    data: bytes,
    quote: TdxQuote,
    checked: CheckedCollateral,
    raw: TdxCollateral,
    root_at: tuple[x509.Certificate, datetime],
    policy: TdxPolicy,
) -> tuple[tuple[str, tuple[str, ...]], str]:
    root, at = root_at
    chain = certs.load_pem_chain(quote.pck_chain_pem, "PCK certificate chain")
    issuer_chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (chain[1], root))
    try:
        status, advisories = tcb_status(
            data, checked, raw, issuer_chain, root.public_bytes(serialization.Encoding.DER), at
        )
    except ValueError as e:
        raise CheckFailed(f"dcap-qvl: {str(e).splitlines()[0]}") from None
    listed = f", advisories {', '.join(advisories)}" if advisories else ""
    if status not in policy.accepted_tcb_statuses:
        raise CheckFailed(
            f"TCB status {status} is not accepted ({', '.join(sorted(policy.accepted_tcb_statuses))})" + listed
        )
    return (status, advisories), f"dcap-qvl: TCB status {status}{listed}"


def _attributes(td: TdReport) -> tuple[None, str]:
    if td.debug:
        raise CheckFailed("TD attributes have DEBUG (bit 0) set: the host can read the TD's memory")
    return None, f"TD attributes 0x{td.td_attributes.hex()} (little-endian): DEBUG off"


def _expectations(run: CheckRun, td: TdReport, policy: TdxPolicy, report_data: bytes | None) -> None:
    mr_td = policy.mr_td
    if mr_td is None:
        run.skip("mr-td", "not run: no expected MRTD given")
    else:
        run.run("mr-td", lambda: _expect(td.mr_td in mr_td, f"MRTD {td.mr_td.hex()}"))
    if policy.rtmrs is None or all(r is None for r in policy.rtmrs):
        run.skip("rtmrs", "not run: no expected RTMR given")
    else:
        wanted = [i for i, r in enumerate(policy.rtmrs) if r is not None]
        same = all(td.rtmrs[i] == policy.rtmrs[i] for i in wanted)
        run.run("rtmrs", lambda: _expect(same, "RTMR" + ",".join(str(i) for i in wanted)))
    if report_data is None:
        run.skip("report-data", "not run: no expected REPORTDATA given")
    else:
        run.run("report-data", lambda: _expect(td.report_data == report_data, "REPORTDATA"))


def _expect(equal: bool, what: str) -> tuple[None, str]:
    if not equal:
        raise CheckFailed(f"{what.split(' ')[0]} differs from the expected value")
    return None, f"{what} equals the expected value"
