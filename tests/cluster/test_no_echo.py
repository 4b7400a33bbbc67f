"""Error messages never carry client-chosen text (threat T29, docs/threat-model.md): a marker placed in every
client-controlled spot of a bad request (JSON keys and values, query parameters, path segments,
header values) appears in no response of the gateway, relay or issuer."""

import httpx
import pytest

from tests.support.cluster_services import RELEASE, FakeNode, StubReleases, running_app
from traceless.privacy.attestation.policy import AttesterPolicy
from traceless.privacy.privacypass import protocol as privacypass
from traceless.privacy.privacypass.batch_issuance import ApiKeyStore
from traceless_tools.cluster.gateway import GatewayConfig, create_gateway_app
from traceless_tools.cluster.issuer import IssuerConfig, create_issuer_app
from traceless_tools.cluster.relay import RelayConfig, create_relay_app

MARK = "clientchosen7f3a"
OHTTP = {"content-type": "message/ohttp-req"}


def _bad_requests():
    """(method, path, kwargs) of requests that each fail, with MARK somewhere a client chose."""
    return [
        ("POST", "/pcc/v1/register", {"json": {MARK: 1}}),
        (
            "POST",
            "/pcc/v1/register",
            {"json": {"url": MARK, "model": MARK, "attestation": MARK, "ohttp_keys": MARK, "attester_key": MARK}},
        ),
        ("POST", "/pcc/v1/register", {"content": MARK.encode(), "headers": {"content-type": "application/json"}}),
        ("POST", "/pcc/v1/register", {"content": b"{}", "headers": {"content-type": f"text/{MARK}"}}),
        ("GET", f"/pcc/v1/nodes?model={MARK}", {}),
        ("GET", f"/pcc/v1/nodes?model=m&k={MARK}", {}),
        ("GET", f"/pcc/v1/nodes?model=m&nonce={MARK}", {}),
        ("GET", f"/pcc/v1/{MARK}", {}),
        ("POST", f"/pcc/v1/ohttp/{MARK}", {"content": b"x", "headers": {**OHTTP, "authorization": MARK}}),
        (
            "POST",
            f"/pcc/v1/ohttp/{MARK}",
            {"content": b"x", "headers": {**OHTTP, "authorization": f"PrivateToken token={MARK}"}},
        ),
        ("POST", f"/pcc/v1/ohttp/{MARK}", {"content": b"x", "headers": {"content-type": MARK, "authorization": MARK}}),
        ("DELETE", "/pcc/v1/challenge", {}),
    ]


@pytest.fixture(scope="module")
def issuer():
    return privacypass.Issuer.generate()


@pytest.fixture(scope="module")
def gateway_url(issuer):
    config = GatewayConfig(
        issuer_url="http://issuer.test", health_interval_s=3600, attester_policy=AttesterPolicy.DEVELOPMENT
    )
    with running_app(create_gateway_app(config, [issuer.public_key], releases=StubReleases(RELEASE))) as url:
        yield url


def _assert_no_echo(url, requests):
    with httpx.Client(base_url=url, timeout=10) as http:
        for method, path, kwargs in requests:
            response = http.request(method, path, **kwargs)
            assert response.status_code >= 400, (method, path)
            assert MARK not in response.text and MARK not in str(response.headers), (method, path)


def test_the_gateway_echoes_nothing(gateway_url):
    _assert_no_echo(gateway_url, _bad_requests())


def test_the_relay_echoes_nothing(gateway_url):
    with running_app(create_relay_app(RelayConfig(gateway_url))) as url:
        _assert_no_echo(url, [r for r in _bad_requests() if r[1].startswith(("/pcc/v1/ohttp", "/pcc/v1/nodes"))])


def test_a_registration_from_a_stranger_echoes_nothing(gateway_url):
    node = FakeNode()
    body = node.registration("http://127.0.0.1:1")
    body["attestation"] = body["attestation"][:-8] + MARK[:8]  # a document that does not verify
    _assert_no_echo(gateway_url, [("POST", "/pcc/v1/register", {"json": body})])


def test_the_issuer_echoes_nothing(issuer):
    app = create_issuer_app(IssuerConfig(), ApiKeyStore({"alice": "a" * 24}), issuer=issuer)
    token_request = "application/private-token-request"
    good_key = "Bearer " + "a" * 24
    with running_app(app) as url:
        _assert_no_echo(
            url,
            [
                (
                    "POST",
                    "/token-request",
                    {
                        "content": MARK.encode(),
                        "headers": {"authorization": f"Bearer {MARK}", "content-type": token_request},
                    },
                ),
                (
                    "POST",
                    "/token-request",
                    {"content": MARK.encode(), "headers": {"authorization": good_key, "content-type": MARK}},
                ),
                (
                    "POST",
                    "/token-request",
                    {"content": MARK.encode(), "headers": {"authorization": good_key, "content-type": token_request}},
                ),
                ("GET", f"/token-request?{MARK}={MARK}", {}),
            ],
        )
