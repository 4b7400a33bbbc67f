"""The gateway and the relay under slowloris clients, 100 MiB bodies, 500 connections and a flood
of invalid tokens: honest requests keep being served, memory stays bounded (threat T28, docs/threat-model.md).
Figures are printed (pytest -s shows them)."""

import httpx
import pytest

from tests import dos
from tests.support.cluster_services import RELEASE, FakeNode, StubReleases, encrypt_for, mint_tokens
from traceless.http.serve import serve_in_thread
from traceless.privacy.attestation.policy import AttesterPolicy
from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.privacypass import protocol as privacypass
from traceless_tools.cluster.gateway import GatewayConfig, create_gateway_app
from traceless_tools.cluster.relay import RelayConfig, create_relay_app

OHTTP_REQ = {"content-type": "message/ohttp-req"}
INVALID_TOKEN = {**OHTTP_REQ, "authorization": "PrivateToken token=" + "A" * 400}


@pytest.fixture(scope="module")
def issuer():
    return privacypass.Issuer.generate()


@pytest.fixture(scope="module")
def cluster(issuer):
    """(gateway URL, node, node_id, tokens) with the test limits on every hop."""
    node = FakeNode()
    config = GatewayConfig(
        issuer_url="http://issuer.test", health_interval_s=3600, attester_policy=AttesterPolicy.DEVELOPMENT
    )
    gateway = create_gateway_app(config, [issuer.public_key], releases=StubReleases(RELEASE))
    with (
        serve_in_thread(node.app, limits=dos.TEST_LIMITS) as node_url,
        serve_in_thread(gateway, limits=dos.TEST_LIMITS) as gateway_url,
    ):
        node_id = httpx.post(gateway_url + "/pcc/v1/register", json=node.registration(node_url)).json()["node_id"]
        www = httpx.get(gateway_url + "/pcc/v1/challenge").headers["www-authenticate"]
        yield gateway_url, node, node_id, mint_tokens(issuer, www, 40)


def _target(name, url, cluster):
    _, node, node_id, tokens = cluster
    path = f"/pcc/v1/ohttp/{node_id}"

    def honest():
        enc, ctx = encrypt_for(node, b"honest")
        response = httpx.post(url + path, content=enc, headers={**OHTTP_REQ, "authorization": tokens.pop()}, timeout=10)
        assert response.status_code == 200, response.text
        assert bhttp.decode_response(ctx.decapsulate(response.content)).content == b"honest"

    return dos.Target(name, url, honest, ("POST", path, INVALID_TOKEN, b"x" * 1000), 401, (path, INVALID_TOKEN))


def test_the_gateway_holds(cluster):
    dos.run_all(_target("gateway", cluster[0], cluster))


def test_the_relay_holds(cluster):
    with serve_in_thread(create_relay_app(RelayConfig(cluster[0])), limits=dos.TEST_LIMITS) as relay_url:
        dos.run_all(_target("relay", relay_url, cluster))
