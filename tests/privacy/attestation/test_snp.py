"""SEV-SNP: the real Milan report verifies with the claims read from it; every tampering, a foreign
chain, a debug guest or an unexpected value fails at the check that names it; fuzzed input never
crashes and never verifies.

Literal values below were read once from vectors/attestation/sev-snp/ and cross-checked: report
fields against the raw offsets the vectors' README documents (a second parse in this file), the
VCEK's TCB and hwID against `openssl asn1parse` of vcek_milan.der (blSPL 03, teeSPL 00, snpSPL
08, ucodeSPL 73, hwID d49554ec...).
"""

import struct
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.privacy.attestation.forge import (
    MILAN_TCB,
    POLICY_DEBUG,
    POLICY_DEFAULT,
    TURIN_TCB,
    forge_snp_evidence,
    make_amd_chain,
    sign_report,
)
from tests.vectors import vector_path
from traceless.privacy.attestation.certs import load_certificate
from traceless.privacy.attestation.evidence import CheckStatus, EvidenceError
from traceless.privacy.attestation.snp import CHECKS, SnpEvidence, SnpPolicy, SnpTrust, verify_snp
from traceless.privacy.attestation.snp_certs import (
    ARK_GUID,
    ASK_GUID,
    VCEK_GUID,
    build_cert_table,
    endorsement_extensions,
    parse_cert_table,
)
from traceless.privacy.attestation.snp_report import (
    ProductLine,
    TcbVersion,
    decode_tcb,
    encode_tcb,
    parse_snp_report,
)

AT = datetime(2025, 1, 1, tzinfo=UTC)
MEASUREMENT = "7a1e5c266c0108dbc9bb94fa926951320940915d0aafb42464bd88b579ea158d3e1a0dc39b2c60bd95b9c480cd81841f"
REPORT_DATA = (
    "d447b55d197491bfe15cf298f9de9986b7a7c4be2468b4f6e2d53b71d7c64581"
    "0b0f2cdfca0040433be063fc1a8293f0f3f8dae7b79fecb3d1cd82bd6a93ebfd"
)
CHIP_ID_PREFIX = "d49554ec717f4e5b0fe6b143bcf0405b"
REPORT_ID = "92b3b47d59f0a2a10a74c5678868a80238cf593c01a82f3cffb878e904c28d5b"


def _file(name: str) -> bytes:
    return vector_path(f"attestation/sev-snp/{name}").read_bytes()


@pytest.fixture(scope="module")
def real():
    report = bytes.fromhex(_file("report_milan.hex").decode())
    lines = ("milan", "genoa", "turin")
    trust = SnpTrust(arks=tuple(_file(f"ark_{p}.pem") for p in lines), asks=tuple(_file(f"ask_{p}.pem") for p in lines))
    return report, SnpEvidence(report=report, vcek=_file("vcek_milan.der")), trust


@pytest.fixture(scope="module")
def chain():
    return make_amd_chain()


def _flip(data: bytes, offset: int, bit: int = 0) -> bytes:
    return data[:offset] + bytes([data[offset] ^ (1 << bit)]) + data[offset + 1 :]


def _first_failure(result) -> str:
    assert not result.ok and result.claims is None
    return result.first_failure.name


def test_real_report_fields_match_the_documented_raw_offsets(real):
    report, _, _ = real
    parsed = parse_snp_report(report)
    assert (parsed.version, parsed.guest_svn, parsed.vmpl, parsed.signature_algo) == (2, 0, 0, 1)
    assert parsed.measurement.hex() == MEASUREMENT and parsed.report_data.hex() == REPORT_DATA
    assert parsed.chip_id.hex().startswith(CHIP_ID_PREFIX) and parsed.report_id.hex() == REPORT_ID
    assert parsed.report_id_ma == b"\xff" * 32 and parsed.platform_info == 1 and parsed.cpuid is None
    assert parsed.policy.raw == 0x30000 and parsed.policy.smt_allowed and not parsed.policy.debug
    assert not parsed.policy.migrate_ma and parsed.current_version == (1, 52, 4)
    assert decode_tcb(parsed.reported_tcb, ProductLine.MILAN) == TcbVersion(bootloader=3, tee=0, snp=8, microcode=115)
    # a second, independent read of the same bytes at the offsets the vectors' README states
    assert report[0x90:0xC0].hex() == MEASUREMENT and report[0x50:0x90].hex() == REPORT_DATA
    assert struct.unpack_from("<IIQ", report, 0) == (2, 0, 0x30000) and report[0x180:0x188].hex() == "0300000000000873"


def test_real_vcek_extensions_are_amds(real):
    ext = endorsement_extensions(load_certificate(_file("vcek_milan.der"), "VCEK"))
    assert (ext.product_name, ext.product_line, ext.csp_id) == ("Milan-B0", ProductLine.MILAN, None)
    assert ext.tcb == TcbVersion(bootloader=3, tee=0, snp=8, microcode=0x73) and ext.reserved_spls == (0, 0, 0, 0)
    assert ext.hwid.hex().startswith(CHIP_ID_PREFIX) and len(ext.hwid) == 64
    turin = endorsement_extensions(load_certificate(_file("vcek_turin.der"), "VCEK"))
    assert turin.product_line is ProductLine.TURIN and turin.tcb.fmc is not None
    assert turin.hwid.hex() == "1e550a8ee5cf9f4d"


def test_real_report_verifies_with_claims_from_the_evidence(real):
    _, evidence, trust = real
    policy = SnpPolicy(
        minimum_tcb=TcbVersion(bootloader=3, tee=0, snp=8, microcode=115),
        measurements=frozenset({bytes.fromhex(MEASUREMENT)}),
    )
    result = verify_snp(evidence, trust, policy, report_data=bytes.fromhex(REPORT_DATA), at=AT)
    assert result.ok and [c.name for c in result.checks] == list(CHECKS)
    assert [c.name for c in result.not_run] == ["revocation"]
    claims = result.claims
    assert claims.product == "Milan-B0" and claims.signer == "VCEK" and claims.measurement.hex() == MEASUREMENT
    assert claims.reported_tcb == claims.launch_tcb == TcbVersion(bootloader=3, tee=0, snp=8, microcode=115)
    assert not claims.debug and claims.smt_allowed and claims.chip_id.hex().startswith(CHIP_ID_PREFIX)


def test_real_report_without_expectations_says_which_checks_did_not_run(real):
    _, evidence, trust = real
    result = verify_snp(evidence, trust, at=AT)
    assert result.ok
    assert {c.name for c in result.not_run} == {"minimum-tcb", "measurement", "report-data", "revocation"}
    assert result.passed("report-signature") and not result.passed("report-data")


def test_real_report_through_an_extended_report_certificate_table(real):
    report, _, _ = real
    table = build_cert_table(
        [
            (VCEK_GUID, _file("vcek_milan.der")),
            (ASK_GUID, load_der(_file("ask_milan.pem"))),
            (ARK_GUID, load_der(_file("ark_milan.pem"))),
        ]
    )
    assert parse_cert_table(table).get(VCEK_GUID) == _file("vcek_milan.der")
    result = verify_snp(SnpEvidence.from_extended(report, table), SnpTrust(arks=(_file("ark_milan.pem"),)), at=AT)
    assert result.ok


def load_der(pem: bytes) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding

    return load_certificate(pem, "test").public_bytes(Encoding.DER)


@pytest.mark.parametrize(
    "offset, expected",
    [
        (0x90, "report-signature"),  # one bit of the launch measurement
        (0x50, "report-signature"),  # one bit of REPORT_DATA
        (0x2A0, "report-signature"),  # one bit of the signature's r
        (0x2A0 + 72 + 5, "report-signature"),  # one bit of s
        (0x08 + 2, "report-format"),  # policy bit 17, reserved, must be one
        (0x400, "report-format"),  # the zero padding after the signature
    ],
)
def test_one_flipped_bit_in_the_real_report_fails_at_the_right_check(real, offset, expected):
    report, evidence, trust = real
    bit = 1 if offset == 0x08 + 2 else 0
    result = verify_snp(replace(evidence, report=_flip(report, offset, bit)), trust, at=AT)
    assert _first_failure(result) == expected


def test_one_flipped_bit_in_the_vcek_fails_the_chain(real):
    _, evidence, trust = real
    vcek = _file("vcek_milan.der")
    at = vcek.index(b"Milan-B0") + 7  # inside the signed productName extension
    result = verify_snp(replace(evidence, vcek=_flip(vcek, at)), trust, at=AT)
    assert _first_failure(result) == "cert-chain" and "signature" in result.first_failure.detail


def test_turin_vcek_against_the_milan_ark_fails_the_chain(real):
    _, evidence, _ = real
    milan_only = SnpTrust(arks=(_file("ark_milan.pem"),))
    turin_ask = _file("cert_chain_turin").split(b"-----END CERTIFICATE-----")[0] + b"-----END CERTIFICATE-----\n"
    for ask in (turin_ask, _file("ask_milan.pem")):
        result = verify_snp(replace(evidence, vcek=_file("vcek_turin.der"), ask=ask), milan_only, at=AT)
        assert _first_failure(result) == "cert-chain"
    presented = replace(evidence, ark=_file("ark_turin.pem"), ask=turin_ask, vcek=_file("vcek_turin.der"))
    result = verify_snp(presented, milan_only, at=AT)
    assert _first_failure(result) == "cert-chain" and "not a pinned root" in result.first_failure.detail


def test_no_pinned_root_for_the_chain_and_an_expired_vcek_fail_the_chain(real):
    _, evidence, _ = real
    genoa_only = SnpTrust(arks=(_file("ark_genoa.pem"),), asks=(_file("ask_milan.pem"),))
    assert _first_failure(verify_snp(evidence, genoa_only, at=AT)) == "cert-chain"
    _, _, trust = real
    result = verify_snp(evidence, trust, at=datetime(2031, 1, 1, tzinfo=UTC))  # the VCEK ends 2030-04-03
    assert _first_failure(result) == "cert-chain" and "not valid at" in result.first_failure.detail


def test_unexpected_report_data_measurement_or_tcb_fail_where_they_are_compared(real):
    _, evidence, trust = real
    other = bytes(64)
    assert _first_failure(verify_snp(evidence, trust, report_data=other, at=AT)) == "report-data"
    policy = SnpPolicy(measurements=frozenset({bytes(48)}))
    assert _first_failure(verify_snp(evidence, trust, policy, at=AT)) == "measurement"
    newer = SnpPolicy(minimum_tcb=TcbVersion(bootloader=3, tee=0, snp=8, microcode=116))
    assert _first_failure(verify_snp(evidence, trust, newer, at=AT)) == "minimum-tcb"
    no_smt = SnpPolicy(allow_smt=False)
    assert _first_failure(verify_snp(evidence, trust, no_smt, at=AT)) == "guest-policy"


def test_forged_bundle_verifies_through_the_same_path(chain):
    forged = forge_snp_evidence(b"\x01" * 64, b"\x02" * 48, chain=chain)
    policy = SnpPolicy(measurements=frozenset({b"\x02" * 48}), minimum_tcb=MILAN_TCB)
    result = verify_snp(forged.evidence, forged.trust, policy, report_data=b"\x01" * 64)
    assert result.ok and result.claims.report_data == b"\x01" * 64
    assert SnpEvidence.from_extended(forged.evidence.report, forged.auxblob).vcek == chain.vcek
    # the test root is not AMD's: under AMD's real roots the same bundle is refused
    amd = SnpTrust(arks=(_file("ark_milan.pem"),))
    assert _first_failure(verify_snp(forged.evidence, amd)) == "cert-chain"


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"policy": POLICY_DEFAULT | POLICY_DEBUG}, "guest-policy"),
        ({"policy": POLICY_DEFAULT | 1 << 18}, "guest-policy"),  # migration agent allowed
        ({"vmpl": 4}, "guest-policy"),
        ({"reported_tcb": replace(MILAN_TCB, snp=9)}, "tcb-binding"),  # a TCB the VCEK was not derived for
        ({"signer": 1}, "report-signature"),  # claims a VLEK, carries a VCEK
        ({"signer": 7}, "report-format"),  # unsigned
        ({"version": 6}, "report-format"),
        ({"version": 3, "cpuid": (0x19, 0x11, 0x01)}, "tcb-binding"),  # a Genoa CPUID on a Milan VCEK
    ],
)
def test_forged_reports_fail_at_the_right_check(chain, fields, expected):
    forged = forge_snp_evidence(chain=chain, **fields)
    result = verify_snp(forged.evidence, forged.trust, SnpPolicy(max_vmpl=3))
    assert _first_failure(result) == expected


def test_a_report_from_another_chip_fails_the_tcb_binding(chain):
    forged = forge_snp_evidence(chain=replace(chain, chip_id=bytes(range(2, 66))))
    assert _first_failure(verify_snp(forged.evidence, forged.trust)) == "tcb-binding"


@pytest.mark.parametrize("version", [2, 3, 5])
def test_turin_reports_use_the_fmc_tcb_layout(version):
    chain = make_amd_chain("Turin-B0", TURIN_TCB)
    forged = forge_snp_evidence(chain=chain, version=version)
    result = verify_snp(forged.evidence, forged.trust, SnpPolicy(minimum_tcb=TURIN_TCB))
    assert result.ok and result.claims.reported_tcb == TURIN_TCB and result.claims.reported_tcb.fmc == 1
    assert parse_snp_report(forged.evidence.report).reported_tcb == encode_tcb(TURIN_TCB, ProductLine.TURIN)
    assert encode_tcb(TURIN_TCB, ProductLine.TURIN) == bytes([1, 1, 0, 9, 0, 0, 0, 2])
    higher_fmc = SnpPolicy(minimum_tcb=replace(TURIN_TCB, fmc=2))
    assert _first_failure(verify_snp(forged.evidence, forged.trust, higher_fmc)) == "minimum-tcb"


def test_version_5_fields_and_a_vlek(chain):
    v5 = parse_snp_report(forge_snp_evidence(chain=chain, version=5).evidence.report)
    assert v5.version == 5 and v5.mit_vectors == (0, 0) and v5.cpuid == (0x19, 0x01, 0x01)
    vlek = make_amd_chain(vlek=True)
    forged = forge_snp_evidence(chain=vlek, signer=1)
    result = verify_snp(forged.evidence, forged.trust)
    assert result.ok and result.claims.signer == "VLEK"


def test_cert_table_rejects_bad_layouts():
    good = build_cert_table([(VCEK_GUID, b"vcek"), (ASK_GUID, b"ask")])
    assert parse_cert_table(good).get(ASK_GUID) == b"ask" and parse_cert_table(b"").entries == ()
    for bad in (
        good[:20],
        good[: 24 * 3 - 1],
        build_cert_table([(VCEK_GUID, b"a"), (VCEK_GUID, b"b")]),
        good[:16] + struct.pack("<II", 10_000, 4) + good[24:],
    ):
        with pytest.raises(EvidenceError):
            parse_cert_table(bad)


_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_FUZZ
@given(data=st.one_of(st.binary(max_size=2000), st.binary(min_size=0x4A0, max_size=0x4A0)))
def test_random_bytes_never_verify(real, data):
    _, evidence, trust = real
    result = verify_snp(replace(evidence, report=data), trust, at=AT)
    assert not result.ok and result.first_failure.status is CheckStatus.FAILED


@_FUZZ
@given(cut=st.integers(0, 0x4A0 - 1), extra=st.binary(min_size=1, max_size=64))
def test_truncated_or_extended_reports_never_verify(real, cut, extra):
    report, evidence, trust = real
    for data in (report[:cut], report + extra):
        assert _first_failure(verify_snp(replace(evidence, report=data), trust, at=AT)) == "report-format"


@_FUZZ
@given(offset=st.integers(0, 0x4A0 - 1), value=st.integers(1, 255))
def test_any_changed_byte_never_verifies(real, offset, value):
    report, evidence, trust = real
    changed = report[:offset] + bytes([report[offset] ^ value]) + report[offset + 1 :]
    assert _first_failure(verify_snp(replace(evidence, report=changed), trust, at=AT)) in CHECKS


@_FUZZ
@given(data=st.binary(max_size=3000))
def test_random_certificates_and_tables_fail_without_raising(real, data):
    _, evidence, trust = real
    assert _first_failure(verify_snp(replace(evidence, vcek=data), trust, at=AT)) == "cert-chain"
    try:
        table = parse_cert_table(data)
    except EvidenceError:
        return
    assert all(blob for _, blob in table.entries)


def test_resigning_with_a_foreign_key_fails_the_signature(real, chain):
    report, evidence, trust = real
    forged = sign_report(report, chain.vcek_key)
    assert _first_failure(verify_snp(replace(evidence, report=forged), trust, at=AT)) == "report-signature"
