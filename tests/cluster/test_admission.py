"""Threat T14 (docs/threat-model.md): capacity is attested, not announced. The gateway admits a node only with an
attestation that verifies, whose measurement is a logged release allowing the claimed capacity,
keeps one record per attestation key, caps the registry, and lets no one else replace a node."""

import time

import httpx
import pytest

from tests.support.cluster_services import RELEASE, FakeNode, StubReleases, running_app
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.policy import AttesterPolicy
from traceless_tools.cluster.gateway import GatewayConfig, create_gateway_app


def _gateway(**overrides):
    settings = dict(privacy=False, health_interval_s=3600, attester_policy=AttesterPolicy.DEVELOPMENT)
    settings.update(overrides)
    return create_gateway_app(GatewayConfig(**settings), releases=StubReleases(RELEASE))


@pytest.fixture
def gateway():
    app = _gateway()
    with running_app(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        yield app, http


@pytest.fixture
def node():
    fake = FakeNode()
    with running_app(fake.app) as url:
        fake.url = url
        yield fake


def _listed(http, k=100):
    return http.get("/pcc/v1/nodes", params={"model": "m", "k": k}).json()["nodes"]


def test_a_capacity_no_logged_release_allows_is_refused(gateway, node):
    app, http = gateway
    inflated = http.post("/pcc/v1/register", json=node.registration(node.url, capacity=1_000_000))
    assert inflated.status_code == 403
    assert inflated.json()["error"]["code"] == "capacity_not_allowed"
    assert "capacit" in inflated.json()["error"]["message"] and "1000000" not in inflated.text
    assert len(app.state.gateway.registry) == 0
    ok = http.post("/pcc/v1/register", json=node.registration(node.url, capacity=5))
    assert ok.status_code == 200, ok.text
    assert app.state.gateway.registry.get(ok.json()["node_id"]).capacity == 5


def test_an_announced_capacity_is_not_a_field(gateway, node):
    _, http = gateway
    body = {**node.registration(node.url, capacity=1), "capacity": 10**9}
    response = http.post("/pcc/v1/register", json=body)
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_registration"


def test_unlogged_release_untrusted_or_unbound_attestations_are_refused(gateway, node):
    app, http = gateway
    rogue = FakeNode(Measurement(b"\x09" * 32, b"\x02" * 32, b"\x03" * 32))
    r = http.post("/pcc/v1/register", json=rogue.registration(node.url))
    assert r.status_code == 403 and r.json()["error"]["code"] == "release_not_logged"
    body = node.registration(node.url)
    body["attester_key"] = FakeNode().attester_key_b64  # the document is not signed by the presented key
    r = http.post("/pcc/v1/register", json=body)
    assert r.status_code == 403 and r.json()["error"]["code"] == "attestation_refused"
    body = node.registration(node.url)
    body["url"] = "http://elsewhere.invalid"  # not the URL the attestation binds
    r = http.post("/pcc/v1/register", json=body)
    assert r.status_code == 403 and r.json()["error"]["code"] == "attestation_refused"
    body = node.registration(node.url)
    body["ohttp_keys"] = FakeNode().ohttp_keys_b64  # not the keys the attestation binds
    assert http.post("/pcc/v1/register", json=body).status_code == 403
    old = node.registration(node.url, now=time.time() - 3600)  # an old document replayed
    r = http.post("/pcc/v1/register", json=old)
    assert r.status_code == 403 and r.json()["error"]["code"] == "attestation_refused"
    assert len(app.state.gateway.registry) == 0


def test_production_policy_refuses_the_software_attester(node):
    app = _gateway(attester_policy=AttesterPolicy.PRODUCTION)
    with running_app(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        r = http.post("/pcc/v1/register", json=node.registration(node.url))
        assert r.status_code == 403 and "development" in r.json()["error"]["message"]
        pinned = _gateway(trusted_attester_keys=(FakeNode().attester.public_key.public_bytes_raw(),))
        with running_app(pinned) as url2, httpx.Client(base_url=url2, timeout=10) as http2:
            assert http2.post("/pcc/v1/register", json=node.registration(node.url)).status_code == 403


def test_one_record_per_attestation_key_whatever_the_url(gateway, node):
    app, http = gateway
    base = node.url
    ids = {
        http.post("/pcc/v1/register", json=node.registration(f"{base}/{path}")).json()["node_id"]
        for path in ("a", "b", "c")
    }
    assert len(ids) == 1 and len(app.state.gateway.registry) == 1
    (record,) = app.state.gateway.registry.records()
    assert record.registration.url == f"{base}/c"


def test_no_one_but_the_key_holder_replaces_a_node(gateway, node):
    app, http = gateway
    honest_id = http.post("/pcc/v1/register", json=node.registration(node.url, capacity=1)).json()["node_id"]
    attacker = FakeNode()
    # Same URL, the attacker's key: a record of its own, the honest one untouched.
    hijack = http.post("/pcc/v1/register", json=attacker.registration(node.url, capacity=5))
    assert hijack.status_code == 200 and hijack.json()["node_id"] != honest_id
    honest = app.state.gateway.registry.get(honest_id)
    assert honest.registration.ohttp_keys == node.ohttp_keys_b64 and honest.capacity == 1
    # The honest node's own earlier document, replayed to move it: older than what is held.
    earlier = node.registration("http://attacker.invalid", now=time.time() - 30)
    newer = node.registration(node.url)
    assert http.post("/pcc/v1/register", json=newer).status_code == 200
    stale = http.post("/pcc/v1/register", json=earlier)
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_registration"
    assert app.state.gateway.registry.get(honest_id).registration.url == node.url


def test_the_registry_is_capped():
    app = _gateway(max_nodes=2)
    with running_app(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        nodes = [FakeNode() for _ in range(3)]
        statuses = [
            http.post("/pcc/v1/register", json=n.registration(f"http://n{i}.invalid")).status_code
            for i, n in enumerate(nodes)
        ]
        assert statuses == [200, 200, 503]
        assert len(app.state.gateway.registry) == 2
        # a known key still re-registers when the registry is full
        assert http.post("/pcc/v1/register", json=nodes[0].registration("http://n0.invalid")).status_code == 200


def test_listing_carries_no_announced_capacity(gateway, node):
    _, http = gateway
    http.post("/pcc/v1/register", json=node.registration(node.url, capacity=3))
    (entry,) = _listed(http)
    assert set(entry) == {"node_id", "attestation", "ohttp_keys"}


def test_candidates_with_a_client_nonce_come_back_freshly_attested(gateway, node):
    from traceless.privacy.attestation.software import verify_attestation

    _, http = gateway
    http.post("/pcc/v1/register", json=node.registration(node.url, capacity=2))
    nonce = bytes(range(16))
    (entry,) = http.get("/pcc/v1/nodes", params={"model": "m", "k": 5, "nonce": nonce.hex()}).json()["nodes"]
    claims = verify_attestation(entry["attestation"], [node.attester.public_key], time.time(), nonce)
    assert claims.capacity == 2 and claims.node_url == node.url
    for bad in ("zz", "00" * 4, "00" * 65):
        r = http.get("/pcc/v1/nodes", params={"model": "m", "nonce": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "nonce"
    node.healthy = False  # a node that cannot attest now is not offered
    assert http.get("/pcc/v1/nodes", params={"model": "m", "nonce": nonce.hex()}).status_code == 404
