"""The gateway over real loopback HTTP with fake nodes: registration, candidates, health,
token checks (missing, replayed, foreign issuer), forwarding and unbuffered streaming."""

import asyncio
import dataclasses
import json
import socket
import threading
import time

import httpx
import pytest

from tests.cluster import _raw as raw
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
from traceless.http.upstream import upstream_client
from traceless.privacy.attestation.policy import AttesterPolicy
from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.privacypass import protocol as privacypass
from traceless.privacy.privacypass.batch_issuance import ApiKeyStore
from traceless.privacy.privacypass.http import parse_www_authenticate
from traceless.privacy.privacypass.wire import TokenChallenge
from traceless_tools.cluster.gateway import GatewayConfig, create_gateway_app
from traceless_tools.cluster.health import check_all
from traceless_tools.cluster.issuer import IssuerConfig, create_issuer_app
from traceless_tools.cluster.issuer_directory import IssuerDirectoryError, fetch_issuer_keys
from traceless_tools.local.processes import free_port

ISSUER_URL = "http://issuer.test:8091"
OHTTP_REQ = {"content-type": "message/ohttp-req"}
# What the gateway may send a node: framing, and the body's media type. Nothing of the client's.
ALLOWED_TO_NODE = {"host", "transfer-encoding", "content-type"}


@pytest.fixture(scope="module")
def issuer():
    return privacypass.Issuer.generate()


@pytest.fixture(scope="module")
def other_issuer():
    return privacypass.Issuer.generate()


@pytest.fixture
def node():
    fake = FakeNode()
    with running_app(fake.app) as url:
        fake.url = url
        yield fake


def _gateway(issuer, **overrides):
    settings = dict(issuer_url=ISSUER_URL, health_interval_s=3600, attester_policy=AttesterPolicy.DEVELOPMENT)
    settings.update(overrides)
    keys = [issuer.public_key] if issuer is not None else []
    return create_gateway_app(GatewayConfig(**settings), keys, releases=StubReleases(RELEASE))


@pytest.fixture
def gateway(issuer):
    """(app, http client) for a privacy-on gateway without background health checks."""
    app = _gateway(issuer)
    with running_app(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        yield app, http


def _register(http, node, **kw):
    response = http.post("/pcc/v1/register", json=node.registration(node.url, **kw))
    assert response.status_code == 200, response.text
    return response.json()["node_id"]


def _tokens(http, issuer, n=1):
    challenge = http.get("/pcc/v1/challenge")
    assert challenge.status_code == 200
    return mint_tokens(issuer, challenge.headers["www-authenticate"], n)


def _send(http, node_id, node, content, token=None, headers=None):
    enc, ctx = encrypt_for(node, content)
    sent = {**OHTTP_REQ, **(headers or {})}
    if token is not None:
        sent["authorization"] = token
    response = http.post(f"/pcc/v1/ohttp/{node_id}", content=enc, headers=sent)
    return response, ctx


def test_register_and_reregister(gateway, node):
    app, http = gateway
    node_id = _register(http, node)
    assert len(node_id) == 32 and int(node_id, 16) >= 0
    refreshed = node.registration(node.url, capacity=5, now=time.time() + 1)
    assert http.post("/pcc/v1/register", json=refreshed).json()["node_id"] == node_id
    (listed,) = http.get("/pcc/v1/nodes", params={"model": "m"}).json()["nodes"]
    assert listed == {"node_id": node_id, "attestation": refreshed["attestation"], "ohttp_keys": node.ohttp_keys_b64}
    assert app.state.gateway.registry.get(node_id).capacity == 5
    other = FakeNode()
    other_id = http.post("/pcc/v1/register", json=other.registration(node.url + "/other/")).json()["node_id"]
    assert other_id != node_id and len(app.state.gateway.registry) == 2
    app.state.gateway.registry.check_integrity()


def _bad_registrations(node):
    good = node.registration(node.url)
    yield {k: v for k, v in good.items() if k != "model"}
    yield {**good, "extra": 1}
    for field, value in (
        ("url", "ftp://x"),
        ("url", "http://"),
        ("url", 5),
        ("url", "http://h/?q=1"),
        ("model", ""),
        ("attestation", ""),
        ("ohttp_keys", "not base64!"),
        ("ohttp_keys", "AAAA"),
        ("attester_key", "AAAA"),
        ("attester_key", 5),
        ("attester_key", "not base64!"),
    ):
        yield {**good, field: value}


def test_bad_registrations_are_400(gateway, node):
    app, http = gateway
    for body in _bad_registrations(node):
        response = http.post("/pcc/v1/register", json=body)
        assert response.status_code == 400, body
        assert response.json()["error"]["code"] == "invalid_registration"
    assert http.post("/pcc/v1/register", content=b"{", headers={"content-type": "application/json"}).status_code == 400
    assert http.post("/pcc/v1/register", content=b"{}", headers={"content-type": "text/plain"}).status_code == 415
    assert len(app.state.gateway.registry) == 0


def test_register_secret(issuer, node):
    app = _gateway(issuer, register_secret="s3cret-for-nodes")
    with running_app(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        body = node.registration(node.url)
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "s3cret-for-nodes"}):
            assert http.post("/pcc/v1/register", json=body, headers=headers).status_code == 401
        assert len(app.state.gateway.registry) == 0
        ok = http.post("/pcc/v1/register", json=body, headers={"authorization": "Bearer s3cret-for-nodes"})
        assert ok.status_code == 200


def test_candidates(gateway):
    app, http = gateway
    nodes = [FakeNode() for _ in range(4)]
    ids = set()
    for i, fake in enumerate(nodes):
        fake.url = f"http://n{i}.invalid"
        ids.add(_register(http, fake, model="m" if i < 3 else "m2", capacity=i + 1))
    assert http.get("/pcc/v1/nodes").status_code == 400
    assert http.get("/pcc/v1/nodes", params={"model": "absent"}).status_code == 404
    for k in ("0", "-1", "x", "1001"):
        assert http.get("/pcc/v1/nodes", params={"model": "m", "k": k}).status_code == 400
    default = http.get("/pcc/v1/nodes", params={"model": "m"}).json()["nodes"]
    assert len(default) == 3 and len({n["node_id"] for n in default}) == 3
    for k in (1, 2, 3, 50):
        got = http.get("/pcc/v1/nodes", params={"model": "m", "k": k}).json()["nodes"]
        assert len(got) == min(k, 3) and len({n["node_id"] for n in got}) == len(got)
        assert {n["node_id"] for n in got} <= ids
    (only,) = http.get("/pcc/v1/nodes", params={"model": "m2", "k": 3}).json()["nodes"]
    assert app.state.gateway.registry.get(only["node_id"]).capacity == 4


def test_unhealthy_node_leaves_after_n_failed_checks_and_returns_on_registering(issuer, node):
    app = _gateway(issuer, unhealthy_after=3)
    registry = app.state.gateway.registry

    async def check():
        async with upstream_client(5.0) as client:
            return await check_all(registry, client, 2.0, app.state.gateway.config.admission)

    with running_app(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        node_id = _register(http, node)
        assert asyncio.run(check()) == 0 and registry.get(node_id).healthy
        node.healthy = False
        for failures in (1, 2):
            assert asyncio.run(check()) == 0
            assert registry.get(node_id).failures == failures
            assert http.get("/pcc/v1/nodes", params={"model": "m"}).status_code == 404  # not offered
        assert asyncio.run(check()) == 1
        assert registry.get(node_id) is None and len(registry) == 0
        node.healthy = True
        new_id = _register(http, node)
        assert new_id != node_id
        assert [n["node_id"] for n in http.get("/pcc/v1/nodes", params={"model": "m"}).json()["nodes"]] == [new_id]


@pytest.mark.parametrize("fault", ["engine_dead", "refused"])
def test_a_node_whose_engine_stopped_or_that_refuses_connections_is_dropped_at_once(
    issuer, node, fault, captured_events
):
    app = _gateway(issuer, unhealthy_after=3)
    registry = app.state.gateway.registry

    async def check():
        async with upstream_client(5.0) as client:
            return await check_all(registry, client, 2.0, app.state.gateway.config.admission)

    with running_app(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        node_id = _register(http, node)
        if fault == "engine_dead":
            node.engine_dead = True
        else:  # nothing listens at the registered URL any more
            record = registry.get(node_id)
            registry._nodes[node_id] = dataclasses.replace(
                record, registration=dataclasses.replace(record.registration, url=f"http://127.0.0.1:{free_port()}")
            )
        assert asyncio.run(check()) == 1
        assert registry.get(node_id) is None and len(registry) == 0
        assert [e for e in captured_events() if e["event"] == "gateway.node_dropped"][0]["reason"] == (
            "engine_dead" if fault == "engine_dead" else "unreachable"
        )


def test_background_health_checks_drop_a_dead_node(issuer, node):
    app = _gateway(issuer, health_interval_s=0.05, health_timeout_s=0.5, unhealthy_after=2)
    with running_app(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        _register(http, node)
        time.sleep(0.3)
        assert len(app.state.gateway.registry) == 1  # passing checks keep it
        node.healthy = False
        deadline = time.monotonic() + 5
        while len(app.state.gateway.registry) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(app.state.gateway.registry) == 0


def test_full_request_through_the_gateway(gateway, node, issuer):
    _, http = gateway
    node_id = _register(http, node)
    (token,) = _tokens(http, issuer)
    client_headers = {"user-agent": "curious/1.0", "x-forwarded-for": "203.0.113.9", "cookie": "id=42"}
    response, ctx = _send(http, node_id, node, b"hello node", token, client_headers)
    assert response.status_code == 200
    assert response.headers["content-type"] == "message/ohttp-res"
    reply = bhttp.decode_response(ctx.decapsulate(response.content))
    assert reply.status == 200 and reply.content == b"hello node"
    (seen,) = node.seen_headers
    assert set(seen) <= ALLOWED_TO_NODE
    assert seen["content-type"] == "message/ohttp-req"
    assert seen["transfer-encoding"] == "chunked"  # the gateway's own framing, whatever the client's


def test_challenge_names_the_issuer_and_is_what_the_verifier_accepts(gateway, issuer):
    app, http = gateway
    (offered,) = parse_www_authenticate(http.get("/pcc/v1/challenge").headers["www-authenticate"])
    assert offered.token_key == issuer.public_key.spki
    challenge = TokenChallenge.decode(offered.challenge)
    assert challenge.issuer_name == "issuer.test:8091" and challenge.origin_info == ""
    accepted = app.state.gateway.verifier.current_challenge()
    assert accepted.challenge == challenge


def test_missing_and_invalid_tokens_are_401_with_a_challenge(gateway, node, issuer, other_issuer):
    _, http = gateway
    node_id = _register(http, node)
    www = http.get("/pcc/v1/challenge").headers["www-authenticate"]
    (foreign,) = mint_tokens(other_issuer, www, 1)
    for token, code in (
        (None, "token_required"),
        (foreign, "token_invalid"),
        ("PrivateToken token=AAAA", "token_invalid"),
        ("Bearer xyz", "token_invalid"),
    ):
        response, _ = _send(http, node_id, node, b"x", token)
        assert response.status_code == 401, code
        assert response.json()["error"]["code"] == code
        assert parse_www_authenticate(response.headers["www-authenticate"])[0].token_key == issuer.public_key.spki
    assert node.seen_headers == []


def test_replayed_token_is_403(gateway, node, issuer):
    app, http = gateway
    node_id = _register(http, node)
    (token,) = _tokens(http, issuer)
    assert _send(http, node_id, node, b"once", token)[0].status_code == 200
    again, _ = _send(http, node_id, node, b"twice", token)
    assert again.status_code == 403 and again.json()["error"]["code"] == "token_replayed"
    assert len(node.seen_headers) == 1 and len(app.state.gateway.verifier.spent) == 1


def test_unknown_node_is_404_and_does_not_spend_the_token(gateway, node, issuer):
    app, http = gateway
    node_id = _register(http, node)
    (token,) = _tokens(http, issuer)
    missing, _ = _send(http, "0" * 32, node, b"x", token)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "node_not_found"
    assert len(app.state.gateway.verifier.spent) == 0
    assert _send(http, node_id, node, b"x", token)[0].status_code == 200


def test_body_limits_and_media_type_do_not_spend_tokens(issuer, node):
    app = _gateway(issuer, max_body_bytes=2000)  # a 1 KiB bucket fits (calls are padded), a 4 KiB one not
    with running_app(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        node_id = _register(http, node)
        (token,) = _tokens(http, issuer)
        big, _ = _send(http, node_id, node, b"x" * 3000, token)
        assert big.status_code == 413
        wrong = http.post(
            f"/pcc/v1/ohttp/{node_id}",
            content=b"x",
            headers={"content-type": "application/json", "authorization": token},
        )
        assert wrong.status_code == 415
        assert len(app.state.gateway.verifier.spent) == 0 and node.seen_headers == []
        assert _send(http, node_id, node, b"small", token)[0].status_code == 200


def _closed_port_url():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    return f"http://127.0.0.1:{port}"


def test_node_down_is_502(gateway, node, issuer):
    _, http = gateway
    node.url = _closed_port_url()
    node_id = _register(http, node)
    (token,) = _tokens(http, issuer)
    response, _ = _send(http, node_id, node, b"x", token)
    assert response.status_code == 502 and response.json()["error"]["code"] == "upstream_unreachable"


def test_streamed_response_arrives_incrementally(gateway, node, issuer):
    _, http = gateway
    node_id = _register(http, node)
    (token,) = _tokens(http, issuer)
    enc, ctx = encrypt_chunked_for(node, b"inner request")
    decryptor = ctx.decryptor()
    arrivals, plaintext = [], []
    headers = {"content-type": "message/ohttp-chunked-req", "authorization": token}
    with http.stream("POST", f"/pcc/v1/ohttp/{node_id}", content=enc, headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "message/ohttp-chunked-res"
        for data in response.iter_raw():
            for chunk in decryptor.feed(data):
                arrivals.append(time.monotonic())
                plaintext.append(chunk)
    plaintext.append(decryptor.finish())
    assert plaintext == [b"chunk-0;", b"chunk-1;", b"chunk-2;", b"chunk-3;", b"inner request"]
    (finished,) = node.stream_finished_at
    # The first chunk reached the client while the node was still producing the rest.
    assert arrivals[0] < finished - 2 * STREAM_DELAY_S
    assert arrivals[3] - arrivals[0] > STREAM_DELAY_S  # spread out as sent, not bunched at the end


def test_client_leaving_mid_stream_stops_the_node(gateway, node, issuer):
    _, http = gateway
    node_id = _register(http, node)
    (token,) = _tokens(http, issuer)
    enc, ctx = encrypt_chunked_for(node, b"abandoned")
    headers = {"content-type": "message/ohttp-chunked-req", "authorization": token}
    with http.stream("POST", f"/pcc/v1/ohttp/{node_id}", content=enc, headers=headers) as response:
        next(response.iter_raw())  # the first chunk, then hang up
    deadline = time.monotonic() + 5 * STREAM_DELAY_S * 4
    while node.streams_abandoned == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert node.streams_abandoned == 1 and node.stream_finished_at == []


def test_node_failing_mid_stream_cuts_the_client_off(gateway, node, issuer):
    _, http = gateway
    node_id = _register(http, node)
    (token,) = _tokens(http, issuer)
    node.break_streams = True
    enc, ctx = encrypt_chunked_for(node, b"doomed")
    decryptor = ctx.decryptor()
    headers = {"content-type": "message/ohttp-chunked-req", "authorization": token}
    received = []
    with pytest.raises(httpx.RemoteProtocolError):  # not a clean end of the body
        with http.stream("POST", f"/pcc/v1/ohttp/{node_id}", content=enc, headers=headers) as response:
            assert response.status_code == 200
            for data in response.iter_raw():
                received += decryptor.feed(data)
    assert received == [b"chunk-0;"]


def test_a_node_that_vanishes_has_its_calls_cut_when_it_is_dropped(issuer, node):
    """A host gone without a word (no FIN, no RST) would hold a stream or a plain call for the whole
    read timeout; the health checks that drop it cut those calls instead."""
    app = _gateway(issuer, health_interval_s=0.1, health_timeout_s=0.3, unhealthy_after=2)
    with running_app(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        node_id = _register(http, node)
        token, token2 = _tokens(http, issuer, 2)
        enc, ctx = encrypt_chunked_for(node, b"cut")
        decryptor = ctx.decryptor()
        headers = {"content-type": "message/ohttp-chunked-req", "authorization": token}
        received = []
        started = time.monotonic()
        with pytest.raises(httpx.RemoteProtocolError):  # cut off, not a clean end
            with http.stream("POST", f"/pcc/v1/ohttp/{node_id}", content=enc, headers=headers) as response:
                assert response.status_code == 200
                for data in response.iter_raw():
                    received += decryptor.feed(data)
                    node.stall, node.healthy = True, False  # the host vanishes after the first chunk
        assert received == [b"chunk-0;"] and time.monotonic() - started < 10
        assert len(app.state.gateway.registry) == 0 and len(app.state.gateway.cuts) == 0

        node.stall, node.healthy = True, True  # a plain call: no answer at all, then dropped
        node_id = _register(http, node)
        sent = {**OHTTP_REQ, "authorization": token2}

        def vanish():
            time.sleep(0.5)
            node.healthy = False

        threading.Thread(target=vanish, daemon=True).start()
        response = http.post(f"/pcc/v1/ohttp/{node_id}", content=encrypt_for(node, b"x")[0], headers=sent)
        assert response.status_code == 502 and response.json()["error"]["code"] == "node_unavailable"
        assert len(app.state.gateway.cuts) == 0


def test_privacy_off_skips_the_token_check_and_says_so(node, captured_events):
    app = _gateway(None, privacy=False, issuer_url=None)
    (configured,) = [e for e in captured_events() if e["event"] == "gateway.configured"]
    assert configured["token_check"] is False
    with running_app(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        node_id = _register(http, node)
        response, ctx = _send(http, node_id, node, b"no token needed")
        assert response.status_code == 200
        assert bhttp.decode_response(ctx.decapsulate(response.content)).content == b"no token needed"
        assert http.get("/pcc/v1/challenge").status_code == 404


def test_privacy_on_requires_issuer_keys():
    with pytest.raises(ValueError):
        create_gateway_app(GatewayConfig(issuer_url=ISSUER_URL), [], releases=StubReleases(RELEASE))
    with pytest.raises(ValueError):
        GatewayConfig(issuer_url=None)


def test_events_carry_no_ids_or_urls(gateway, node, issuer, captured_events):
    _, http = gateway
    node_id = _register(http, node)
    (token,) = _tokens(http, issuer)
    _send(http, node_id, node, b"secret prompt", token)
    _send(http, "f" * 32, node, b"x", token)
    logged = json.dumps(captured_events())
    assert "gateway.node_registered" in logged and '"route": "ohttp"' in logged
    for secret in (node_id, node.url, "secret prompt", token.split("=", 1)[1][:20], "127.0.0.1"):
        assert secret not in logged


def test_gateway_fetches_the_issuer_key_from_its_directory(issuer):
    app = create_issuer_app(IssuerConfig(), ApiKeyStore({"u": "k" * 16}), issuer=issuer)
    with running_app(app) as url:
        (key,) = fetch_issuer_keys(url)
    assert key == issuer.public_key
    with pytest.raises(IssuerDirectoryError):
        fetch_issuer_keys(_closed_port_url(), wait_s=0)


def test_an_issuer_key_rotation_is_taken_without_a_restart(issuer, other_issuer, node):
    """The issuer restarts with a new key: the gateway reads its directory again and takes it; tokens
    under the key offered until then still verify for one refresh period (threat T22, docs/threat-model.md)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from traceless.privacy.privacypass.http import b64url_encode

    current = {"issuer": issuer}

    async def directory(request):
        key = current["issuer"].public_key.spki
        return JSONResponse({"token-keys": [{"token-type": 2, "token-key": b64url_encode(key)}]})

    with running_app(Starlette(routes=[Route("/token-issuer-directory", directory)])) as issuer_url:
        app = _gateway(issuer, issuer_url=issuer_url, issuer_refresh_s=0.1)
        with running_app(app) as url, httpx.Client(base_url=url, timeout=10) as http:
            node_id = _register(http, node)
            old_tokens = _tokens(http, issuer, 2)
            current["issuer"] = other_issuer  # the restarted issuer's new key
            deadline = time.monotonic() + 10
            while (
                parse_www_authenticate(http.get("/pcc/v1/challenge").headers["www-authenticate"])[0].token_key
                != other_issuer.public_key.spki
            ):
                assert time.monotonic() < deadline, "the gateway never took the new issuer key"
                time.sleep(0.05)
            (new_token,) = _tokens(http, other_issuer)
            assert _send(http, node_id, node, b"new", new_token)[0].status_code == 200
            assert _send(http, node_id, node, b"old", old_tokens[0])[0].status_code == 200  # overlap


def test_invalid_token_is_refused_before_the_body_is_read(gateway, node, issuer):
    """Found 6: the token is checked on the request's head; a body that never comes does not matter."""
    app, http = gateway
    node_id = _register(http, node)
    for credential, status in (("PrivateToken token=AAAA", 401), (None, 401)):
        headers = {"content-type": "message/ohttp-req", "content-length": str(4 * 2**20)}
        if credential is not None:
            headers["authorization"] = credential
        with raw.connect(str(http.base_url), timeout_s=3) as sock:
            sock.sendall(raw.head("POST", f"/pcc/v1/ohttp/{node_id}", headers))  # and no body at all
            assert raw.read_status(sock) == status
    assert node.seen_headers == [] and len(app.state.gateway.verifier.spent) == 0


def test_a_replayed_token_is_refused_before_the_body_is_read(gateway, node, issuer):
    app, http = gateway
    node_id = _register(http, node)
    (token,) = _tokens(http, issuer)
    assert _send(http, node_id, node, b"once", token)[0].status_code == 200
    headers = {"content-type": "message/ohttp-req", "content-length": "1000", "authorization": token}
    with raw.connect(str(http.base_url), timeout_s=3) as sock:
        sock.sendall(raw.head("POST", f"/pcc/v1/ohttp/{node_id}", headers))
        assert raw.read_status(sock) == 403


def _in_two_parts(body: bytes, pause_s: float, sent_second: list[float]):
    async def parts():
        yield body[: len(body) // 2]
        await asyncio.sleep(pause_s)
        sent_second.append(time.monotonic())
        yield body[len(body) // 2 :]

    return parts()


def test_the_body_is_streamed_to_the_node_not_buffered(gateway, node, issuer):
    """The node has the first half of a (chunked) body before the client sends the second."""
    _, http = gateway
    node_id = _register(http, node)
    (token,) = _tokens(http, issuer)
    enc, ctx = encrypt_for(node, b"streamed through")
    sent_second: list[float] = []

    async def post():
        async with httpx.AsyncClient(base_url=str(http.base_url), timeout=10) as client:
            return await client.post(
                f"/pcc/v1/ohttp/{node_id}",
                content=_in_two_parts(enc, 0.5, sent_second),
                headers={**OHTTP_REQ, "authorization": token},
            )

    response = asyncio.run(post())
    assert response.status_code == 200
    assert bhttp.decode_response(ctx.decapsulate(response.content)).content == b"streamed through"
    assert node.body_arrivals[0][0] < sent_second[0]
    assert sum(size for _, size in node.body_arrivals) == len(enc)


def test_a_chunked_body_over_the_cap_is_cut_off_at_the_cap(issuer, node):
    app = _gateway(issuer, max_body_bytes=4096)
    with running_app(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        node_id = _register(http, node)
        (token,) = _tokens(http, issuer)

        def chunks():
            for _ in range(64):
                yield b"x" * 1024

        response = http.post(
            f"/pcc/v1/ohttp/{node_id}", content=chunks(), headers={**OHTTP_REQ, "authorization": token}
        )
        assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"
        assert sum(size for _, size in node.body_arrivals) <= 4096
        # the gateway is fine afterwards
        (fresh,) = _tokens(http, issuer)
        assert _send(http, node_id, node, b"after", fresh)[0].status_code == 200
