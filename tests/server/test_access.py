"""Who may call `traceless serve`: a bearer token (--api-key) on every route but /health, browser
origins refused unless allowed (--allowed-origins), and routes of OpenAI's API this server does not
implement answered with a clear error instead of a bare 404."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.serving import make_served_app, serve
from traceless.config import EngineConfig

KEY = "sk-test-4b1d"
ALLOWED = "https://app.example"


@pytest.fixture(scope="module")
def guarded(tiny_llama_dir):
    app, engine = make_served_app(
        EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=128),
        model_name="tiny",
        api_key=KEY,
        allowed_origins=(ALLOWED,),
    )
    with serve(app, engine) as s:
        yield s.url


@pytest.fixture(scope="module")
def open_server(tiny_server):
    return tiny_server.url


BODY = {"model": "tiny", "prompt": [5, 6], "max_tokens": 2}


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/v1/models"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/tokenize"),
        ("GET", "/tokenizer_info"),
        ("POST", "/v1/embeddings"),
    ],
)
def test_every_route_but_health_needs_the_key(guarded, method, path):
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": KEY}, {"authorization": "Basic x"}):
        r = httpx.request(method, guarded + path, json=BODY, headers=headers)
        assert r.status_code == 401, (path, headers)
        error = r.json()["error"]
        assert error["code"] == "invalid_api_key" and "wrong" not in r.text
    assert httpx.get(guarded + "/health").status_code == 200


def test_the_key_opens_the_api_and_the_openai_client_sends_it(guarded):
    r = httpx.post(guarded + "/v1/completions", json=BODY, headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    client = openai.OpenAI(base_url=guarded + "/v1", api_key=KEY)
    assert client.models.list().data[0].id == "tiny"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=guarded + "/v1", api_key="nope").models.list()


def test_cross_origin_requests_are_refused_by_default(open_server):
    r = httpx.post(
        open_server + "/v1/completions",
        json={**BODY, "model": "tiny-llama"},
        headers={"origin": "https://evil.example"},
    )
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed" and "evil" not in r.text
    preflight = httpx.options(
        open_server + "/v1/completions",
        headers={"origin": "https://evil.example", "access-control-request-method": "POST"},
    )
    assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers


def test_an_allowed_origin_gets_cors_headers(guarded):
    preflight = httpx.options(
        guarded + "/v1/chat/completions",
        headers={
            "origin": ALLOWED,
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == ALLOWED
    r = httpx.post(
        guarded + "/v1/completions", json=BODY, headers={"origin": ALLOWED, "authorization": f"Bearer {KEY}"}
    )
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ALLOWED
    other = httpx.post(
        guarded + "/v1/completions",
        json=BODY,
        headers={"origin": "https://other.example", "authorization": f"Bearer {KEY}"},
    )
    assert other.status_code == 403


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v1/responses"])
def test_unimplemented_openai_routes_say_so(open_server, path):
    r = httpx.post(open_server + path, json={"model": "tiny-llama", "input": "w5"})
    error = r.json()["error"]
    assert r.status_code == 501 and error["code"] == "unsupported_endpoint"
    assert path in error["message"] and "not supported" in error["message"] and "docs/api.md" in error["message"]
