"""The one result every hardware verifier returns, and the errors its parsers raise.

A verifier runs a fixed, ordered list of named checks (its `CHECKS`). Each check passes, fails or
is not run; the first failure stops the run and every later check is reported as not run, so a
result always names every check the verifier knows and says precisely which ran. Claims are
returned only when nothing failed: a caller can never read an unverified measurement off a
failed result.

    result = verify_snp(evidence, trust, policy, report_data=expected)
    if not result.ok: refuse(result.first_failure)          # Check(name, FAILED, why)
    if not result.passed("report-data"): refuse(...)        # policy: this check must have run
    use(result.claims)                                      # SnpClaims

Parsers raise `EvidenceError` subclasses for bytes that do not parse; verifiers catch them (and
the `ValueError`s `cryptography` raises for malformed keys and certificates) and report a failed
check, so a verifier never raises on hostile input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm

from traceless.privacy.attestation.software import AttestationError

T = TypeVar("T")


class EvidenceError(AttestationError):
    """Hardware evidence (a report, quote, certificate or collateral) a verifier cannot use."""


class MalformedEvidenceError(EvidenceError):
    """Bytes that do not parse: wrong length, a field out of range, trailing data."""


class UnsupportedEvidenceError(EvidenceError):
    """Well-formed evidence of a version, algorithm or kind this verifier does not implement."""


class CheckFailed(Exception):
    """Raised inside a check to fail it with a reason (the reason names fields, never secrets)."""


class CheckStatus(Enum):
    PASSED = "passed"
    FAILED = "failed"
    NOT_RUN = "not run"


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: CheckStatus
    detail: str  # what a pass proves, why it failed, or why it did not run

    @property
    def ok(self) -> bool:
        return self.status is CheckStatus.PASSED


@dataclass(frozen=True, slots=True)
class VerificationResult:
    kind: str  # "snp" | "tdx" | "nvidia"
    checks: tuple[Check, ...]
    claims: Any | None  # the kind's frozen claims dataclass, only when no check failed
    statement: str  # what a fully passing result proves, in one sentence

    @property
    def ok(self) -> bool:
        """True when at least one check ran and none failed (checks not run are listed, not failed)."""
        return self.first_failure is None and any(c.ok for c in self.checks)

    @property
    def first_failure(self) -> Check | None:
        return next((c for c in self.checks if c.status is CheckStatus.FAILED), None)

    @property
    def not_run(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status is CheckStatus.NOT_RUN)

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def passed(self, name: str) -> bool:
        """Whether the named check ran and passed: what a policy that requires the check asks."""
        return self.check(name).ok


class _Stop(Exception):
    """Ends a verifier's run at its first failed check."""


# What a check can raise on malformed or forged input; anything else is a bug and propagates.
_FAILURES = (CheckFailed, EvidenceError, InvalidSignature, UnsupportedAlgorithm, ValueError)


class CheckRun:
    """Runs one verifier's checks in their declared order and builds its `VerificationResult`."""

    def __init__(self, kind: str, names: Sequence[str], statement: str) -> None:
        self._kind = kind
        self._names = tuple(names)
        self._statement = statement
        self._done: dict[str, Check] = {}

    def run(self, name: str, check: Callable[[], tuple[T, str]]) -> T:
        """Run `check`, which returns (value, what the pass proves); stop the run on a failure."""
        self._expect(name)
        try:
            value, detail = check()
        except _FAILURES as e:
            self._done[name] = Check(name, CheckStatus.FAILED, _reason(e))
            raise _Stop from None
        self._done[name] = Check(name, CheckStatus.PASSED, detail)
        return value

    def skip(self, name: str, why: str) -> None:
        self._expect(name)
        self._done[name] = Check(name, CheckStatus.NOT_RUN, why)

    def complete(self, body: Callable[[], object]) -> VerificationResult:
        """Run a verifier's `body` (which calls `run`/`skip` and returns the claims) to its result."""
        try:
            claims = body()
        except _Stop:
            return self.result(None)
        return self.result(claims)

    def result(self, claims: object | None) -> VerificationResult:
        failed = any(c.status is CheckStatus.FAILED for c in self._done.values())
        checks = tuple(
            self._done.get(n)
            or Check(n, CheckStatus.NOT_RUN, "not run: an earlier check failed" if failed else "not run")
            for n in self._names
        )
        return VerificationResult(self._kind, checks, None if failed else claims, self._statement)

    def _expect(self, name: str) -> None:
        if name not in self._names or name in self._done:
            raise RuntimeError(f"check {name!r} is not a pending check of this verifier")


def _reason(e: BaseException) -> str:
    if isinstance(e, (CheckFailed, EvidenceError)):
        return str(e)
    if isinstance(e, InvalidSignature):
        return "signature does not verify"
    # Only the exception's type: its text comes from a parser fed with the sender's bytes and may
    # quote them, and this detail reaches the sender's error message (threat T29, docs/threat-model.md).
    return f"malformed input ({type(e).__name__})"
