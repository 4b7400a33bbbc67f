"""The relay over real loopback HTTP: client -> relay -> (capturing wrapper) -> gateway -> fake
node. What the client's software says about itself must never reach the gateway, the relay adds
no forwarding header, responses stream through, and only the three routes exist."""

import time

import httpx
import pytest

from tests.support.cluster_services import (
    RELEASE,
    STREAM_DELAY_S,
    FakeNode,
    StubReleases,
    encrypt_chunked_for,
    encrypt_for,
    mint_tokens,
    running_app,
)
from traceless.privacy.attestation.policy import AttesterPolicy
from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.privacypass import protocol as privacypass
from traceless_tools.cluster.gateway import GatewayConfig, create_gateway_app
from traceless_tools.cluster.relay import RelayConfig, create_relay_app

# Sent by the client on every request; none of it may pass the relay.
IDENTIFYING = {
    "x-forwarded-for": "198.51.100.7",
    "x-real-ip": "198.51.100.7",
    "forwarded": "for=198.51.100.7",
    "via": "1.1 corp-proxy",
    "user-agent": "FancyBrowser/99 (Linux; de-DE)",
    "cookie": "uid=12345",
    "accept-language": "de-DE",
    "referer": "https://example.org/",
    "x-client-id": "abc",
    "true-client-ip": "198.51.100.7",
    "x-request-id": "req-1",
    "accept-encoding": "br",
}
MAY_REACH_GATEWAY = {"host", "transfer-encoding", "content-type", "authorization"}
# Headers the gateway side adds to its responses; only content-type and www-authenticate may
# come back through the relay.
UPSTREAM_EXTRA = [
    (b"set-cookie", b"gw=1"),
    (b"server", b"gateway/1"),
    (b"x-node", b"n1"),
    (b"cache-control", b"private"),
]
MAY_REACH_CLIENT = {"content-type", "www-authenticate", "content-length", "transfer-encoding"}


class Capture:
    """ASGI wrapper: records each request's headers and adds headers to each response."""

    def __init__(self, app):
        self.app = app
        self.requests: list[tuple[str, str, dict[str, str]]] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        self.requests.append((scope["path"], scope["query_string"].decode(), headers))

        async def send_more(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message["headers"]) + UPSTREAM_EXTRA}
            await send(message)

        await self.app(scope, receive, send_more)


@pytest.fixture(scope="module")
def issuer():
    return privacypass.Issuer.generate()


@pytest.fixture
def path(issuer):
    """(client through the relay, capture, fake node, node_id, gateway app)."""
    node = FakeNode()
    gateway = create_gateway_app(
        GatewayConfig(
            issuer_url="http://issuer.test", health_interval_s=3600, attester_policy=AttesterPolicy.DEVELOPMENT
        ),
        [issuer.public_key],
        releases=StubReleases(RELEASE),
    )
    capture = Capture(gateway)
    with running_app(node.app) as node_url, running_app(capture) as gateway_url:
        node_id = httpx.post(gateway_url + "/pcc/v1/register", json=node.registration(node_url)).json()["node_id"]
        capture.requests.clear()
        relay = create_relay_app(RelayConfig(gateway_url=gateway_url, max_body_bytes=4096))
        with running_app(relay) as relay_url, httpx.Client(base_url=relay_url, timeout=10) as http:
            yield http, capture, node, node_id, gateway


def _token(http, issuer):
    response = http.get("/pcc/v1/challenge", headers=IDENTIFYING)
    assert response.status_code == 200
    return mint_tokens(issuer, response.headers["www-authenticate"], 1)[0]


def _check_clean(capture):
    assert capture.requests
    for path, _, headers in capture.requests:
        assert set(headers) <= MAY_REACH_GATEWAY, set(headers) - MAY_REACH_GATEWAY
        if path.startswith("/pcc/v1/ohttp/"):  # the relay's framing, whatever the client's was
            assert headers["transfer-encoding"] == "chunked"
        assert not any(value in headers.values() for value in IDENTIFYING.values())


def test_full_request_through_relay_carries_nothing_identifying(path, issuer):
    http, capture, node, node_id, _ = path
    token = _token(http, issuer)
    nodes = http.get("/pcc/v1/nodes", params={"model": "m", "k": "2"}, headers=IDENTIFYING)
    assert nodes.status_code == 200 and nodes.json()["nodes"][0]["node_id"] == node_id
    enc, ctx = encrypt_for(node, b"through the relay")
    headers = {**IDENTIFYING, "content-type": "message/ohttp-req", "authorization": token}
    response = http.post(f"/pcc/v1/ohttp/{node_id}", content=enc, headers=headers)
    assert response.status_code == 200
    assert bhttp.decode_response(ctx.decapsulate(response.content)).content == b"through the relay"
    assert set(response.headers) <= MAY_REACH_CLIENT
    assert [(p, q) for p, q, _ in capture.requests] == [
        ("/pcc/v1/challenge", ""),
        ("/pcc/v1/nodes", "model=m&k=2"),
        (f"/pcc/v1/ohttp/{node_id}", ""),
    ]
    _check_clean(capture)
    ohttp_headers = capture.requests[-1][2]
    assert ohttp_headers["authorization"] == token and ohttp_headers["content-type"] == "message/ohttp-req"
    assert set(node.seen_headers[0]) <= {"host", "transfer-encoding", "content-type"}


def test_errors_pass_status_content_type_and_www_authenticate_only(path):
    http, capture, node, node_id, _ = path
    enc, _ = encrypt_for(node, b"x")
    response = http.post(
        f"/pcc/v1/ohttp/{node_id}", content=enc, headers={**IDENTIFYING, "content-type": "message/ohttp-req"}
    )
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("PrivateToken ")
    assert response.json()["error"]["code"] == "token_required"
    assert set(response.headers) <= MAY_REACH_CLIENT
    missing = http.get("/pcc/v1/nodes", params={"model": "absent"})
    assert missing.status_code == 404 and set(missing.headers) <= MAY_REACH_CLIENT
    _check_clean(capture)


def test_streamed_response_flows_through_the_relay(path, issuer):
    http, capture, node, node_id, _ = path
    token = _token(http, issuer)
    enc, ctx = encrypt_chunked_for(node, b"stream me")
    decryptor = ctx.decryptor()
    arrivals, chunks = [], []
    headers = {"content-type": "message/ohttp-chunked-req", "authorization": token, **IDENTIFYING}
    with http.stream("POST", f"/pcc/v1/ohttp/{node_id}", content=enc, headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "message/ohttp-chunked-res"
        for data in response.iter_raw():
            for chunk in decryptor.feed(data):
                arrivals.append(time.monotonic())
                chunks.append(chunk)
    chunks.append(decryptor.finish())
    assert chunks == [b"chunk-0;", b"chunk-1;", b"chunk-2;", b"chunk-3;", b"stream me"]
    (finished,) = node.stream_finished_at
    assert arrivals[0] < finished - 2 * STREAM_DELAY_S
    _check_clean(capture)


def test_only_the_three_routes_exist(path):
    http, capture, node, node_id, _ = path
    for method, route in (
        ("GET", "/pcc/v1/register"),
        ("POST", "/pcc/v1/register"),
        ("GET", "/health"),
        ("GET", "/"),
        ("GET", "/pcc/v1/nodes/"),
        ("GET", "/pcc/v1/ohttp-keys"),
        ("GET", "/pcc/v1/ohttp"),
        ("POST", f"/pcc/v1/ohttp/{node_id}/x"),
        ("GET", "/token-issuer-directory"),
        ("GET", "/log/v1/sth"),
    ):
        response = http.request(method, route, json={"url": "http://evil"})
        assert response.status_code == 404, (method, route)
        assert response.json()["error"]["code"] == "not_found"
    assert http.post("/pcc/v1/nodes").status_code == 405
    assert http.get(f"/pcc/v1/ohttp/{node_id}").status_code == 405
    assert capture.requests == []


def test_body_cap(path, issuer):
    http, capture, node, node_id, _ = path
    response = http.post(f"/pcc/v1/ohttp/{node_id}", content=b"x" * 5000, headers={"content-type": "message/ohttp-req"})
    assert response.status_code == 413
    assert capture.requests == []


def test_gateway_down_is_502():
    relay = create_relay_app(RelayConfig(gateway_url="http://127.0.0.1:9"))
    with running_app(relay) as url:
        response = httpx.get(url + "/pcc/v1/challenge")
    assert response.status_code == 502 and response.json()["error"]["code"] == "upstream_unreachable"


def test_config_validation():
    for bad in (dict(gateway_url="gateway:80"), dict(gateway_url="http://g", max_body_bytes=0)):
        with pytest.raises(ValueError):
            RelayConfig(**bad)


def test_the_body_streams_through_relay_and_gateway_to_the_node(path, issuer):
    """The node has the first half of a (chunked) body before the client sends the second: neither
    hop holds it whole."""
    import asyncio

    http, capture, node, node_id, _ = path
    token = _token(http, issuer)
    enc, ctx = encrypt_for(node, b"streamed twice")
    sent_second: list[float] = []

    async def parts():
        yield enc[: len(enc) // 2]
        await asyncio.sleep(0.5)
        sent_second.append(time.monotonic())
        yield enc[len(enc) // 2 :]

    async def post():
        async with httpx.AsyncClient(base_url=str(http.base_url), timeout=10) as client:
            return await client.post(
                f"/pcc/v1/ohttp/{node_id}",
                content=parts(),
                headers={"content-type": "message/ohttp-req", "authorization": token},
            )

    response = asyncio.run(post())
    assert response.status_code == 200
    assert bhttp.decode_response(ctx.decapsulate(response.content)).content == b"streamed twice"
    assert node.body_arrivals[0][0] < sent_second[0]
    _check_clean(capture)


def test_a_chunked_body_over_the_cap_is_413(path, issuer):
    http, capture, node, node_id, _ = path
    token = _token(http, issuer)

    def chunks():
        for _ in range(64):
            yield b"x" * 1024

    response = http.post(
        f"/pcc/v1/ohttp/{node_id}",
        content=chunks(),
        headers={"content-type": "message/ohttp-req", "authorization": token},
    )
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"
    assert sum(size for _, size in node.body_arrivals) <= 4096
