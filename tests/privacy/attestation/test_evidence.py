"""The common result: ordered checks, stop at the first failure, claims only when nothing failed;
and its text and JSON renderings."""

import json

import pytest
from cryptography.exceptions import InvalidSignature

from traceless.privacy.attestation.detect import detect_kind, evidence_bytes
from traceless.privacy.attestation.evidence import (
    CheckFailed,
    CheckRun,
    CheckStatus,
    MalformedEvidenceError,
    VerificationResult,
)
from traceless.privacy.attestation.report import result_json, result_lines

NAMES = ("a", "b", "c", "d")


def _run(body) -> VerificationResult:
    run = CheckRun("snp", NAMES, "it proves things")
    return run.complete(lambda: body(run))


def test_a_passing_run_returns_claims_and_lists_skipped_checks():
    def body(run):
        assert run.run("a", lambda: (41, "a ok")) == 41
        run.skip("b", "not run: nothing to compare")
        run.run("c", lambda: (None, "c ok"))
        return {"x": 1}

    result = _run(body)
    assert result.ok and result.claims == {"x": 1} and result.first_failure is None
    assert [c.status for c in result.checks] == [
        CheckStatus.PASSED,
        CheckStatus.NOT_RUN,
        CheckStatus.PASSED,
        CheckStatus.NOT_RUN,
    ]
    assert result.passed("a") and not result.passed("b") and [c.name for c in result.not_run] == ["b", "d"]


@pytest.mark.parametrize(
    "error, detail",
    [
        (CheckFailed("the field differs"), "the field differs"),
        (MalformedEvidenceError("report is 3 bytes"), "report is 3 bytes"),
        (InvalidSignature(), "signature does not verify"),
        (ValueError("invalid literal for int(): 'sender-chosen'"), "malformed input (ValueError)"),
    ],
)
def test_the_first_failure_stops_the_run_and_withholds_claims(error, detail):
    ran = []

    def fail():
        raise error

    def body(run):
        run.run("a", lambda: (None, "ok"))
        run.run("b", fail)
        ran.append("c")
        return "claims"

    result = _run(body)
    assert not result.ok and result.claims is None and ran == []
    assert result.first_failure.name == "b" and result.first_failure.detail == detail
    assert result.check("c").detail == "not run: an earlier check failed"


def test_bugs_are_not_reported_as_failed_checks():
    def body(run):
        run.run("a", lambda: {}["missing"])

    with pytest.raises(KeyError):
        _run(body)
    with pytest.raises(RuntimeError, match="not a pending check"):
        _run(lambda run: run.run("z", lambda: (None, "")))


def test_nothing_checked_is_not_ok():
    result = _run(lambda run: None)
    assert not result.ok and result.first_failure is None


def test_text_and_json_reports():
    def body(run):
        run.run("a", lambda: (None, "signature verifies"))
        run.skip("b", "not run: no expected value")
        run.run("c", lambda: (None, "ok"))
        run.run("d", lambda: (None, "ok"))
        return {"measurement": b"\x01\x02", "tcb": {"bl": 3}, "blocks": {1: b"\xff"}}

    result = _run(body)
    lines = result_lines(result)
    assert lines[0] == "AMD SEV-SNP evidence: VERIFIED" and "  [pass] a: signature verifies" in lines
    assert "  [ -- ] b: not run: no expected value" in lines and "proves: it proves things" in lines
    assert "  measurement: 0102" in lines and "  blocks[1]: ff" in lines and "  tcb: bl=3" in lines
    report = json.loads(json.dumps(result_json(result)))
    assert report["ok"] and report["not_run"] == ["b"] and report["claims"]["measurement"] == "0102"
    failed = _run(lambda run: run.run("a", lambda: (_ for _ in ()).throw(CheckFailed("nope"))))
    assert result_lines(failed)[0] == "AMD SEV-SNP evidence: FAILED at a"
    assert result_json(failed)["first_failure"] == {"check": "a", "detail": "nope"}


def test_kind_detection_and_hex_text():
    assert evidence_bytes(b"0a0b\n0c ") == b"\x0a\x0b\x0c" and evidence_bytes(b"\x0a\x0b") == b"\x0a\x0b"
    assert evidence_bytes(b"abc") == b"abc"  # odd number of digits: not hex text
    assert detect_kind(b"\x02\x00\x00\x00" + bytes(0x4A0 - 4)) == "snp"
    assert detect_kind(b"\x04\x00\x02\x00\x81\x00\x00\x00" + bytes(40)) == "tdx"
    assert detect_kind(b"\x11\xe0\x01\xff") == "nvidia"
    assert detect_kind(b"\x07\x00\x00\x00" + bytes(0x4A0 - 4)) is None and detect_kind(b"") is None
