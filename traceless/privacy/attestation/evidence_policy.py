"""The client's attestation policy: which evidence a node must show, and the check that applies it.

    policy = AttestationPolicy("production", cpu=frozenset({"snp", "tdx"}), gpu=True,
                               trust=HardwareTrust(snp=..., tdx=..., nvidia=...),
                               snp=SnpPolicy(measurements={...}, minimum_tcb=...), tdx=TdxPolicy(mr_td={...}))
    verdict = check_evidence(policy, document, evidence)     # raises PolicyRefusedError
    claims = verify_attestation(document, verdict.keys, now, ...)

A hardware policy requires one verified CPU TEE report of an accepted kind (SEV-SNP or TDX) and,
with `gpu=True`, a verified NVIDIA report for every GPU the node offers evidence for (at least one).
With `host_data` / `mr_config_id`, the CPU report's SEV-SNP HOST_DATA or TDX MRCONFIGID must be one
of the listed values: the digest of the confidential runtime's policy (runtime_policy.py).
Every report must bind the document (binding.py) and pass every check the policy names as required
(a check that did not run is a refusal, not a pass). A CPU report proves a launch measurement, and
only a known image makes the document's claims believable, so a hardware policy must list the
launch measurements it accepts. The software attester (a key in the node's memory, which the
operator can read) passes only a policy built with `AttestationPolicy.development()`; the verdict
says which kind was used, for every report and status line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from traceless.privacy.attestation.binding import gpu_nonce, report_data, signing_input
from traceless.privacy.attestation.collectors import Evidence
from traceless.privacy.attestation.evidence import EvidenceError, VerificationResult
from traceless.privacy.attestation.hardware import CPU_KINDS, HardwareAttester, document_key
from traceless.privacy.attestation.nvidia import NvidiaEvidence, NvidiaPolicy, NvidiaTrust, verify_nvidia
from traceless.privacy.attestation.snp import SnpEvidence, SnpPolicy, SnpTrust, verify_snp
from traceless.privacy.attestation.software import AttestationError, SoftwareAttester
from traceless.privacy.attestation.tdx import TdxPolicy, TdxTrust, verify_tdx
from traceless.privacy.attestation.tdx_collateral import TdxCollateral

SOFTWARE = "software"
_SNP_REQUIRED = frozenset(
    {"report-format", "cert-chain", "report-signature", "tcb-binding", "guest-policy", "measurement", "report-data"}
)
_TDX_REQUIRED = frozenset(
    {
        "quote-format",
        "pck-chain",
        "qe-report-signature",
        "qe-binding",
        "quote-signature",
        "td-attributes",
        "mr-td",
        "report-data",
    }
)
_TDX_COLLATERAL = frozenset({"collateral-signatures", "collateral-current", "revocation", "tcb-status"})
_NVIDIA_REQUIRED = frozenset({"report-format", "cert-chain", "report-signature", "nonce"})


class PolicyRefusedError(AttestationError):
    """The node's evidence does not satisfy the client's policy. `reason` is a fixed code (and, for
    a failed report, the kind and the check's name): never evidence bytes or node-chosen text."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class HardwareTrust:
    """Pinned vendor roots, one per evidence kind the policy accepts."""

    snp: SnpTrust | None = None
    tdx: TdxTrust | None = None
    nvidia: NvidiaTrust | None = None


@dataclass(frozen=True, slots=True)
class AttestationPolicy:
    name: str  # "production", "development" or the deployment's own, shown in status and reports
    cpu: frozenset[str] = frozenset()  # accepted CPU TEE kinds; non-empty: exactly one must verify
    gpu: bool = False  # NVIDIA confidential-computing evidence must verify
    allow_software: bool = False  # the in-memory software attester (development only)
    trust: HardwareTrust = field(default_factory=HardwareTrust)
    snp: SnpPolicy = field(default_factory=SnpPolicy)
    tdx: TdxPolicy = field(default_factory=TdxPolicy)
    tdx_collateral: TdxCollateral | None = None  # fetched by the client (Intel PCS), not by the node
    nvidia: NvidiaPolicy = field(default_factory=NvidiaPolicy)
    # The confidential runtime's policy (runtime_policy.py): the SEV-SNP HOST_DATA values (32 bytes)
    # and TDX MRCONFIGID values (48 bytes) a node's CPU report may hold; None: not checked
    host_data: frozenset[bytes] | None = None
    mr_config_id: frozenset[bytes] | None = None

    def __post_init__(self) -> None:
        if not self.cpu <= set(CPU_KINDS):
            raise ValueError(f"cpu kinds must be among {CPU_KINDS}")
        if not (self.cpu or self.gpu or self.allow_software):
            raise ValueError("a policy must require hardware evidence or allow the software attester explicitly")
        if "snp" in self.cpu and (self.trust.snp is None or self.snp.measurements is None):
            raise ValueError("accepting SEV-SNP needs the pinned AMD roots and the allowed launch measurements")
        if "tdx" in self.cpu and (self.trust.tdx is None or self.tdx.mr_td is None):
            raise ValueError("accepting TDX needs the pinned Intel root and the allowed MRTDs")
        if self.gpu and self.trust.nvidia is None:
            raise ValueError("requiring GPU evidence needs the pinned NVIDIA device root")
        for values, size, name in ((self.host_data, 32, "HOST_DATA"), (self.mr_config_id, 48, "MRCONFIGID")):
            if values is not None and (not values or any(len(v) != size for v in values)):
                raise ValueError(f"allowed {name} values must be a non-empty set of {size}-byte values")

    @classmethod
    def development(cls) -> AttestationPolicy:
        """Accepts the software attester: for a developer's machine and tests, never production."""
        return cls(name="development", allow_software=True)

    def required_checks(self, kind: str) -> frozenset[str]:
        """The checks that must have run and passed for a report of `kind`."""
        if kind == "snp":
            return _SNP_REQUIRED | ({"minimum-tcb"} if self.snp.minimum_tcb is not None else set())
        if kind == "tdx":
            return _TDX_REQUIRED | (_TDX_COLLATERAL if self.tdx_collateral is not None else set())
        return _NVIDIA_REQUIRED | ({"reference-measurements"} if self.nvidia.reference is not None else set())


@dataclass(frozen=True, slots=True)
class AttestationVerdict:
    kind: str  # "software", or the verified kinds joined by "+", e.g. "snp+nvidia"
    results: tuple[VerificationResult, ...]  # one per verified report, in the order offered
    keys: tuple[Ed25519PublicKey, ...]  # the key(s) to authenticate the document with

    @property
    def attester_type(self) -> str:
        """The `attester_type` claim a document with this verdict must carry."""
        return SoftwareAttester.attester_type if self.kind == SOFTWARE else HardwareAttester.attester_type


def check_evidence(
    policy: AttestationPolicy,
    document: str,
    evidence: Sequence[Evidence],
    pinned_software_keys: Sequence[Ed25519PublicKey] = (),
    at: datetime | None = None,
) -> AttestationVerdict:
    """Apply `policy` to a node's document and evidence; raise `PolicyRefusedError` to refuse it."""
    if not evidence:
        if not policy.allow_software:
            raise PolicyRefusedError("software_attester_refused")
        return AttestationVerdict(SOFTWARE, (), tuple(pinned_software_keys))
    try:
        bound = signing_input(document)
        key = document_key(document)
    except (ValueError, AttestationError):
        raise PolicyRefusedError("malformed") from None
    cpu = [e for e in evidence if e.kind in CPU_KINDS]
    gpus = [e for e in evidence if e.kind == "nvidia"]
    if len(cpu) > 1:
        raise PolicyRefusedError("more_than_one_cpu_report")
    if policy.cpu and not cpu:
        raise PolicyRefusedError("cpu_evidence_missing")
    if policy.gpu and not gpus:
        raise PolicyRefusedError("gpu_evidence_missing")
    if cpu and cpu[0].kind not in policy.cpu:
        raise PolicyRefusedError("cpu_kind_not_accepted")
    if gpus and not policy.gpu:
        raise PolicyRefusedError("gpu_evidence_not_required")  # offered but unchecked: refuse, never ignore
    results = tuple(_verify_one(policy, item, bound, at) for item in (*cpu, *gpus))
    kinds = "+".join(dict.fromkeys(r.kind for r in results))
    return AttestationVerdict(kinds, results, (key,))


def _verify_one(policy: AttestationPolicy, item: Evidence, bound: bytes, at: datetime | None) -> VerificationResult:
    try:
        result = _run_verifier(policy, item, bound, at)
    except EvidenceError:
        raise PolicyRefusedError(f"{item.kind}:malformed") from None
    failure = result.first_failure
    if failure is not None:
        raise PolicyRefusedError(f"{item.kind}:{failure.name}")
    missing = sorted(c for c in policy.required_checks(item.kind) if not result.passed(c))
    if missing:
        raise PolicyRefusedError(f"{item.kind}:{missing[0]}:not_run")
    _check_runtime_policy(policy, result)
    return result


def _check_runtime_policy(policy: AttestationPolicy, result: VerificationResult) -> None:
    """The report's host-set launch field must name a runtime policy the client allows: read from
    the verified claims (the field is covered by the report's signature)."""
    for kind, allowed, field_name, reason in (
        ("snp", policy.host_data, "host_data", "snp:host-data"),
        ("tdx", policy.mr_config_id, "mr_config_id", "tdx:mr-config-id"),
    ):
        if result.kind != kind or allowed is None:
            continue
        if result.claims is None or getattr(result.claims, field_name) not in allowed:
            raise PolicyRefusedError(reason)


def _run_verifier(policy: AttestationPolicy, item: Evidence, bound: bytes, at: datetime | None) -> VerificationResult:
    trust = policy.trust
    if item.kind == "snp" and trust.snp is not None:
        snp = SnpEvidence.from_extended(item.blob, item.aux)
        return verify_snp(snp, trust.snp, policy.snp, report_data=report_data(bound), at=at)
    if item.kind == "tdx" and trust.tdx is not None:
        return verify_tdx(
            item.blob, trust.tdx, policy.tdx, report_data=report_data(bound), collateral=policy.tdx_collateral, at=at
        )
    if item.kind == "nvidia" and trust.nvidia is not None:
        gpu = NvidiaEvidence(report=item.blob, cert_chain=item.aux)
        return verify_nvidia(gpu, trust.nvidia, policy.nvidia, nonce=gpu_nonce(bound), at=at)
    raise PolicyRefusedError(f"{item.kind}:no_trust_anchor")
