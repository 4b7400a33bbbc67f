"""Evidence policies as files: every setting is read into the AttestationPolicy (roots as the bytes
of the files named, measurements, minimum TCB, collateral), the loaded policy decides as written,
and anything unknown, ill-typed or incomplete is refused with a message that names the section."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.privacy.attestation.fake_hardware import LAUNCH, hardware_attester, write_policy_file
from tests.privacy.attestation.forge import MILAN_TCB, make_amd_chain
from tests.vectors import DATA, vector_path
from traceless.privacy.attestation.evidence_policy import PolicyRefusedError, check_evidence
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.policy_file import PolicyFileError, load_policy_file, parse_policy
from traceless.privacy.attestation.snp_report import TcbVersion
from traceless.privacy.attestation.software import NodeStatement, new_claims

TDX_MR_TD = "ab" * 48


@pytest.fixture(scope="module")
def amd():
    return make_amd_chain()


def _write(directory: Path, doc: dict, name: str = "policy.json") -> Path:
    path = directory / name
    path.write_text(json.dumps(doc))
    return path


def _tdx_dir(directory: Path) -> Path:
    """The Intel root and PCS collateral (the project's vectors) laid out as a policy file names them."""
    tdx = vector_path("attestation/tdx")
    shutil.copy(tdx / "intel_sgx_root_ca.pem", directory / "intel-root.pem")
    col = directory / "collateral"
    col.mkdir()
    for src, dst in (
        ("sample_tcbInfo_response", "tcb_info.json"),
        ("sample_qeIdentity_response", "qe_identity.json"),
        ("pckcrl", "pck_crl.der"),
        ("rootcrl.der", "root_crl.der"),
    ):
        shutil.copy(tdx / src, col / dst)
    shutil.copy(DATA / "attestation" / "tdx_tcb_signing_chain.pem", col / "tcb_signing_chain.pem")
    return directory


def test_a_yaml_policy_is_read_setting_by_setting(tmp_path, amd):
    path = write_policy_file(tmp_path, amd, None, name="prod")
    policy = load_policy_file(path)
    assert (policy.name, policy.cpu, policy.gpu, policy.allow_software) == ("prod", frozenset({"snp"}), False, False)
    assert policy.trust.snp is not None and policy.trust.snp.arks == (amd.ark,)
    assert policy.trust.tdx is None and policy.trust.nvidia is None
    assert policy.snp.measurements == frozenset({LAUNCH}) and policy.snp.minimum_tcb == TcbVersion(0, 0, 0, 0)
    assert policy.snp.allow_smt and not policy.snp.allow_migration_agent and policy.snp.max_vmpl == 3


def test_a_json_policy_with_tdx_collateral_and_every_snp_setting(tmp_path, amd):
    _tdx_dir(tmp_path)
    (tmp_path / "ark.der").write_bytes(amd.ark)
    doc = {
        "cpu": ["snp", "tdx"],
        "roots": {"snp": ["ark.der"], "tdx": ["intel-root.pem"]},
        "snp": {
            "measurements": [LAUNCH.hex()],
            "allow_smt": False,
            "allow_migration_agent": True,
            "max_vmpl": 0,
            "minimum_tcb": {"bootloader": 3, "tee": 0, "snp": 8, "microcode": 115, "fmc": 1},
        },
        "tdx": {
            "mr_td": [TDX_MR_TD],
            "accepted_tcb_statuses": ["UpToDate", "SWHardeningNeeded"],
            "collateral": "collateral",
        },
    }
    policy = load_policy_file(_write(tmp_path, doc))
    assert policy.name == "policy" and policy.cpu == frozenset({"snp", "tdx"})  # the file's stem
    assert policy.snp.minimum_tcb == TcbVersion(3, 0, 8, 115, fmc=1)
    assert (policy.snp.allow_smt, policy.snp.allow_migration_agent, policy.snp.max_vmpl) == (False, True, 0)
    assert policy.tdx.mr_td == frozenset({bytes.fromhex(TDX_MR_TD)})
    assert policy.tdx.accepted_tcb_statuses == frozenset({"UpToDate", "SWHardeningNeeded"})
    assert policy.trust.tdx is not None
    assert policy.trust.tdx.roots == ((tmp_path / "intel-root.pem").read_bytes(),)
    assert policy.tdx_collateral is not None
    assert policy.tdx_collateral.pck_crl == (tmp_path / "collateral" / "pck_crl.der").read_bytes()
    assert "tcb-status" in policy.required_checks("tdx")  # collateral makes the TCB checks required


def test_a_gpu_policy_reads_the_nvidia_root_and_reference_values(tmp_path):
    shutil.copy(vector_path("attestation/nvidia-h100/verifier_device_root.pem"), tmp_path / "nv.pem")
    doc = {"gpu": True, "roots": {"nvidia": ["nv.pem"]}, "nvidia": {"reference": {"0": ["00" * 48], "3": []}}}
    policy = parse_policy(doc, tmp_path)
    assert policy.gpu and policy.cpu == frozenset() and policy.trust.nvidia is not None
    assert policy.nvidia.reference == {0: frozenset({bytes(48)}), 3: frozenset()}
    assert "reference-measurements" in policy.required_checks("nvidia")


def test_development_is_explicit_and_alone_allows_the_software_attester(tmp_path):
    policy = load_policy_file(_write(tmp_path, {"name": "dev", "development": True}, "dev.yaml"))
    assert policy.allow_software and policy.name == "dev" and not policy.cpu and not policy.gpu
    with pytest.raises(PolicyFileError, match="incomplete.*software attester explicitly"):
        parse_policy({"development": False}, tmp_path)
    with pytest.raises(PolicyFileError, match="development in the policy file must be true or false"):
        parse_policy({"development": "yes"}, tmp_path)


def test_the_loaded_policy_decides_as_written(tmp_path, amd):
    """Forged SEV-SNP evidence (test chain at MILAN_TCB) passes the file's policy, and fails it at the
    check the file tightens: an unknown launch measurement, a minimum TCB above the chain's."""
    attester = hardware_attester(tmp_path / "tsm", amd, None)
    claims = new_claims(
        NodeStatement(Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32), b"k" * 40),
        b"n" * 16,
        1_700_000_000,
        "hardware",
        10**9,
    )
    document = attester.attest(claims)
    evidence = attester.evidence(document)
    write_policy_file(tmp_path, amd, None, name="ok")
    assert check_evidence(load_policy_file(tmp_path / "ok-policy.yaml"), document, evidence).kind == "snp"
    write_policy_file(tmp_path, amd, None, name="other", launch=bytes(48))
    with pytest.raises(PolicyRefusedError) as e:
        check_evidence(load_policy_file(tmp_path / "other-policy.yaml"), document, evidence)
    assert e.value.reason == "snp:measurement"
    (tmp_path / "ark.der").write_bytes(amd.ark)
    above = {"bootloader": MILAN_TCB.bootloader, "tee": 0, "snp": MILAN_TCB.snp + 1, "microcode": MILAN_TCB.microcode}
    strict = parse_policy(
        {"cpu": ["snp"], "roots": {"snp": ["ark.der"]}, "snp": {"measurements": [LAUNCH.hex()], "minimum_tcb": above}},
        tmp_path,
    )
    with pytest.raises(PolicyRefusedError) as e:
        check_evidence(strict, document, evidence)
    assert e.value.reason == "snp:minimum-tcb"


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"cpu": ["snp"], "secret-setting": 1}, "the policy file has a key that is not one of name, cpu"),
        ({"snp": {"measurments": []}}, "snp has a key that is not one of measurements"),
        ({"cpu": ["sgx"]}, "cpu may list only snp, tdx"),
        ({"cpu": "snp"}, "cpu must be a list of strings"),
        ({"gpu": 1}, "gpu in the policy file must be true or false"),
        (
            {"cpu": ["snp"], "snp": {"measurements": [LAUNCH.hex()]}},
            "incomplete: accepting SEV-SNP needs the pinned AMD",
        ),
        ({"cpu": ["snp"], "roots": {"snp": ["ark.der"]}}, "incomplete: accepting SEV-SNP needs .* launch measurements"),
        (
            {"cpu": ["snp"], "roots": {"snp": ["ark.der"]}, "snp": {"measurements": ["abcd"]}},
            "snp.measurements must hold hex strings of 48 bytes",
        ),
        ({"cpu": ["snp"], "roots": {"snp": ["missing.der"]}}, "roots.snp: cannot read a certificate file"),
        ({"roots": {"snp": []}}, "roots.snp must name at least one certificate file"),
        ({"snp": {"minimum_tcb": {"bootloader": 1}}}, "snp.minimum_tcb needs bootloader, tee, snp and microcode"),
        (
            {"snp": {"minimum_tcb": {"bootloader": -1, "tee": 0, "snp": 0, "microcode": 0}}},
            "snp.minimum_tcb.bootloader must be a non-negative integer",
        ),
        ({"tdx": {"collateral": "nowhere"}}, "tdx.collateral: collateral directory lacks"),
        ({"nvidia": {"reference": {"first": []}}}, "nvidia.reference must map block indexes"),
        ({"name": ""}, "name must be a printable string"),
        (["snp"], "the policy file must be a mapping"),
    ],
)
def test_bad_policies_are_refused_naming_the_section(tmp_path, amd, doc, message):
    (tmp_path / "ark.der").write_bytes(amd.ark)
    with pytest.raises(PolicyFileError, match=message) as e:
        parse_policy(doc, tmp_path)
    assert "secret-setting" not in str(e.value) and "measurments" not in str(e.value)  # never echoes keys


def test_unreadable_or_undecodable_files_are_refused(tmp_path):
    with pytest.raises(PolicyFileError, match="cannot read the evidence policy file"):
        load_policy_file(tmp_path / "absent.yaml")
    (tmp_path / "bad.yaml").write_text("cpu: [snp\n")
    with pytest.raises(PolicyFileError, match="not valid JSON or YAML"):
        load_policy_file(tmp_path / "bad.yaml")
    (tmp_path / "bad.json").write_text("{'cpu': 1}")
    with pytest.raises(PolicyFileError, match="not valid JSON or YAML"):
        load_policy_file(tmp_path / "bad.json")
