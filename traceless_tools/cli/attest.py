"""`traceless attest verify FILE`: verify one piece of hardware evidence and print what was checked.

Exit status: 0 when every check that ran passed, 1 when a check failed, 2 for a usage error (bad
option, unreadable file, kind not recognized). Nothing is printed but the report, so scripts can
read stdout (`--json`) and the status. Imports stay light here; the handler imports the verifiers.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

USAGE_ERROR, CHECK_FAILED = 2, 1


class UsageError(Exception):
    """Options or input files the command cannot use (exit status 2)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    attest = subparsers.add_parser("attest", help="hardware attestation evidence (SEV-SNP, TDX, NVIDIA GPU)")
    actions = attest.add_subparsers(dest="attest_command", metavar="ACTION", required=True)
    v = actions.add_parser(
        "verify",
        help="verify a report or quote and print what was checked",
        description="Verify hardware evidence offline. Exit 0: all checks that ran passed; "
        "1: a check failed; 2: usage error.",
    )
    v.add_argument("file", type=Path, metavar="FILE", help="the report or quote (binary or hex text)")
    v.add_argument("--kind", choices=("snp", "tdx", "nvidia"), help="evidence kind (default: from the bytes)")
    v.add_argument("--json", action="store_true", help="print the result as JSON")
    v.add_argument(
        "--root",
        type=Path,
        action="append",
        default=[],
        metavar="CERT",
        help="pinned root certificate, PEM or DER (repeatable): AMD ARK, Intel SGX Root CA, NVIDIA "
        "device identity root",
    )
    v.add_argument("--vcek", type=Path, metavar="CERT", help="SEV-SNP: the VCEK or VLEK certificate")
    v.add_argument("--ask", type=Path, metavar="CERT", help="SEV-SNP: the ASK (or ASVK) certificate")
    v.add_argument("--ark", type=Path, metavar="CERT", help="SEV-SNP: the presented ARK (must equal a --root)")
    v.add_argument(
        "--cert-table",
        type=Path,
        metavar="FILE",
        help="SEV-SNP: extended report certificate table (configfs-tsm auxblob)",
    )
    v.add_argument(
        "--cert-chain",
        type=Path,
        metavar="PEM",
        help="SEV-SNP: ASK then ARK (AMD KDS cert_chain); NVIDIA: the GPU certificate chain",
    )
    v.add_argument(
        "--collateral",
        type=Path,
        metavar="DIR",
        help="TDX: PCS collateral directory "
        "(tcb_info.json, qe_identity.json, tcb_signing_chain.pem, pck_crl.der, root_crl.der)",
    )
    v.add_argument("--expect-measurement", metavar="HEX", help="SEV-SNP MEASUREMENT or TDX MRTD")
    v.add_argument("--expect-report-data", metavar="HEX", help="SEV-SNP REPORT_DATA or TDX REPORTDATA (64 bytes)")
    v.add_argument("--nonce", metavar="HEX", help="NVIDIA: the expected 32-byte SPDM nonce")
    v.add_argument("--min-tcb", metavar="SPEC", help="SEV-SNP minimum TCB, e.g. bl=3,tee=0,snp=8,ucode=115[,fmc=1]")
    v.add_argument("--at", metavar="TIME", help="verification time, ISO 8601 (default: now)")
    v.set_defaults(handler=_verify)


def _verify(args: argparse.Namespace) -> int:
    import json

    from traceless.privacy.attestation.report import result_json, result_lines

    try:
        result = _run(args)
    except UsageError as e:
        print(f"traceless attest verify: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    if args.json:
        print(json.dumps(result_json(result), indent=2))
    else:
        print("\n".join(result_lines(result)))
    return 0 if result.ok else CHECK_FAILED


def _run(args: argparse.Namespace):
    from traceless.privacy.attestation.detect import detect_kind, evidence_bytes

    data = evidence_bytes(_read(args.file))
    kind = args.kind or detect_kind(data)
    if kind is None:
        raise UsageError(f"cannot tell what kind of evidence {args.file} is; pass --kind")
    if not args.root:
        raise UsageError("--root is required: the pinned vendor root certificate(s)")
    roots = tuple(_read(p) for p in args.root)
    at = _time(args.at)
    if kind == "snp":
        return _snp(args, data, roots, at)
    if kind == "tdx":
        return _tdx(args, data, roots, at)
    return _nvidia(args, data, roots, at)


def _snp(args: argparse.Namespace, data: bytes, roots: tuple[bytes, ...], at: datetime):
    from cryptography.hazmat.primitives.serialization import Encoding

    from traceless.privacy.attestation.certs import load_pem_chain
    from traceless.privacy.attestation.evidence import EvidenceError
    from traceless.privacy.attestation.snp import SnpEvidence, SnpPolicy, SnpTrust, verify_snp

    ask, ark = (_read(args.ask) if args.ask else None), (_read(args.ark) if args.ark else None)
    if args.cert_chain:
        try:
            chain = load_pem_chain(_read(args.cert_chain), "--cert-chain")
        except EvidenceError as e:
            raise UsageError(str(e)) from None
        ask = ask or chain[0].public_bytes(Encoding.DER)
        ark = ark or (chain[1].public_bytes(Encoding.DER) if len(chain) > 1 else None)
    if args.cert_table:
        try:
            evidence = SnpEvidence.from_extended(data, _read(args.cert_table))
        except EvidenceError as e:
            raise UsageError(f"--cert-table: {e}") from None
    elif args.vcek:
        evidence = SnpEvidence(report=data, vcek=_read(args.vcek), ask=ask, ark=ark)
    else:
        raise UsageError("SEV-SNP needs --vcek (or --cert-table)")
    measurement = _hex(args.expect_measurement, "--expect-measurement", 48)
    policy = SnpPolicy(
        minimum_tcb=_tcb(args.min_tcb), measurements=None if measurement is None else frozenset({measurement})
    )
    return verify_snp(
        evidence,
        SnpTrust(arks=roots),
        policy,
        report_data=_hex(args.expect_report_data, "--expect-report-data", 64),
        at=at,
    )


def _tdx(args: argparse.Namespace, data: bytes, roots: tuple[bytes, ...], at: datetime):
    from traceless.privacy.attestation.evidence import EvidenceError
    from traceless.privacy.attestation.tdx import TdxCollateral, TdxPolicy, TdxTrust, verify_tdx

    collateral = None
    if args.collateral:
        try:
            collateral = TdxCollateral.from_dir(args.collateral)
        except (EvidenceError, OSError) as e:
            raise UsageError(f"--collateral: {e}") from None
    mr_td = _hex(args.expect_measurement, "--expect-measurement", 48)
    policy = TdxPolicy(mr_td=None if mr_td is None else frozenset({mr_td}))
    return verify_tdx(
        data,
        TdxTrust(roots=roots),
        policy,
        collateral=collateral,
        at=at,
        report_data=_hex(args.expect_report_data, "--expect-report-data", 64),
    )


def _nvidia(args: argparse.Namespace, data: bytes, roots: tuple[bytes, ...], at: datetime):
    from traceless.privacy.attestation.nvidia import NvidiaEvidence, NvidiaTrust, verify_nvidia

    if not args.cert_chain:
        raise UsageError("an NVIDIA report needs --cert-chain (the GPU's PEM certificate chain)")
    evidence = NvidiaEvidence(report=data, cert_chain=_read(args.cert_chain))
    return verify_nvidia(evidence, NvidiaTrust(roots=roots), nonce=_hex(args.nonce, "--nonce", 32), at=at)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None


def _hex(text: str | None, option: str, size: int) -> bytes | None:
    if text is None:
        return None
    try:
        value = bytes.fromhex(text)
    except ValueError:
        raise UsageError(f"{option} is not hex") from None
    if len(value) != size:
        raise UsageError(f"{option} is {len(value)} bytes, expected {size}")
    return value


def _time(text: str | None) -> datetime:
    if text is None:
        return datetime.now(UTC)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--at {text!r} is not an ISO 8601 time") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _tcb(spec: str | None):
    if spec is None:
        return None
    from traceless.privacy.attestation.snp_report import TcbVersion

    names = {"bl": "bootloader", "tee": "tee", "snp": "snp", "ucode": "microcode", "fmc": "fmc"}
    try:
        parts = dict(item.split("=", 1) for item in spec.split(","))
        values = {names[k.strip()]: int(v, 0) for k, v in parts.items()}
        return TcbVersion(**values)
    except (KeyError, ValueError, TypeError):
        raise UsageError("--min-tcb is not bl=N,tee=N,snp=N,ucode=N[,fmc=N]") from None
