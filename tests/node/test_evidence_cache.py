"""A hardware node collects evidence once per OHTTP key set (over a base document) and at most once
per collection interval, whoever asks and however often; each nonce gets a fresh document by the key
the evidence vouches for."""

from __future__ import annotations

import threading

import pytest

from tests.support.cluster_services import RELEASE
from traceless.node.evidence_cache import EvidenceLimits, EvidenceRateLimitedError
from traceless.node.identity import NodeIdentity
from traceless.node.keyring import KeyRing
from traceless.privacy.attestation.collectors import Collector, CollectorError, Evidence
from traceless.privacy.attestation.hardware import HardwareAttester
from traceless.privacy.attestation.software import AttestationClaims, b64url_decode, document_kid

ROTATION_S, OVERLAP_S, TTL_S = 1000.0, 300.0, 300


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


class CountingCpu(Collector):
    """A CPU report stand-in: remembers what each collection bound; fails while `broken`."""

    def __init__(self) -> None:
        self.bound: list[bytes] = []
        self.broken = False
        self.gate: threading.Event | None = None  # a collection waits for it when set

    def collect(self, report_data: bytes) -> Evidence:
        if self.gate is not None:
            self.gate.wait(5)
        if self.broken:
            raise CollectorError("the TEE interface went away")
        self.bound.append(report_data)
        return Evidence(kind="snp", blob=b"report:" + report_data, aux=b"", provider="test")


def _node(limits: EvidenceLimits = EvidenceLimits()) -> tuple[NodeIdentity, CountingCpu, Clock]:
    clock, cpu = Clock(), CountingCpu()
    keys = KeyRing(ROTATION_S, OVERLAP_S, clock=clock)
    return (
        NodeIdentity(HardwareAttester(cpu), RELEASE.measurement, keys=keys, evidence_limits=limits, clock=clock),
        cpu,
        clock,
    )


def _claims(document: str) -> AttestationClaims:
    import json

    return AttestationClaims.from_json(json.loads(b64url_decode(document.split(".")[1])))


def test_every_nonce_gets_a_fresh_document_over_one_collection():
    identity, cpu, clock = _node()
    made = [identity.attest_now(bytes([i]) * 16, TTL_S) for i in range(20)]
    assert len(cpu.bound) == 1 and identity.evidence_cache.collections == 1
    bases = {m.base for m in made}
    assert len(bases) == 1 and None not in bases
    for i, m in enumerate(made):
        claims = _claims(m.document)
        assert claims.eat_nonce == bytes([i]) * 16 and document_kid(m.document) == document_kid(m.base)
        assert claims.measurement == _claims(m.base).measurement and m.evidence == made[0].evidence
    assert _claims(made[0].base).exp == int(clock.now) + EvidenceLimits().ttl_s


def test_a_key_rotation_and_a_retirement_each_collect_once():
    identity, cpu, clock = _node()
    identity.attest_now(b"a" * 16, TTL_S)
    clock.now += ROTATION_S  # a new key joins the set
    rotated = identity.attest_now(b"b" * 16, TTL_S)
    identity.attest_now(b"c" * 16, TTL_S)
    clock.now += OVERLAP_S  # the old key leaves it
    retired = identity.attest_now(b"d" * 16, TTL_S)
    assert len(cpu.bound) == 3
    assert rotated.ohttp_keys != retired.ohttp_keys and retired.ohttp_keys == identity.ohttp_keys()


def test_a_base_near_its_expiry_is_renewed_before_a_fresh_document_could_outlive_it():
    identity, cpu, clock = _node(EvidenceLimits(ttl_s=900, min_interval_s=60))
    first = identity.attest_now(b"a" * 16, TTL_S)
    clock.now += 900 - TTL_S - 1  # the base has more than TTL_S left: kept
    assert identity.attest_now(b"b" * 16, TTL_S).base == first.base
    clock.now += 2  # less than TTL_S left: renewed
    renewed = identity.attest_now(b"c" * 16, TTL_S)
    assert renewed.base != first.base and len(cpu.bound) == 2
    assert _claims(renewed.document).exp <= _claims(renewed.base).exp


def test_the_cap_answers_from_the_cached_evidence_while_its_newest_key_is_live():
    identity, cpu, clock = _node(EvidenceLimits(min_interval_s=400))
    first = identity.attest_now(b"a" * 16, TTL_S)
    clock.now += ROTATION_S  # a new key: due, and the last collection is old enough
    second = identity.attest_now(b"b" * 16, TTL_S)
    clock.now += OVERLAP_S  # the old key retires 300 s later, inside the 400 s cap
    capped = identity.attest_now(b"c" * 16, TTL_S)
    assert len(cpu.bound) == 2 and capped.base == second.base != first.base
    # The cached base still names the new key (its newest) and binds the keys it was made for.
    assert capped.ohttp_keys == second.ohttp_keys != identity.ohttp_keys()
    assert _claims(capped.document).eat_nonce == b"c" * 16


def test_the_cap_refuses_when_nothing_cached_vouches_for_a_live_key_and_counts_failures():
    identity, cpu, clock = _node(EvidenceLimits(min_interval_s=60))
    cpu.broken = True
    with pytest.raises(CollectorError):
        identity.attest_now(b"a" * 16, TTL_S)
    for _ in range(50):  # an asker hammering a failing collector makes no new attempt
        with pytest.raises(EvidenceRateLimitedError) as capped:
            identity.attest_now(b"a" * 16, TTL_S)
    assert capped.value.retry_after_s == 60 and identity.evidence_cache.collections == 1
    cpu.broken = False
    clock.now += 59
    with pytest.raises(EvidenceRateLimitedError) as capped:
        identity.attest_now(b"a" * 16, TTL_S)
    assert capped.value.retry_after_s == 1
    clock.now += 1
    assert identity.attest_now(b"a" * 16, TTL_S).base is not None and len(cpu.bound) == 1


def test_concurrent_askers_at_a_rotation_wait_for_one_collection():
    identity, cpu, clock = _node()
    cpu.gate = threading.Event()
    results: list[object] = []

    def ask(i: int) -> None:
        try:
            results.append(identity.attest_now(bytes([i]) * 16, TTL_S).base)
        except Exception as exc:  # collected for the assertion below
            results.append(exc)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    cpu.gate.set()
    for t in threads:
        t.join(10)
    assert len(cpu.bound) == 1 and len(results) == 8 and len(set(results)) == 1
    assert isinstance(results[0], str)


def test_limits_are_validated():
    with pytest.raises(ValueError):
        EvidenceLimits(ttl_s=1)
    with pytest.raises(ValueError):
        EvidenceLimits(min_interval_s=-1)
