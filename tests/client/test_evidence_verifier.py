"""NodeVerifier with an evidence policy: the key is the one the evidence vouches for, the kind is
reported, refusals are recorded with fixed codes only; evidence without a policy is refused rather
than ignored; the events schema knows every verifier's checks."""

from __future__ import annotations

import base64
import logging
import time
from dataclasses import replace

import pytest

from tests.privacy.attestation.fake_hardware import hardware_attester, write_policy_file
from tests.privacy.attestation.forge import make_amd_chain
from tests.privacy.attestation.forge_nvidia import GpuTestChain
from tests.support.cluster_services import RELEASE, StubReleases
from traceless import events
from traceless.privacy.attestation import nvidia, snp, tdx
from traceless.privacy.attestation.evidence_policy import AttestationPolicy
from traceless.privacy.attestation.hardware import evidence_to_json
from traceless.privacy.attestation.policy_file import load_policy_file
from traceless.privacy.attestation.runtime_policy import RUNTIME_POLICY_CHECKS
from traceless.privacy.attestation.software import NodeStatement, SoftwareAttester, new_claims
from traceless.privacy.ohttp.gateway import OhttpServer
from traceless_tools.client.node_verifier import NodeRefused, NodeVerifier, _split_reason
from traceless_tools.client.private_client import ClientConfig

NONCE = b"n" * 16


@pytest.fixture(scope="module")
def chains():
    return make_amd_chain(), GpuTestChain()


@pytest.fixture(scope="module")
def policy(chains, tmp_path_factory) -> AttestationPolicy:
    return load_policy_file(write_policy_file(tmp_path_factory.mktemp("p"), *chains))


def _entry(attester, evidence=True) -> dict:
    server = OhttpServer(key_id=2)
    statement = NodeStatement(RELEASE.measurement, server.ohttp_keys(), 1, "http://node.test")
    document = attester.attest(new_claims(statement, NONCE, int(time.time()), attester.attester_type))
    out = {"node_id": "n1", "attestation": document, "ohttp_keys": base64.b64encode(server.ohttp_keys()).decode()}
    if evidence and hasattr(attester, "evidence"):
        out["evidence"] = [evidence_to_json(e) for e in attester.evidence(document)]
    return out


def _verifier(policy=None, keys=()):
    config = ClientConfig(
        "http://i", "k", "http://r", "http://127.0.0.1:9", b"\x00" * 32, tuple(keys), "m", evidence_policy=policy
    )
    return NodeVerifier(config, releases=StubReleases(RELEASE))


def test_the_key_the_evidence_vouches_for_is_trusted_and_the_kind_reported(policy, chains, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="traceless.events")
    attester = hardware_attester(tmp_path / "tsm", *chains)
    v = _verifier(policy)  # no pinned keys at all
    try:
        node = v.verify(_entry(attester), expected_nonce=NONCE)
    finally:
        v.close()
    assert node.attestation_kind == "snp+nvidia" and node.capacity == 1
    assert any(
        '"client.attestation_kind"' in r.getMessage() and '"snp+nvidia"' in r.getMessage() for r in caplog.records
    )


def test_missing_or_tampered_evidence_is_refused_with_fixed_codes(policy, chains, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="traceless.events")
    attester = hardware_attester(tmp_path / "tsm", *chains)
    good = _entry(attester)
    flipped = [dict(item) for item in good["evidence"]]
    blob = bytearray(base64.b64decode(flipped[1]["blob"]))
    blob[40] ^= 1
    flipped[1]["blob"] = base64.b64encode(bytes(blob)).decode()
    v = _verifier(policy)
    try:
        for entry in ({**good, "evidence": good["evidence"][:1]}, {**good, "evidence": flipped}):
            with pytest.raises(NodeRefused) as refused:
                v.verify(entry, expected_nonce=NONCE)
            assert refused.value.reason == "evidence_refused"
        with pytest.raises(NodeRefused) as refused:
            v.verify({**good, "evidence": [{"kind": "snp"}]}, expected_nonce=NONCE)
        assert refused.value.reason == "malformed"
        v.verify_all([{**good, "evidence": []}, good], NONCE)
        assert v.last_refused == {"evidence_refused": 1}
    finally:
        v.close()
    refusals = [r.getMessage() for r in caplog.records if '"client.evidence_refused"' in r.getMessage()]
    assert '"reason":"gpu_evidence_missing"' in refusals[0]
    assert '"kind":"nvidia"' in refusals[1] and '"reason":"report_failed"' in refusals[1]
    assert '"reason":"software_attester_refused"' in refusals[2]


def _vouched_entry(attester, fresh_capacity: int = 1) -> dict:
    """A node's listing entry as it serves one: evidence over its base document (capacity 1), and a
    fresh document for NONCE by the same key, stating `fresh_capacity`."""
    server = OhttpServer(key_id=2)
    statement = NodeStatement(RELEASE.measurement, server.ohttp_keys(), 1, "http://node.test")
    now = int(time.time())
    base = attester.attest(new_claims(statement, b"b" * 16, now, attester.attester_type, 3600))
    fresh = attester.attest(new_claims(replace(statement, capacity=fresh_capacity), NONCE, now, attester.attester_type))
    return {
        "node_id": "n1",
        "attestation": fresh,
        "ohttp_keys": base64.b64encode(server.ohttp_keys()).decode(),
        "evidence": [evidence_to_json(e) for e in attester.evidence(base)],
        "base_attestation": base,
    }


def test_a_fresh_document_counts_only_as_a_restatement_of_the_base_its_evidence_binds(policy, chains, tmp_path):
    attester = hardware_attester(tmp_path / "tsm", *chains)
    good = _vouched_entry(attester)
    v = _verifier(policy)
    try:
        assert v.verify(good, expected_nonce=NONCE).attestation_kind == "snp+nvidia"
        cases = [
            (_vouched_entry(attester, fresh_capacity=2), "base_mismatch"),  # a capacity the evidence never saw
            ({**good, "attestation": good["base_attestation"]}, "stale"),  # the base carries the node's nonce
            ({**good, "evidence": []}, "malformed"),  # a base without the evidence that binds it
            ({**good, "evidence": _entry(attester)["evidence"]}, "evidence_refused"),  # evidence for another document
        ]
        for entry, reason in cases:
            with pytest.raises(NodeRefused) as refused:
                v.verify(entry, expected_nonce=NONCE)
            assert refused.value.reason == reason
    finally:
        v.close()


def test_evidence_without_an_evidence_policy_is_refused_not_ignored(chains, tmp_path):
    attester = hardware_attester(tmp_path / "tsm", *chains)
    v = _verifier(None, keys=(attester.public_key.public_bytes_raw(),))  # even with the key pinned
    try:
        with pytest.raises(NodeRefused) as refused:
            v.verify(_entry(attester), expected_nonce=NONCE)
        assert refused.value.reason == "evidence_without_policy"
    finally:
        v.close()


def test_a_development_policy_takes_the_software_attester_only_under_a_pinned_key():
    software = SoftwareAttester()
    pinned = _verifier(AttestationPolicy.development(), keys=(software.public_key.public_bytes_raw(),))
    unpinned = _verifier(AttestationPolicy.development())
    try:
        assert pinned.verify(_entry(software), expected_nonce=NONCE).attestation_kind == "software"
        with pytest.raises(NodeRefused) as refused:
            unpinned.verify(_entry(software), expected_nonce=NONCE)
        assert refused.value.reason == "untrusted_key"
    finally:
        pinned.close()
        unpinned.close()


@pytest.mark.parametrize(
    "reason, split",
    [
        ("software_attester_refused", ("none", "none", "software_attester_refused")),
        ("snp:report-data", ("snp", "report-data", "report_failed")),
        ("tdx:tcb-status:not_run", ("tdx", "tcb-status", "check_not_run")),
        ("nvidia:malformed", ("nvidia", "none", "report_malformed")),
        ("snp:no_trust_anchor", ("snp", "none", "no_trust_anchor")),
    ],
)
def test_refusal_reasons_split_into_event_fields(reason, split):
    assert _split_reason(reason) == split


def test_a_report_of_another_runtime_policy_is_refused_with_its_check_named(policy, chains, tmp_path, caplog):
    """A node whose SEV-SNP HOST_DATA is not an allowed runtime policy's is refused, and the event
    names the check (not "other")."""
    caplog.set_level(logging.INFO, logger="traceless.events")
    v = _verifier(replace(policy, host_data=frozenset({b"\x01" * 32})))
    try:
        with pytest.raises(NodeRefused):
            v.verify(_entry(hardware_attester(tmp_path / "tsm", *chains)), expected_nonce=NONCE)
    finally:
        v.close()
    refusals = [r.getMessage() for r in caplog.records if '"client.evidence_refused"' in r.getMessage()]
    assert len(refusals) == 1 and '"check":"host-data"' in refusals[0] and '"kind":"snp"' in refusals[0], refusals
    assert '"reason":"report_failed"' in refusals[0]


def test_the_event_schema_knows_every_check_and_kind():
    every_check = set(snp.CHECKS) | set(tdx.CHECKS) | set(nvidia.CHECKS) | set(RUNTIME_POLICY_CHECKS)
    assert every_check | {"none"} == events.EVIDENCE_CHECK.values
    assert {"software", "snp", "tdx", "nvidia", "snp+nvidia", "tdx+nvidia"} == events.ATTESTATION_KIND.values
