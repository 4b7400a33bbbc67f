"""The client's attestation policy over hardware evidence that binds the node's document: a node
whose SEV-SNP (and GPU) evidence binds its exact document passes; evidence for another document,
another nonce or another key, a debug guest, an unknown launch measurement, a replayed GPU report,
missing evidence and the software attester under a production policy are each refused with the
reason that names them."""

from __future__ import annotations

import os
import time

import pytest

from tests.privacy.attestation.forge import POLICY_DEBUG, POLICY_DEFAULT, forge_snp_evidence, make_amd_chain
from tests.privacy.attestation.forge_nvidia import GpuTestChain, sample_report
from traceless.privacy.attestation.binding import gpu_nonce, report_data, signing_input
from traceless.privacy.attestation.collectors import Collector, Evidence
from traceless.privacy.attestation.evidence_policy import (
    AttestationPolicy,
    HardwareTrust,
    PolicyRefusedError,
    check_evidence,
)
from traceless.privacy.attestation.hardware import HardwareAttester, document_key
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.snp import SnpPolicy, SnpTrust
from traceless.privacy.attestation.software import NodeStatement, SoftwareAttester, new_claims, verify_attestation

LAUNCH = bytes(range(48))
MEASUREMENT = Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32)
KEY_CONFIG = b"\x00\x01\x00\x20" + os.urandom(32)


class ForgedSnpCollector(Collector):
    """Stands in for configfs-tsm: an SNP report (test AMD chain) carrying the given REPORT_DATA."""

    def __init__(self, chain, measurement: bytes = LAUNCH, **fields) -> None:
        self.chain, self.measurement, self.fields = chain, measurement, fields

    def collect(self, report_data: bytes) -> Evidence:
        forged = forge_snp_evidence(report_data, self.measurement, chain=self.chain, **self.fields)
        return Evidence("snp", forged.evidence.report, forged.auxblob, "test")


class ForgedGpuCollector(Collector):
    def __init__(self, chain: GpuTestChain) -> None:
        self.chain = chain

    def collect(self, report_data: bytes) -> Evidence:
        ev = self.chain.evidence(report_data)
        return Evidence("nvidia", ev.report, ev.cert_chain, "test")


@pytest.fixture(scope="module")
def amd():
    return make_amd_chain()


@pytest.fixture(scope="module")
def gpu():
    return GpuTestChain()


def _policy(amd, gpu=None, **kw) -> AttestationPolicy:
    trust = HardwareTrust(snp=SnpTrust(arks=(amd.ark,)), nvidia=gpu.trust if gpu else None)
    return AttestationPolicy(
        "test",
        cpu=frozenset({"snp"}),
        gpu=gpu is not None,
        trust=trust,
        snp=SnpPolicy(measurements=frozenset({LAUNCH})),
        **kw,
    )


def _document(attester, nonce: bytes = b"n" * 16) -> str:
    claims = new_claims(NodeStatement(MEASUREMENT, KEY_CONFIG), nonce, int(time.time()), attester.attester_type)
    return attester.attest(claims)


def test_binding_values_differ_and_depend_on_every_byte_of_the_signing_input():
    doc = _document(SoftwareAttester())
    si = signing_input(doc)
    assert len(report_data(si)) == 64 and len(gpu_nonce(si)) == 32
    assert report_data(si)[:32] != gpu_nonce(si)
    assert report_data(si[:-1] + bytes([si[-1] ^ 1])) != report_data(si)
    with pytest.raises(ValueError):
        signing_input("not-a-jws")


def test_snp_and_gpu_evidence_binding_the_document_pass_and_the_document_verifies(amd, gpu):
    attester = HardwareAttester(cpu=ForgedSnpCollector(amd), gpus=(ForgedGpuCollector(gpu),))
    doc = _document(attester)
    verdict = check_evidence(_policy(amd, gpu), doc, attester.evidence(doc))
    assert verdict.kind == "snp+nvidia" and verdict.attester_type == "hardware"
    assert [r.kind for r in verdict.results] == ["snp", "nvidia"] and all(r.ok for r in verdict.results)
    assert verdict.results[0].claims.report_data == report_data(signing_input(doc))
    assert verdict.results[0].claims.measurement == LAUNCH
    claims = verify_attestation(doc, verdict.keys, time.time(), ohttp_keys=KEY_CONFIG)
    assert claims.measurement == MEASUREMENT and claims.attester_type == "hardware"
    assert verdict.keys == (document_key(doc),) and document_key(doc) == attester.public_key


def test_evidence_for_another_document_is_refused_at_report_data(amd):
    attester = HardwareAttester(cpu=ForgedSnpCollector(amd))
    first, second = _document(attester, b"a" * 16), _document(attester, b"b" * 16)
    with pytest.raises(PolicyRefusedError) as e:
        check_evidence(_policy(amd), second, attester.evidence(first))
    assert e.value.reason == "snp:report-data"


def test_evidence_replayed_under_another_key_is_refused(amd):
    honest, thief = HardwareAttester(cpu=ForgedSnpCollector(amd)), HardwareAttester(cpu=ForgedSnpCollector(amd))
    doc = _document(honest)
    stolen = honest.evidence(doc)
    with pytest.raises(PolicyRefusedError) as e:
        check_evidence(_policy(amd), _document(thief), stolen)
    assert e.value.reason == "snp:report-data"


@pytest.mark.parametrize(
    "collector_kw, reason",
    [
        ({"measurement": bytes(48)}, "snp:measurement"),
        ({"policy": POLICY_DEFAULT | POLICY_DEBUG}, "snp:guest-policy"),
    ],
)
def test_unknown_launch_measurement_or_debug_guest_is_refused(amd, collector_kw, reason):
    attester = HardwareAttester(cpu=ForgedSnpCollector(amd, **collector_kw))
    doc = _document(attester)
    with pytest.raises(PolicyRefusedError) as e:
        check_evidence(_policy(amd), doc, attester.evidence(doc))
    assert e.value.reason == reason


def test_replayed_real_gpu_report_is_refused_at_the_nonce(amd, gpu):
    attester = HardwareAttester(cpu=ForgedSnpCollector(amd))
    doc = _document(attester)
    replayed = Evidence("nvidia", sample_report(), gpu.pem_chain, "replay")
    with pytest.raises(PolicyRefusedError) as e:
        check_evidence(_policy(amd, gpu), doc, (*attester.evidence(doc), replayed))
    assert e.value.reason in {"nvidia:report-signature", "nvidia:nonce"}


def test_missing_or_unaccepted_evidence_is_refused(amd, gpu):
    cpu_only = HardwareAttester(cpu=ForgedSnpCollector(amd))
    doc = _document(cpu_only)
    with pytest.raises(PolicyRefusedError) as e:
        check_evidence(_policy(amd, gpu), doc, cpu_only.evidence(doc))
    assert e.value.reason == "gpu_evidence_missing"
    gpu_only = HardwareAttester(cpu=None, gpus=(ForgedGpuCollector(gpu),))
    doc = _document(gpu_only)
    with pytest.raises(PolicyRefusedError) as e:
        check_evidence(_policy(amd, gpu), doc, gpu_only.evidence(doc))
    assert e.value.reason == "cpu_evidence_missing"
    both = HardwareAttester(cpu=ForgedSnpCollector(amd), gpus=(ForgedGpuCollector(gpu),))
    doc = _document(both)
    with pytest.raises(PolicyRefusedError) as e:
        check_evidence(_policy(amd), doc, both.evidence(doc))
    assert e.value.reason == "gpu_evidence_not_required"


def test_software_attester_only_under_the_development_policy(amd):
    software = SoftwareAttester()
    doc = _document(software)
    with pytest.raises(PolicyRefusedError) as e:
        check_evidence(_policy(amd), doc, ())
    assert e.value.reason == "software_attester_refused"
    verdict = check_evidence(AttestationPolicy.development(), doc, (), (software.public_key,))
    assert verdict.kind == "software" and verdict.attester_type == "software"
    assert verify_attestation(doc, verdict.keys, time.time()).attester_type == "software"


def test_a_policy_must_name_what_it_trusts():
    with pytest.raises(ValueError, match="software attester explicitly"):
        AttestationPolicy("empty")
    with pytest.raises(ValueError, match="launch measurements"):
        AttestationPolicy("snp", cpu=frozenset({"snp"}))
    with pytest.raises(ValueError, match="NVIDIA"):
        AttestationPolicy("gpu", gpu=True)
