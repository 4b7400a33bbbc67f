"""`traceless attest verify`: exit 0 when every check that ran passed, 1 at a failed check, 2 for a
usage error; the text and JSON reports say what was checked and the first failure."""

import json
import shutil

import pytest

from tests.vectors import DATA, vector_path
from traceless_tools.cli import main

MEASUREMENT = "7a1e5c266c0108dbc9bb94fa926951320940915d0aafb42464bd88b579ea158d3e1a0dc39b2c60bd95b9c480cd81841f"
NONCE = "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb"


def _v(name: str) -> str:
    return str(vector_path(f"attestation/{name}"))


def _snp_args(*extra: str) -> list[str]:
    return [
        "attest",
        "verify",
        _v("sev-snp/report_milan.hex"),
        "--root",
        _v("sev-snp/ark_milan.pem"),
        "--vcek",
        _v("sev-snp/vcek_milan.der"),
        "--cert-chain",
        _v("sev-snp/cert_chain_milan"),
        "--at",
        "2025-01-01T00:00:00+00:00",
        *extra,
    ]


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_real_snp_report_verifies_from_hex_text_with_kind_detected(capsys):
    assert main(_snp_args("--expect-measurement", MEASUREMENT, "--min-tcb", "bl=3,tee=0,snp=8,ucode=115")) == 0
    out = capsys.readouterr().out
    assert out.startswith("AMD SEV-SNP evidence: VERIFIED\n") and "[pass] measurement" in out
    assert "not checked: report-data, revocation" in out and f"measurement: {MEASUREMENT}" in out


def test_json_report_names_the_first_failure_and_exits_1(capsys):
    assert main(_snp_args("--json", "--expect-report-data", "00" * 64)) == 1
    report = _json(capsys)
    assert report["ok"] is False and report["first_failure"]["check"] == "report-data"
    assert report["claims"] is None and report["proves"] is None
    assert [c["status"] for c in report["checks"]][:4] == ["passed"] * 4


def test_snp_against_the_wrong_root_exits_1(capsys):
    args = _snp_args("--json")
    args[args.index("--root") + 1] = _v("sev-snp/ark_turin.pem")
    assert main(args) == 1
    assert _json(capsys)["first_failure"]["check"] == "cert-chain"


def test_nvidia_report_with_its_nonce(capsys):
    args = [
        "attest",
        "verify",
        _v("nvidia-h100/hopperAttestationReport.txt"),
        "--root",
        _v("nvidia-h100/verifier_device_root.pem"),
        "--cert-chain",
        _v("nvidia-h100/hopperCertChain.txt"),
        "--nonce",
        NONCE,
        "--json",
        "--at",
        "2025-01-01",
    ]
    assert main(args) == 0
    report = _json(capsys)
    assert report["kind"] == "nvidia" and report["claims"]["nonce"] == NONCE
    assert report["claims"]["measurements"]["2"].startswith("8048dfd1") and "rim-signature" in report["not_run"]
    assert main(args[:-5] + ["--nonce", "00" * 32]) == 1


def test_tdx_quote_with_and_without_collateral(tmp_path, capsys):
    quote = tmp_path / "quote.dat"
    quote.write_bytes(vector_path("attestation/tdx/tdx_prod_quote_SPR_E4.dat").read_bytes()[:4935])
    base = ["attest", "verify", str(quote), "--root", _v("tdx/intel_sgx_root_ca.pem"), "--at", "2023-07-01"]
    assert main(base) == 0
    assert "Intel TDX evidence: VERIFIED" in capsys.readouterr().out
    collateral = tmp_path / "collateral"
    collateral.mkdir()
    for src, dst in (
        ("sample_tcbInfo_response", "tcb_info.json"),
        ("sample_qeIdentity_response", "qe_identity.json"),
        ("pckcrl", "pck_crl.der"),
        ("rootcrl.der", "root_crl.der"),
    ):
        shutil.copy(_v(f"tdx/{src}"), collateral / dst)
    shutil.copy(DATA / "attestation" / "tdx_tcb_signing_chain.pem", collateral / "tcb_signing_chain.pem")
    assert main([*base, "--collateral", str(collateral), "--json"]) == 1
    assert _json(capsys)["first_failure"]["check"] == "tcb-status"


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: [x for x in a if x not in ("--root", _v("sev-snp/ark_milan.pem"))], "--root is required"),
        (lambda a: a + ["--expect-report-data", "zz"], "not hex"),
        (lambda a: a + ["--expect-measurement", "00"], "expected 48"),
        (lambda a: a + ["--at", "yesterday"], "ISO 8601"),
        (lambda a: a + ["--min-tcb", "bl=3,xyz=1"], "--min-tcb"),
        (lambda a: [a[0], a[1], "/nonexistent/report"] + a[3:], "cannot read"),
    ],
)
def test_usage_errors_exit_2(capsys, change, message):
    assert main(change(_snp_args())) == 2
    assert message in capsys.readouterr().err


def test_unrecognized_bytes_and_bad_options_exit_2(tmp_path, capsys):
    blob = tmp_path / "blob"
    blob.write_bytes(b"not evidence")
    assert main(["attest", "verify", str(blob), "--root", _v("sev-snp/ark_milan.pem")]) == 2
    assert "pass --kind" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["attest", "verify", str(blob), "--kind", "sgx"])
    assert exit_info.value.code == 2
