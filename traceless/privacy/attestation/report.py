"""A `VerificationResult` as readable lines and as JSON: what was checked, what it proves, the first
failure. Bytes are written as lowercase hex, TCB versions as their components, maps as objects."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import Enum
from typing import Any

from traceless.privacy.attestation.evidence import CheckStatus, VerificationResult

KIND_NAMES = {"snp": "AMD SEV-SNP", "tdx": "Intel TDX", "nvidia": "NVIDIA GPU"}
_MARK = {CheckStatus.PASSED: "pass", CheckStatus.FAILED: "FAIL", CheckStatus.NOT_RUN: " -- "}


def to_jsonable(value: Any) -> Any:
    """Claims (frozen dataclasses of bytes, ints, strings, maps, tuples) as JSON-ready values."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (tuple, list, frozenset, set)):
        items = [to_jsonable(v) for v in value]
        return sorted(items) if isinstance(value, (frozenset, set)) else items
    return value


def result_json(result: VerificationResult) -> dict[str, Any]:
    failure = result.first_failure
    return {
        "kind": result.kind,
        "ok": result.ok,
        "proves": result.statement if result.ok else None,
        "first_failure": None if failure is None else {"check": failure.name, "detail": failure.detail},
        "checks": [{"name": c.name, "status": c.status.value, "detail": c.detail} for c in result.checks],
        "not_run": [c.name for c in result.not_run],
        "claims": to_jsonable(result.claims),
    }


def result_lines(result: VerificationResult) -> list[str]:
    failure = result.first_failure
    verdict = "VERIFIED" if result.ok else f"FAILED at {failure.name}" if failure is not None else "NOTHING CHECKED"
    lines = [f"{KIND_NAMES.get(result.kind, result.kind)} evidence: {verdict}"]
    lines += [f"  [{_MARK[c.status]}] {c.name}: {c.detail}" for c in result.checks]
    if result.ok:
        lines.append(f"proves: {result.statement}")
        if result.not_run:
            lines.append(f"not checked: {', '.join(c.name for c in result.not_run)}")
    if result.claims is not None:
        lines.append("claims:")
        lines += [f"  {line}" for line in _claim_lines(to_jsonable(result.claims))]
    return lines


def _claim_lines(claims: dict[str, Any]) -> list[str]:
    lines = []
    for name, value in claims.items():
        if isinstance(value, dict) and value and all(not isinstance(v, (dict, list)) for v in value.values()):
            if all(k.isdigit() for k in value):  # a table such as GPU measurement blocks
                lines += [f"{name}[{k}]: {v}" for k, v in value.items()]
                continue
            value = " ".join(f"{k}={v}" for k, v in value.items() if v is not None)
        elif isinstance(value, list):
            value = ", ".join(str(v) for v in value) or "(none)"
        lines.append(f"{name}: {value}")
    return lines
