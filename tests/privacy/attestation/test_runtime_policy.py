"""The confidential runtime's agent policy, bound into the CPU report: the client's evidence policy
allows only the HOST_DATA (SEV-SNP) or MRCONFIGID (TDX) of the Kata initdata documents it names, so
a node whose runtime was launched with another agent policy (one that lets the host exec into the
node) is refused, on both kinds of report. The digest follows the initdata rule: the document's
own algorithm over its bytes, cut or zero-padded to the field."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest

from tests.privacy.attestation.forge import forge_snp_evidence, make_amd_chain
from tests.privacy.attestation.forge_tdx import forge_tdx_quote
from traceless.privacy.attestation.collectors import Collector, Evidence
from traceless.privacy.attestation.evidence_policy import (
    AttestationPolicy,
    HardwareTrust,
    PolicyRefusedError,
    check_evidence,
)
from traceless.privacy.attestation.hardware import HardwareAttester
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.policy_file import PolicyFileError, parse_policy
from traceless.privacy.attestation.runtime_policy import InitdataError, initdata_digest
from traceless.privacy.attestation.snp import SnpPolicy, SnpTrust
from traceless.privacy.attestation.software import NodeStatement, new_claims
from traceless.privacy.attestation.tdx import TdxPolicy, TdxTrust

LAUNCH = bytes(range(48))


def initdata(algorithm: str, exec_allowed: bool) -> bytes:
    return (
        f'algorithm = "{algorithm}"\nversion = "0.1.0"\n\n[data]\n"policy.rego" = \'\'\'\n'
        f"package agent_policy\ndefault ExecProcessRequest := {str(exec_allowed).lower()}\n"
        "default ReadStreamRequest := false\n'''\n"
    ).encode()


RESTRICTIVE, PERMISSIVE = initdata("sha384", False), initdata("sha384", True)


class SnpCollector(Collector):
    def __init__(self, chain, host_data: bytes) -> None:
        self.chain, self.host_data = chain, host_data

    def collect(self, report_data: bytes) -> Evidence:
        forged = forge_snp_evidence(report_data, LAUNCH, chain=self.chain, host_data=self.host_data)
        return Evidence("snp", forged.evidence.report, forged.auxblob, "test")


class TdxCollector(Collector):
    """A forged quote with the given MRCONFIGID; its test root is kept for the policy to pin."""

    def __init__(self, mr_config_id: bytes) -> None:
        self.mr_config_id, self.forged = mr_config_id, None

    def collect(self, report_data: bytes) -> Evidence:
        self.forged = forge_tdx_quote(report_data, mr_config_id=self.mr_config_id)
        return Evidence("tdx", self.forged.quote, b"", "test")


def _document(attester) -> str:
    key_config = b"\x00\x01\x00\x20" + os.urandom(32)
    statement = NodeStatement(Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32), key_config)
    return attester.attest(new_claims(statement, b"n" * 16, int(time.time()), attester.attester_type))


def test_the_digest_is_the_documents_algorithm_cut_or_padded_to_the_field():
    for algorithm in ("sha256", "sha384", "sha512"):
        doc = initdata(algorithm, False)
        full = hashlib.new(algorithm, doc).digest()
        assert initdata_digest(doc, "snp") == full[:32]
        assert initdata_digest(doc, "tdx") == (full + bytes(16))[:48]  # sha256: padded with zeros
    assert initdata_digest(RESTRICTIVE, "tdx") != initdata_digest(PERMISSIVE, "tdx")
    for bad in (
        b'algorithm = "md5"\nversion = "0.1.0"\n[data]\n',
        b'algorithm = "sha256"\nversion = "9"\n[data]\n',
        b'algorithm = "sha256"\nversion = "0.1.0"\n',
        b"\xff",
        b"not = [toml",
    ):
        with pytest.raises(InitdataError):
            initdata_digest(bad, "snp")
    with pytest.raises(InitdataError):
        initdata_digest(RESTRICTIVE, "nvidia")


def test_snp_host_data_must_be_the_allowed_runtime_policys():
    chain = make_amd_chain()
    policy = AttestationPolicy(
        "test",
        cpu=frozenset({"snp"}),
        trust=HardwareTrust(snp=SnpTrust(arks=(chain.ark,))),
        snp=SnpPolicy(measurements=frozenset({LAUNCH})),
        host_data=frozenset({initdata_digest(RESTRICTIVE, "snp")}),
    )
    for document, passes in ((RESTRICTIVE, True), (PERMISSIVE, False), (None, False)):
        host_data = bytes(32) if document is None else initdata_digest(document, "snp")
        attester = HardwareAttester(cpu=SnpCollector(chain, host_data))
        doc = _document(attester)
        if passes:
            assert check_evidence(policy, doc, attester.evidence(doc)).results[0].claims.host_data == host_data
        else:
            with pytest.raises(PolicyRefusedError) as e:
                check_evidence(policy, doc, attester.evidence(doc))
            assert e.value.reason == "snp:host-data"


def test_tdx_mr_config_id_must_be_the_allowed_runtime_policys():
    for document, passes in ((RESTRICTIVE, True), (PERMISSIVE, False)):
        collector = TdxCollector(initdata_digest(document, "tdx"))
        attester = HardwareAttester(cpu=collector)
        doc = _document(attester)
        evidence = attester.evidence(doc)
        policy = AttestationPolicy(
            "test",
            cpu=frozenset({"tdx"}),
            trust=HardwareTrust(tdx=TdxTrust(roots=(collector.forged.root,))),
            tdx=TdxPolicy(mr_td=frozenset({collector.forged.mr_td})),
            mr_config_id=frozenset({initdata_digest(RESTRICTIVE, "tdx")}),
        )
        if passes:
            assert check_evidence(policy, doc, evidence).kind == "tdx"
        else:
            with pytest.raises(PolicyRefusedError) as e:
                check_evidence(policy, doc, evidence)
            assert e.value.reason == "tdx:mr-config-id"
    # without the setting the field is not checked (a deployment that has not pinned its runtime)
    loose = AttestationPolicy("test", cpu=frozenset({"tdx"}), trust=policy.trust, tdx=policy.tdx)
    assert check_evidence(loose, doc, evidence).kind == "tdx"


def test_the_policy_file_pins_initdata_files_and_hex_values(tmp_path):
    chain = make_amd_chain()
    (tmp_path / "ark.der").write_bytes(chain.ark)
    (tmp_path / "initdata.toml").write_bytes(RESTRICTIVE)
    extra = "ab" * 32
    doc = {
        "cpu": ["snp"],
        "roots": {"snp": ["ark.der"]},
        "snp": {"measurements": [LAUNCH.hex()], "host_data": [extra]},
        "kata_initdata": ["initdata.toml"],
    }
    policy = parse_policy(json.loads(json.dumps(doc)), tmp_path)
    assert policy.host_data == {bytes.fromhex(extra), initdata_digest(RESTRICTIVE, "snp")}
    assert policy.mr_config_id == {initdata_digest(RESTRICTIVE, "tdx")}
    for bad, message in (
        ({"snp": {"measurements": [LAUNCH.hex()], "host_data": ["ab" * 31]}}, "32 bytes"),
        ({"snp": {"measurements": [LAUNCH.hex()], "host_data": []}}, "non-empty"),
        ({"tdx": {"mr_config_id": ["ab" * 32]}}, "48 bytes"),
        ({"kata_initdata": ["missing.toml"]}, "kata_initdata"),
    ):
        with pytest.raises(PolicyFileError, match=message):
            parse_policy(
                {"cpu": ["snp"], "roots": {"snp": ["ark.der"]}, "snp": {"measurements": [LAUNCH.hex()]}, **bad},
                tmp_path,
            )
    (tmp_path / "bad.toml").write_bytes(b'algorithm = "md5"\nversion = "0.1.0"\n[data]\n')
    with pytest.raises(PolicyFileError, match="kata_initdata: .*algorithm"):
        parse_policy({**doc, "kata_initdata": ["bad.toml"]}, tmp_path)
