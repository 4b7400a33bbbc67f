"""The hardware attester's document carries its own key (bound by evidence, never trusted alone),
and evidence travels as strict, bounded JSON."""

from __future__ import annotations

import base64
import json
import time

import pytest

from traceless.privacy.attestation.collectors import Collector, Evidence, NoTsmError
from traceless.privacy.attestation.hardware import (
    MAX_EVIDENCE_ITEMS,
    HardwareAttester,
    document_key,
    evidence_from_json,
    evidence_to_json,
)
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.software import (
    MalformedAttestationError,
    NodeStatement,
    SoftwareAttester,
    b64url_decode,
    b64url_encode,
    new_claims,
)

STATEMENT = NodeStatement(Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32), b"cfg")
CLAIMS = new_claims(STATEMENT, b"n" * 16, int(time.time()), "hardware")


class Recording(Collector):
    def __init__(self) -> None:
        self.seen: list[bytes] = []

    def collect(self, report_data: bytes) -> Evidence:
        self.seen.append(report_data)
        return Evidence("snp", b"report", b"certs", "test")


class Missing(Collector):
    def collect(self, report_data: bytes) -> Evidence:
        raise NoTsmError("no configfs-tsm report interface")


def test_document_carries_the_attesters_key_and_kid():
    attester = HardwareAttester(cpu=Recording())
    doc = attester.attest(CLAIMS)
    assert document_key(doc) == attester.public_key


def test_a_header_key_that_does_not_match_its_kid_is_malformed():
    doc = HardwareAttester(cpu=Recording()).attest(CLAIMS)
    other = HardwareAttester(cpu=Recording()).attest(CLAIMS)
    header = json.loads(b64url_decode(doc.split(".")[0]))
    header["kid"] = json.loads(b64url_decode(other.split(".")[0]))["kid"]
    forged = ".".join([b64url_encode(json.dumps(header).encode()), *doc.split(".")[1:]])
    with pytest.raises(MalformedAttestationError):
        document_key(forged)
    with pytest.raises(MalformedAttestationError):
        document_key(SoftwareAttester().attest(new_claims(STATEMENT, b"n" * 16, int(time.time()), "software")))


def test_evidence_is_collected_for_the_documents_binding_and_fails_loudly_without_hardware():
    cpu = Recording()
    attester = HardwareAttester(cpu=cpu)
    doc = attester.attest(CLAIMS)
    (item,) = attester.evidence(doc)
    assert item.kind == "snp" and len(cpu.seen) == 1 and len(cpu.seen[0]) == 64
    with pytest.raises(NoTsmError):
        HardwareAttester(cpu=Missing()).evidence(doc)
    with pytest.raises(ValueError):
        HardwareAttester(cpu=None)
    with pytest.raises(ValueError):
        attester.attest(new_claims(STATEMENT, b"n" * 16, int(time.time()), "software"))


def test_evidence_json_round_trips_and_rejects_anything_else():
    item = Evidence("nvidia", b"\x00report", b"pem", "nvml")
    assert evidence_from_json([evidence_to_json(item)]) == (item,)
    good = evidence_to_json(item)
    bad = [
        "not a list",
        [good] * (MAX_EVIDENCE_ITEMS + 1),
        [{**good, "kind": "sgx"}],
        [{**good, "extra": 1}],
        [{**good, "blob": "!!"}],
        [{**good, "blob": ""}],
        [{**good, "provider": "x" * 65}],
        [{**good, "blob": base64.b64encode(bytes(64 * 1024 + 3)).decode()}],
    ]
    for value in bad:
        with pytest.raises(MalformedAttestationError):
            evidence_from_json(value)
