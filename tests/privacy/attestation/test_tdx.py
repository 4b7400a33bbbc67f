"""TDX: the production SPR E4 quote (v4) and the v5 sample verify as far as their collateral allows,
with the claims read from them; tampering, expired collateral and unexpected values fail at the
check that names them; fuzzed quotes never crash and never verify.

Literal values were read once with `dcap_qvl.parse_quote` (an independent parser) and match ours.
"""

import json
import shutil
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.privacy.attestation.forge_tdx import forge_tdx_quote
from tests.vectors import DATA, vector_path
from traceless.privacy.attestation import tdx as tdx_module
from traceless.privacy.attestation.certs import load_pem_chain
from traceless.privacy.attestation.evidence import CheckStatus, EvidenceError
from traceless.privacy.attestation.tdx import CHECKS, TdxCollateral, TdxPolicy, TdxTrust, verify_tdx
from traceless.privacy.attestation.tdx_collateral import signed_json
from traceless.privacy.attestation.tdx_quote import parse_tdx_quote

TEST_TRAILER = b"\nextra bytes(only for testing purpose)\n"  # appended to the quote by go-tdx-guest
AT_2023 = datetime(2023, 7, 1, tzinfo=UTC)
AT_2026 = datetime(2026, 2, 3, tzinfo=UTC)
MR_TD = "6363b8043668a3ad953278e10389574d326c6749fb78aa810ecd9336923db86f22fc00b8dcd404bc10d5e119d7215cbb"
RTMR0 = "2927da70461cd63266f43230cc1849c03ef25ebe490062a801d8fcc80af42976823adf08f833c1e50b51779c6593f32a"
RTMR2 = "8652f0caaba7e215ea442dc36a4499d8fec3362f3a0b2ca151cbe4b3e6466fe59c7368b3c2287fc7c3bf5c924eb4424e"
REPORT_DATA = (
    "6c62dec1b8191749a31dab490be532a35944dea47caef1f980863993d9899545"
    "eb7406a38d1eed313b987a467dacead6f0c87a6d766c66f6f29f8acb281f1113"
)
V5_MR_TD = "7348651a34b2d2d3462822e3a750ec6110125f36757c78480bbfc69cc0d21fb001a1ced3ee19747dda8f750c3bc8f876"
COLLATERAL_CHECKS = ("collateral-signatures", "collateral-current", "revocation", "tcb-status")


def _file(name: str) -> bytes:
    return vector_path(f"attestation/tdx/{name}").read_bytes()


@pytest.fixture(scope="module")
def quote() -> bytes:
    raw = _file("tdx_prod_quote_SPR_E4.dat")
    assert raw.endswith(TEST_TRAILER)
    return raw[: -len(TEST_TRAILER)]


@pytest.fixture(scope="module")
def trust() -> TdxTrust:
    return TdxTrust(roots=(_file("intel_sgx_root_ca.pem"),))


@pytest.fixture(scope="module")
def collateral() -> TdxCollateral:
    return TdxCollateral(
        tcb_info=_file("sample_tcbInfo_response"),
        qe_identity=_file("sample_qeIdentity_response"),
        tcb_signing_chain=(DATA / "attestation" / "tdx_tcb_signing_chain.pem").read_bytes(),
        pck_crl=_file("pckcrl"),
        root_crl=_file("rootcrl.der"),
    )


def _failure(result) -> str:
    assert not result.ok and result.claims is None
    return result.first_failure.name


def test_quote_parses_to_the_values_an_independent_parser_reads(quote):
    q = parse_tdx_quote(quote)
    td = q.td_report
    assert q.version == 4 and td.mr_td.hex() == MR_TD and td.report_data.hex() == REPORT_DATA
    assert td.rtmrs[0].hex() == RTMR0 and td.rtmrs[2].hex() == RTMR2 and td.rtmrs[3] == bytes(48)
    assert td.td_attributes.hex() == "0000004000000000" and td.xfam.hex() == "e71a060000000000"
    assert td.tee_tcb_svn.hex() == "03000400000000000000000000000000" and td.mr_service_td is None
    assert not td.debug and len(q.signed_bytes) == 48 + 584 and q.pck_chain_pem.count(b"BEGIN CERTIFICATE") == 3


def test_production_quote_verifies_without_collateral_and_says_what_did_not_run(quote, trust):
    policy = TdxPolicy(mr_td=frozenset({bytes.fromhex(MR_TD)}), rtmrs=(bytes.fromhex(RTMR0), None, None, bytes(48)))
    result = verify_tdx(quote, trust, policy, report_data=bytes.fromhex(REPORT_DATA), at=AT_2023)
    assert result.ok and [c.name for c in result.checks] == list(CHECKS)
    assert tuple(c.name for c in result.not_run) == COLLATERAL_CHECKS
    assert all("no collateral" in c.detail for c in result.not_run)
    claims = result.claims
    assert claims.mr_td.hex() == MR_TD and claims.rtmrs[2].hex() == RTMR2 and claims.tcb_status is None


def test_with_its_collateral_every_signature_verifies_but_no_tcb_level_matches(quote, trust, collateral):
    # The sample TCB info lists no level this platform's PCK SVNs reach (tests/data/attestation/README.md):
    # the honest verdict is "TCB not recognized", reported by dcap-qvl at the tcb-status check.
    result = verify_tdx(quote, trust, collateral=collateral, at=AT_2023)
    assert _failure(result) == "tcb-status" and "No matching TCB level" in result.first_failure.detail
    for name in ("pck-chain", "quote-signature", "collateral-signatures", "collateral-current", "revocation"):
        assert result.check(name).status is CheckStatus.PASSED


def test_collateral_used_after_it_expired_fails(quote, trust, collateral):
    result = verify_tdx(quote, trust, collateral=collateral, at=datetime(2023, 8, 1, tzinfo=UTC))
    assert _failure(result) == "collateral-current" and "TCB info" in result.first_failure.detail
    result = verify_tdx(quote, trust, collateral=collateral, at=datetime(2023, 7, 10, tzinfo=UTC))
    assert _failure(result) == "collateral-current" and "QE identity" in result.first_failure.detail


def test_tampered_collateral_fails_its_signature_check(quote, trust, collateral):
    tcb_info = collateral.tcb_info.replace(b'"tcbEvaluationDataNumber":15', b'"tcbEvaluationDataNumber":16')
    assert tcb_info != collateral.tcb_info
    result = verify_tdx(quote, trust, collateral=replace(collateral, tcb_info=tcb_info), at=AT_2023)
    assert _failure(result) == "collateral-signatures"
    swapped = replace(collateral, pck_crl=collateral.root_crl)
    assert _failure(verify_tdx(quote, trust, collateral=swapped, at=AT_2023)) == "collateral-signatures"


def test_signed_json_keeps_the_exact_signed_bytes(collateral):
    doc = signed_json(collateral.tcb_info, "tcbInfo")
    assert doc.raw.startswith(b'{"id":"TDX","version":3') and doc.body["fmspc"] == "50806f000000"
    assert json.loads(collateral.tcb_info)["signature"] == doc.signature.hex()


@settings(max_examples=200, deadline=None)
@given(
    document=st.one_of(
        st.binary(max_size=300),
        st.text(alphabet='{}[]":,0123456789abcdef tcbInfosignature', max_size=300).map(str.encode),
    )
)
def test_signed_json_refuses_anything_else_with_a_typed_error(document):
    try:
        doc = signed_json(document, "tcbInfo")
    except EvidenceError:
        return
    assert isinstance(doc.body, dict) and len(doc.signature) == 64


def test_hostile_nesting_is_a_typed_error(collateral):
    deep = b'{"tcbInfo":' + b"[" * 100_000 + b"]" * 100_000 + b',"signature":"00"}'
    with pytest.raises(EvidenceError):
        signed_json(deep, "tcbInfo")


def test_tcb_status_outside_the_policy_fails_and_inside_passes(quote, trust, collateral, monkeypatch):
    monkeypatch.setattr(tdx_module, "tcb_status", lambda *a: ("OutOfDate", ("INTEL-SA-00837",)))
    result = verify_tdx(quote, trust, collateral=collateral, at=AT_2023)
    assert _failure(result) == "tcb-status" and "INTEL-SA-00837" in result.first_failure.detail
    lenient = TdxPolicy(accepted_tcb_statuses=frozenset({"UpToDate", "OutOfDate"}))
    result = verify_tdx(quote, trust, lenient, collateral=collateral, at=AT_2023)
    assert result.ok and result.claims.tcb_status == "OutOfDate" and result.claims.advisory_ids == ("INTEL-SA-00837",)


def test_v5_sample_verifies_its_evidence_chain(trust, collateral):
    quote = _file("quote_v5_sample.dat")
    result = verify_tdx(quote, trust, at=AT_2026)
    assert result.ok and result.claims.version == 5 and result.claims.mr_td.hex() == V5_MR_TD
    assert result.claims.tee_tcb_svn2.hex() == "0d010400000000000000000000000000"
    assert result.claims.mr_service_td == bytes(48)
    # The sample collateral is from 2023 and the TCB signing certificate here ended in 2025.
    assert _failure(verify_tdx(quote, trust, collateral=collateral, at=AT_2026)) == "collateral-signatures"


def _flip(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 1]) + data[offset + 1 :]


@pytest.mark.parametrize(
    "offset, expected",
    [
        (48 + 136, "quote-signature"),  # MRTD
        (48 + 520, "quote-signature"),  # REPORTDATA
        (636, "quote-signature"),  # the quote signature's r
        (636 + 64, "qe-binding"),  # the attestation key
        (636 + 134 + 10, "qe-report-signature"),  # inside the QE report
        (636 + 134 + 384 + 5, "qe-report-signature"),  # the QE report signature
        (636 + 134 + 450, "qe-binding"),  # the QE auth data
        (0, "quote-format"),  # version 4 -> 5 without a v5 body
    ],
)
def test_one_flipped_bit_fails_at_the_right_check(quote, trust, offset, expected):
    assert _failure(verify_tdx(_flip(quote, offset), trust, at=AT_2023)) == expected


def test_a_changed_pck_certificate_or_a_foreign_root_fails_the_chain(quote, trust):
    q = parse_tdx_quote(quote)
    start = quote.index(q.pck_chain_pem) + 900  # inside the first certificate's base64 text
    swapped = quote[:start] + (b"A" if quote[start : start + 1] != b"A" else b"B") + quote[start + 1 :]
    assert _failure(verify_tdx(swapped, trust, at=AT_2023)) == "pck-chain"
    amd = TdxTrust(roots=(vector_path("attestation/sev-snp/ark_milan.pem").read_bytes(),))
    assert _failure(verify_tdx(quote, amd, at=AT_2023)) == "pck-chain"
    assert _failure(verify_tdx(quote, trust, at=datetime(2030, 1, 1, tzinfo=UTC))) == "pck-chain"


def test_unexpected_values_fail_where_they_are_compared(quote, trust):
    assert _failure(verify_tdx(quote, trust, report_data=bytes(64), at=AT_2023)) == "report-data"
    assert _failure(verify_tdx(quote, trust, TdxPolicy(mr_td=frozenset({bytes(48)})), at=AT_2023)) == "mr-td"
    rtmr1 = TdxPolicy(rtmrs=(None, bytes(48), None, None))
    assert _failure(verify_tdx(quote, trust, rtmr1, at=AT_2023)) == "rtmrs"


def test_a_debug_td_fails_through_the_same_path():
    good = forge_tdx_quote(report_data=b"\x07" * 64)
    result = verify_tdx(
        good.quote, TdxTrust(roots=(good.root,)), TdxPolicy(mr_td=frozenset({good.mr_td})), report_data=b"\x07" * 64
    )
    assert result.ok and result.claims.rtmrs == good.rtmrs
    debug = forge_tdx_quote(td_attributes=0x10000001)
    result = verify_tdx(debug.quote, TdxTrust(roots=(debug.root,)))
    assert _failure(result) == "td-attributes" and "DEBUG" in result.first_failure.detail


def test_collateral_directory_layout(tmp_path, collateral):
    for name, blob in zip(
        ("tcb_info.json", "qe_identity.json", "tcb_signing_chain.pem", "pck_crl.der"),
        (collateral.tcb_info, collateral.qe_identity, collateral.tcb_signing_chain, collateral.pck_crl),
    ):
        (tmp_path / name).write_bytes(blob)
    with pytest.raises(Exception, match="root_crl.der"):
        TdxCollateral.from_dir(tmp_path)
    shutil.copy(vector_path("attestation/tdx/rootcrl.der"), tmp_path / "root_crl.der")
    assert TdxCollateral.from_dir(tmp_path) == collateral


_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_FUZZ
@given(data=st.binary(max_size=6000))
def test_random_bytes_never_verify(trust, data):
    result = verify_tdx(data, trust, at=AT_2023)
    assert not result.ok and result.first_failure.name == "quote-format"


@_FUZZ
@given(cut=st.integers(0, 4934), extra=st.binary(min_size=1, max_size=64))
def test_truncated_or_extended_quotes_never_verify(quote, trust, cut, extra):
    for data in (quote[:cut], quote + extra):
        assert _failure(verify_tdx(data, trust, at=AT_2023)) == "quote-format"


@_FUZZ
@given(offset=st.integers(0, 4934), value=st.integers(1, 255))
def test_any_changed_byte_in_the_signed_parts_never_verifies(quote, trust, offset, value):
    changed = quote[:offset] + bytes([quote[offset] ^ value]) + quote[offset + 1 :]
    result = verify_tdx(changed, trust, at=AT_2023)
    if result.ok:
        # Every byte is signed or bound except the PCK chain's PEM text, whose certificates carry their
        # own signatures: a change there may only be one that leaves the same certificates.
        pem = parse_tdx_quote(quote).pck_chain_pem
        start = quote.index(pem)
        assert start <= offset < start + len(pem)
        assert load_pem_chain(parse_tdx_quote(changed).pck_chain_pem, "x") == load_pem_chain(pem, "x")
