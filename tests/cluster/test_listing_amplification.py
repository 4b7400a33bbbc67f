"""Anonymous amplification: a nonce-bound listing (`GET /pcc/v1/nodes?nonce=`) makes every listed node
sign a document for that nonce. Without a token it makes no node do anything; with one, each node
signs one document and collects no evidence: the evidence it collected once for its key set (over
its base document) vouches for the key that signs every fresh document."""

from __future__ import annotations

import os

import httpx
import pytest

from tests.privacy.attestation.fake_hardware import SnpGuestConfigFs, write_policy_file
from tests.privacy.attestation.forge import make_amd_chain
from tests.support.cluster_services import RELEASE, StubReleases, mint_tokens, running_app
from traceless.node.attestation_route import attestation_app
from traceless.node.identity import NodeIdentity
from traceless.node.registration import registration_body
from traceless.node.settings import NodeSettings
from traceless.privacy.attestation.hardware import HardwareAttester
from traceless.privacy.attestation.policy_file import load_policy_file
from traceless.privacy.attestation.tsm import TsmCollector
from traceless.privacy.privacypass import protocol as privacypass
from traceless_tools.client.node_verifier import NodeVerifier
from traceless_tools.client.private_client import ClientConfig
from traceless_tools.cluster.gateway import GatewayConfig, create_gateway_app

LISTINGS = 6


@pytest.fixture(scope="module")
def amd():
    return make_amd_chain()


@pytest.fixture(scope="module")
def policy(amd, tmp_path_factory):
    return load_policy_file(write_policy_file(tmp_path_factory.mktemp("policy"), amd, None))


class CountingNode:
    """A hardware node's attestation route (the node's own code) whose CPU counts the reports it makes
    and whose attester counts the documents it signs."""

    def __init__(self, amd, tsm_root) -> None:
        tsm_root.mkdir(parents=True, exist_ok=True)
        self.cpu = SnpGuestConfigFs(amd)
        attester = HardwareAttester(TsmCollector(tsm_root, configfs=self.cpu))
        self.signed = 0
        sign = attester.attest

        def counting(claims):
            self.signed += 1
            return sign(claims)

        attester.attest = counting  # type: ignore[method-assign]
        self.identity = NodeIdentity(attester, RELEASE.measurement)
        self.app = attestation_app(self.identity)

    @property
    def work(self) -> tuple[int, int]:
        """(evidence collections, documents signed) so far."""
        return self.cpu.reports, self.signed


@pytest.fixture
def cluster(amd, policy, tmp_path):
    """A gateway with the token check on, under the test evidence policy, and one registered node."""
    issuer = privacypass.Issuer.generate()
    node = CountingNode(amd, tmp_path / "tsm")
    config = GatewayConfig(issuer_url="http://issuer.test", health_interval_s=3600, evidence_policy=policy)
    with (
        running_app(node.app) as node_url,
        running_app(create_gateway_app(config, [issuer.public_key], releases=StubReleases(RELEASE))) as url,
    ):
        node.identity.node_url = node_url
        registered = httpx.post(url + "/pcc/v1/register", json=registration_body(node.identity, NodeSettings("m")))
        assert registered.status_code == 200, registered.text
        yield node, url, issuer


def _listing(url: str, nonce: bytes, authorization: str | None = None) -> httpx.Response:
    headers = {"authorization": authorization} if authorization else {}
    return httpx.get(url + "/pcc/v1/nodes", params={"model": "m", "nonce": nonce.hex()}, headers=headers, timeout=30)


def test_anonymous_nonce_listings_make_no_node_work(cluster):
    node, url, _ = cluster
    before = node.work
    for _ in range(LISTINGS):
        r = _listing(url, os.urandom(16))
        assert r.status_code == 401 and r.json()["error"]["code"] == "token_required"
        assert r.headers["www-authenticate"].startswith("PrivateToken ")
    assert node.work == before  # no evidence collected, no document signed
    # A listing without a nonce asks no node for anything and stays open (the registered documents).
    assert httpx.get(url + "/pcc/v1/nodes", params={"model": "m"}).status_code == 200
    assert node.work == before


def test_a_tokened_listing_costs_each_node_one_signature_and_no_evidence(cluster, policy):
    node, url, issuer = cluster
    challenge = httpx.get(url + "/pcc/v1/challenge").headers["www-authenticate"]
    tokens = mint_tokens(issuer, challenge, LISTINGS)
    collections, signed = node.work
    verifier = NodeVerifier(
        ClientConfig("http://i", "k", "http://r", "http://127.0.0.1:9", b"\x00" * 32, (), "m", evidence_policy=policy),
        releases=StubReleases(RELEASE),
    )
    try:
        for token in tokens:
            nonce = os.urandom(16)
            r = _listing(url, nonce, token)
            assert r.status_code == 200, r.text
            (verified,) = verifier.verify_all(r.json()["nodes"], nonce)  # made for this nonce, evidence checked
            assert verified.attestation_kind == "snp"
    finally:
        verifier.close()
    assert node.work == (collections, signed + LISTINGS)  # the registration's evidence serves every listing
    replayed = _listing(url, os.urandom(16), tokens[0])
    assert replayed.status_code == 403 and replayed.json()["error"]["code"] == "token_replayed"
    assert node.work == (collections, signed + LISTINGS)
