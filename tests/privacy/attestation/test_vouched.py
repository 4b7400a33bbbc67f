"""A fresh document over a base document: valid only by the base's key, restating its claims, with the
base itself valid now and bound to the same OHTTP keys."""

from __future__ import annotations

import time

import pytest

from traceless.privacy.attestation.hardware import HardwareAttester
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.software import (
    AttestationExpiredError,
    NodeStatement,
    NonceMismatchError,
    OhttpKeyMismatchError,
    UntrustedKeyError,
    new_claims,
)
from traceless.privacy.attestation.vouched import BaseMismatchError, evidence_bound, verify_with_base
from traceless.privacy.ohttp.gateway import OhttpServer

MEASUREMENT = Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32)
KEYS = OhttpServer(key_id=1).ohttp_keys()
STATEMENT = NodeStatement(MEASUREMENT, KEYS, 2, "http://node.test")
NONCE = b"n" * 16


class _NoCpu:
    def collect(self, report_data: bytes):  # never called: these tests make no evidence
        raise AssertionError


def _attester() -> HardwareAttester:
    return HardwareAttester(_NoCpu())  # type: ignore[arg-type]


def _doc(
    attester: HardwareAttester,
    statement: NodeStatement = STATEMENT,
    nonce: bytes = b"b" * 16,
    now: float | None = None,
    ttl_s: int = 300,
) -> str:
    now = time.time() if now is None else now
    return attester.attest(new_claims(statement, nonce, int(now), attester.attester_type, ttl_s))


def test_a_fresh_document_by_the_base_key_restating_it_verifies():
    node = _attester()
    base, fresh = _doc(node, ttl_s=3600), _doc(node, nonce=NONCE)
    claims = verify_with_base(fresh, base, [node.public_key], time.time(), NONCE, ohttp_keys=KEYS)
    assert claims.eat_nonce == NONCE and claims.capacity == 2
    assert evidence_bound(fresh, base) == base and evidence_bound(fresh, None) == fresh
    with pytest.raises(NonceMismatchError):  # the nonce is checked on the fresh one, not the base
        verify_with_base(fresh, base, [node.public_key], time.time(), b"x" * 16, ohttp_keys=KEYS)


@pytest.mark.parametrize(
    "change",
    [
        {"capacity": 3},
        {"node_url": "http://elsewhere.test"},
        {"measurement": Measurement(b"\x09" * 32, b"\x02" * 32, b"\x03" * 32)},
    ],
)
def test_a_fresh_document_that_states_anything_else_is_refused(change):
    from dataclasses import replace

    node = _attester()
    base, fresh = _doc(node), _doc(node, replace(STATEMENT, **change), nonce=NONCE)
    with pytest.raises(BaseMismatchError):
        verify_with_base(fresh, base, [node.public_key], time.time(), NONCE, ohttp_keys=KEYS)


def test_a_fresh_document_by_another_key_is_refused_even_when_both_keys_are_trusted():
    node, other = _attester(), _attester()
    base, fresh = _doc(node), _doc(other, nonce=NONCE)
    with pytest.raises(UntrustedKeyError):  # the key the evidence vouches for is the only one trusted
        verify_with_base(fresh, base, [node.public_key], time.time(), NONCE, ohttp_keys=KEYS)
    with pytest.raises(BaseMismatchError):
        verify_with_base(fresh, base, [node.public_key, other.public_key], time.time(), NONCE, ohttp_keys=KEYS)


def test_the_base_must_be_valid_now_and_bind_the_same_keys():
    node = _attester()
    now = time.time()
    expired = _doc(node, now=now - 1000, ttl_s=600)
    with pytest.raises(AttestationExpiredError):
        verify_with_base(_doc(node, nonce=NONCE), expired, [node.public_key], now, NONCE, ohttp_keys=KEYS)
    other_keys = NodeStatement(MEASUREMENT, OhttpServer(key_id=2).ohttp_keys(), 2, "http://node.test")
    with pytest.raises(OhttpKeyMismatchError):
        verify_with_base(
            _doc(node, nonce=NONCE), _doc(node, other_keys), [node.public_key], now, NONCE, ohttp_keys=KEYS
        )
