"""NVIDIA H100: NVIDIA's sample attestation report verifies under its certificate chain and the
pinned device root, with the nonce and measurements read from it; tampering, a wrong nonce or
reference values fail at the check that names them; fuzzed reports never crash or verify.

Literal values were read once from vectors/attestation/nvidia-h100/ and cross-checked against the
hex text itself (block 2 is the bytes after "02 01 3300 01 3000" in the file).
"""

import re
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.vectors import vector_path
from traceless.privacy.attestation.nvidia import CHECKS, NvidiaEvidence, NvidiaPolicy, NvidiaTrust, verify_nvidia
from traceless.privacy.attestation.nvidia_spdm import parse_spdm_report

AT = datetime(2025, 1, 1, tzinfo=UTC)
NONCE = bytes.fromhex("931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb")
BLOCK_2 = "8048dfd18fe229bf16eb9d30cca0f11a24dafe6eb731de1462984645a0b189b77c4e4e17de727a5e19e3d07de51da338"
FWID = "f5c384aebb579217a2c66b17ed0f28e6a9b8d639041acd7b4721cec004f7275494ba94bb5cdfdb3055ee051762b1f75d"


def _file(name: str) -> bytes:
    return vector_path(f"attestation/nvidia-h100/{name}").read_bytes()


@pytest.fixture(scope="module")
def report() -> bytes:
    return bytes.fromhex(_file("hopperAttestationReport.txt").decode())


@pytest.fixture(scope="module")
def evidence(report) -> NvidiaEvidence:
    return NvidiaEvidence(report=report, cert_chain=_file("hopperCertChain.txt"))


@pytest.fixture(scope="module")
def trust() -> NvidiaTrust:
    return NvidiaTrust(roots=(_file("verifier_device_root.pem"),))


def _failure(result) -> str:
    assert not result.ok and result.claims is None
    return result.first_failure.name


def test_sample_report_parses_to_the_values_in_its_hex_text(report):
    parsed = parse_spdm_report(report)
    assert parsed.spdm_version == 0x11 and parsed.nonce == NONCE and len(parsed.measurements) == 64
    assert parsed.measurements[2].hex() == BLOCK_2 and parsed.measurements[1] == bytes(48)
    assert parsed.fwid.hex() == FWID and parsed.driver_version == "550.90.07"
    assert parsed.vbios_version == "96.00.9F.00.01" and len(parsed.signature) == 96
    text = _file("hopperAttestationReport.txt").decode()
    assert text.startswith("11e001ff" + NONCE.hex()) and "02013300013000" + BLOCK_2 in text


def test_sample_report_verifies_with_its_nonce_and_reference_values(evidence, trust, report):
    reference = {i: frozenset({v}) for i, v in parse_spdm_report(report).measurements.items()}
    result = verify_nvidia(evidence, trust, NvidiaPolicy(reference=reference), nonce=NONCE, at=AT)
    assert result.ok and [c.name for c in result.checks] == list(CHECKS)
    assert [c.name for c in result.not_run] == ["rim-signature", "revocation"]
    assert "not implemented" in result.check("rim-signature").detail
    claims = result.claims
    assert claims.nonce == NONCE and claims.measurements[2].hex() == BLOCK_2 and claims.fwid.hex() == FWID
    assert "GH100 A01 GSP FMC LF" in claims.leaf_subject and claims.driver_version == "550.90.07"


def test_without_expectations_the_nonce_and_references_do_not_run(evidence, trust):
    result = verify_nvidia(evidence, trust, at=AT)
    assert result.ok and not result.passed("nonce")
    assert {c.name for c in result.not_run} == {"nonce", "reference-measurements", "rim-signature", "revocation"}


def test_a_different_nonce_fails(evidence, trust):
    assert _failure(verify_nvidia(evidence, trust, nonce=bytes(32), at=AT)) == "nonce"
    assert _failure(verify_nvidia(evidence, trust, nonce=NONCE[:16], at=AT)) == "nonce"


def _flip(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 1]) + data[offset + 1 :]


@pytest.mark.parametrize(
    "where, expected",
    [
        ("nonce", "report-signature"),  # the requester's nonce is signed
        ("block2", "report-signature"),
        ("fwid", "fwid-binding"),
        ("signature", "report-signature"),
    ],
)
def test_one_flipped_bit_fails_at_the_right_check(evidence, trust, report, where, expected):
    offsets = {
        "nonce": 4,
        "block2": report.index(bytes.fromhex(BLOCK_2)),
        "fwid": report.index(bytes.fromhex(FWID)),
        "signature": len(report) - 50,
    }
    changed = replace(evidence, report=_flip(report, offsets[where]))
    assert _failure(verify_nvidia(changed, trust, at=AT)) == expected


def test_a_changed_certificate_or_another_root_fails_the_chain(evidence, trust):
    chain = evidence.cert_chain
    ends = [m.start() for m in re.finditer(b"-----END CERTIFICATE-----", chain)]
    at = ends[1] - 60  # inside the second certificate's (GSP BROM's) signature
    changed = chain[:at] + (b"B" if chain[at : at + 1] != b"B" else b"C") + chain[at + 1 :]
    result = verify_nvidia(replace(evidence, cert_chain=changed), trust, at=AT)
    assert _failure(result) == "cert-chain" and "does not verify" in result.first_failure.detail
    rim_root = NvidiaTrust(roots=(_file("verifier_RIM_root.pem"),))
    assert _failure(verify_nvidia(evidence, rim_root, at=AT)) == "cert-chain"


def test_reference_values_that_differ_or_miss_a_block_fail(evidence, trust, report):
    measured = parse_spdm_report(report).measurements
    reference = {i: frozenset({v}) for i, v in measured.items()}
    reference[2] = frozenset({bytes(48)})
    result = verify_nvidia(evidence, trust, NvidiaPolicy(reference=reference), at=AT)
    assert _failure(result) == "reference-measurements" and "[2]" in result.first_failure.detail
    partial = {i: frozenset({v}) for i, v in measured.items() if i != 64}
    result = verify_nvidia(evidence, trust, NvidiaPolicy(reference=partial), at=AT)
    assert _failure(result) == "reference-measurements" and "no reference" in result.first_failure.detail


_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_FUZZ
@given(
    data=st.one_of(st.binary(max_size=5000), st.binary(min_size=4, max_size=200).map(lambda b: b"\x11\xe0\x01\xff" + b))
)
def test_random_bytes_never_verify(evidence, trust, data):
    assert _failure(verify_nvidia(replace(evidence, report=data), trust, at=AT)) == "report-format"


@_FUZZ
@given(cut=st.integers(0, 4116), extra=st.binary(min_size=1, max_size=64))
def test_truncated_or_extended_reports_never_verify(evidence, trust, report, cut, extra):
    for data in (report[:cut], report + extra):
        assert _failure(verify_nvidia(replace(evidence, report=data), trust, at=AT)) in CHECKS


@_FUZZ
@given(offset=st.integers(0, 4116), value=st.integers(1, 255))
def test_any_changed_byte_never_verifies(evidence, trust, report, offset, value):
    changed = report[:offset] + bytes([report[offset] ^ value]) + report[offset + 1 :]
    assert _failure(verify_nvidia(replace(evidence, report=changed), trust, at=AT)) in CHECKS


@_FUZZ
@given(data=st.binary(max_size=3000))
def test_random_certificate_chains_fail_without_raising(evidence, trust, data):
    assert _failure(verify_nvidia(replace(evidence, cert_chain=data), trust, at=AT)) == "cert-chain"
