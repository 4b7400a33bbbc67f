"""The gateway under an evidence policy: a hardware node is admitted on evidence that vouches for the
key it registers, every nonce-bound listing carries a document made for the nonce by the key its
evidence (collected once, over a base document) vouches for, evidence is never accepted
unchecked, malformed evidence is a 400 that echoes nothing, and the listing's size is capped."""

from __future__ import annotations

import base64
import time

import httpx
import pytest

from tests.privacy.attestation.fake_hardware import hardware_attester, write_policy_file
from tests.privacy.attestation.forge import make_amd_chain
from tests.support.cluster_services import RELEASE, FakeNode, StubReleases, running_app
from traceless.node.attestation_route import attestation_app
from traceless.node.identity import NodeIdentity
from traceless.node.keyring import KeyRing
from traceless.node.registration import registration_body
from traceless.node.settings import NodeSettings
from traceless.privacy.attestation.evidence_policy import AttestationPolicy, PolicyRefusedError, check_evidence
from traceless.privacy.attestation.hardware import MAX_EVIDENCE_ITEMS, evidence_from_json
from traceless.privacy.attestation.policy_file import load_policy_file
from traceless.privacy.attestation.vouched import verify_with_base
from traceless_tools.cluster.gateway import GatewayConfig, capped_listing, create_gateway_app


@pytest.fixture(scope="module")
def amd():
    return make_amd_chain()


@pytest.fixture(scope="module")
def policy(amd, tmp_path_factory) -> AttestationPolicy:
    return load_policy_file(write_policy_file(tmp_path_factory.mktemp("policy"), amd, None))


class HardwareNode:
    """The node's attestation route (node/attestation_route.py, as node/app.py serves it) without an
    engine: enough for registration, health checks and nonce-bound listings."""

    def __init__(self, identity: NodeIdentity) -> None:
        self.identity = identity
        self.app = attestation_app(identity)


@pytest.fixture
def hardware_node(amd, tmp_path):
    identity = NodeIdentity(hardware_attester(tmp_path / "tsm", amd, None), RELEASE.measurement, keys=KeyRing())
    node = HardwareNode(identity)
    with running_app(node.app) as url:
        identity.node_url = url
        yield node


def _gateway(policy: AttestationPolicy | None, **overrides):
    return create_gateway_app(
        GatewayConfig(privacy=False, health_interval_s=3600, evidence_policy=policy, **overrides),
        releases=StubReleases(RELEASE),
    )


def _body(node: HardwareNode) -> dict:
    return registration_body(node.identity, NodeSettings("m"))


def test_a_hardware_node_is_admitted_and_listed_with_a_fresh_document_for_each_nonce(policy, hardware_node):
    with running_app(_gateway(policy)) as url:
        registered = httpx.post(url + "/pcc/v1/register", json=_body(hardware_node))
        assert registered.status_code == 200, registered.text
        nonce = bytes(range(16))
        (entry,) = httpx.get(url + "/pcc/v1/nodes", params={"model": "m", "nonce": nonce.hex()}).json()["nodes"]
        (plain,) = httpx.get(url + "/pcc/v1/nodes", params={"model": "m"}).json()["nodes"]
    # The evidence binds the base document (collected once, at registration), whose key signed the
    # document made for this nonce, restating the base's claims.
    evidence = evidence_from_json(entry["evidence"])
    verdict = check_evidence(policy, entry["base_attestation"], evidence)
    claims = verify_with_base(
        entry["attestation"],
        entry["base_attestation"],
        verdict.keys,
        time.time(),
        nonce,
        ohttp_keys=base64.b64decode(entry["ohttp_keys"]),
    )
    assert verdict.kind == "snp" and claims.attester_type == "hardware" and claims.eat_nonce == nonce
    with pytest.raises(PolicyRefusedError):  # it binds the base, not the fresh document
        check_evidence(policy, entry["attestation"], evidence)
    assert plain["evidence"] == entry["evidence"] and plain["base_attestation"] == entry["base_attestation"]
    assert plain["attestation"] != entry["attestation"]  # the registration's own document
    assert hardware_node.identity.evidence_cache.collections == 1


def test_evidence_that_vouches_for_another_key_than_the_registered_one_is_refused(policy, hardware_node):
    other = FakeNode()
    body = {**_body(hardware_node), "attester_key": other.attester_key_b64}
    with running_app(_gateway(policy)) as url:
        r = httpx.post(url + "/pcc/v1/register", json=body)
    assert r.status_code == 403 and r.json()["error"]["code"] == "evidence_refused"
    assert "another key than the registered attester key" in r.json()["error"]["message"]


def test_a_gateway_without_an_evidence_policy_refuses_evidence_rather_than_ignore_it(hardware_node):
    from traceless.privacy.attestation.policy import AttesterPolicy

    with running_app(_gateway(None, attester_policy=AttesterPolicy.DEVELOPMENT)) as url:
        r = httpx.post(url + "/pcc/v1/register", json=_body(hardware_node))
    assert r.status_code == 403 and r.json()["error"]["code"] == "evidence_refused"
    assert "--evidence-policy" in r.json()["error"]["message"]


def test_the_software_attester_under_a_development_evidence_policy_needs_a_pinned_key_when_keys_are_pinned():
    node, pinned = FakeNode(), FakeNode()
    with running_app(node.app) as node_url:
        gateway = _gateway(
            AttestationPolicy.development(), trusted_attester_keys=(base64.b64decode(pinned.attester_key_b64),)
        )
        with running_app(gateway) as url:
            r = httpx.post(url + "/pcc/v1/register", json=node.registration(node_url))
            assert r.status_code == 403 and r.json()["error"]["code"] == "attestation_refused"
        with running_app(_gateway(AttestationPolicy.development())) as url:  # no pinned keys: proof of possession
            assert httpx.post(url + "/pcc/v1/register", json=node.registration(node_url)).status_code == 200


@pytest.mark.parametrize(
    "evidence",
    [
        [{"kind": "sgx-secret-kind", "blob": "AA=="}],
        [{"kind": "snp", "blob": "not base64!"}],
        [{"kind": "snp", "blob": "AA==", "note": "hello"}],
        [{"kind": "snp", "blob": "AA=="}] * (MAX_EVIDENCE_ITEMS + 1),
        {"kind": "snp"},
    ],
)
def test_malformed_evidence_is_a_400_that_echoes_nothing(policy, evidence):
    node = FakeNode()
    with running_app(_gateway(policy)) as url:
        body = {**node.registration(url), "evidence": evidence}
        r = httpx.post(url + "/pcc/v1/register", json=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_registration"
    assert "evidence" in r.json()["error"]["message"]
    assert not any(word in r.text for word in ("sgx-secret-kind", "hello", "note", "not base64!"))


def test_the_listing_keeps_the_drawn_order_up_to_its_byte_cap():
    def entry(i: int, size: int) -> dict:
        return {
            "node_id": str(i),
            "attestation": "a" * size,
            "ohttp_keys": "k",
            "evidence": [{"kind": "snp", "blob": "b" * size, "aux": "", "provider": "p"}],
        }

    listed = [entry(i, 100) for i in range(10)]
    per_entry = 1 + 100 + 1 + (3 + 100 + 0 + 1)
    assert capped_listing(listed, 10 * per_entry) == listed
    assert capped_listing(listed, 3 * per_entry + 5) == listed[:3]
    assert capped_listing([entry(0, 10_000)], 10) == [entry(0, 10_000)]  # the first entry always


def test_a_base_attestation_without_the_evidence_that_binds_it_is_refused():
    node = FakeNode()
    with running_app(node.app) as node_url, running_app(_gateway(AttestationPolicy.development())) as url:
        body = node.registration(node_url)
        r = httpx.post(url + "/pcc/v1/register", json={**body, "base_attestation": body["attestation"]})
    assert r.status_code == 403 and r.json()["error"]["code"] == "attestation_refused"
    assert "only with the evidence" in r.json()["error"]["message"]
