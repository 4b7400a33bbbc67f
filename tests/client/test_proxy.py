"""The local proxy answers only the user's own software (threat T31, docs/threat-model.md): a loopback Host, no
foreign Origin (CSRF, DNS rebinding), a JSON content type on POST; refusals echo no header value."""

from dataclasses import dataclass

import httpx
import pytest

from tests.support.cluster_services import running_app
from traceless_tools.client.proxy import create_proxy_app
from traceless_tools.client.routing_watch import RoutingWatch


@dataclass
class _Config:
    model: str = "m"


class StubPrivateClient:
    """Stands in for AsyncPrivateClient: records what would have gone down the private path."""

    def __init__(self) -> None:
        self.config = _Config()
        self.routing = RoutingWatch()
        self.sent: list[tuple[str, dict]] = []

    def start(self) -> None:  # the proxy starts the token wallet's schedule with its lifespan
        pass

    async def aclose(self) -> None:
        pass

    async def request(self, path: str, body: dict) -> dict:
        self.sent.append((path, body))
        return {"object": "chat.completion", "choices": []}


@pytest.fixture(scope="module")
def proxy():
    client = StubPrivateClient()
    with running_app(create_proxy_app(client)) as url, httpx.Client(base_url=url, timeout=10) as http:
        yield client, http


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000", "LOCALHOST", "[::1]:8000", "127.0.0.1"])
def test_loopback_hosts_are_served(proxy, host):
    client, http = proxy
    before = len(client.sent)
    response = http.post("/v1/chat/completions", json=BODY, headers={"host": host})
    assert response.status_code == 200, response.text
    assert len(client.sent) == before + 1


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:8000",
        "127.0.0.1.evil.example",
        "localhost.evil.example:8000",
        "10.0.0.1:8000",
        "",
        "127.0.0.1:8000@evil",
    ],
)
def test_other_hosts_are_403_dns_rebinding(proxy, host):
    client, http = proxy
    before = len(client.sent)
    for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/health")):
        response = http.request(method, path, json=BODY if method == "POST" else None, headers={"host": host})
        assert response.status_code == 403, (path, host)
        error = response.json()["error"]
        assert error["code"] == "host_not_allowed"
        assert not host or host not in response.text
    assert len(client.sent) == before


@pytest.mark.parametrize(
    "origin",
    ["https://evil.example", "null", "http://127.0.0.1.evil.example", "file://", "http://localhost.evil.example:8000"],
)
def test_foreign_origins_are_403_csrf(proxy, origin):
    client, http = proxy
    before = len(client.sent)
    response = http.post("/v1/chat/completions", json=BODY, headers={"origin": origin})
    assert response.status_code == 403 and response.json()["error"]["code"] == "origin_not_allowed"
    assert origin not in response.text.replace('"null"', "")
    assert len(client.sent) == before


def test_a_loopback_origin_is_served(proxy):
    client, http = proxy
    response = http.post("/v1/chat/completions", json=BODY, headers={"origin": "http://localhost:3000"})
    assert response.status_code == 200


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
)
def test_a_post_must_declare_json(proxy, content_type):
    """A page may send text/plain or a form cross-origin without a preflight; never JSON."""
    client, http = proxy
    before = len(client.sent)
    headers = {"content-type": content_type} if content_type else {}
    response = http.post("/v1/chat/completions", content=b'{"model": "m", "messages": []}', headers=headers)
    assert response.status_code == 415 and response.json()["error"]["code"] == "unsupported_media_type"
    assert len(client.sent) == before


def test_the_proxy_holds():
    """Slowloris clients, 100 MiB bodies, 500 connections and a flood of foreign-Host requests:
    the user's own requests keep being served, memory stays bounded (figures printed)."""
    from tests import dos
    from traceless.http.serve import serve_in_thread

    client = StubPrivateClient()
    with serve_in_thread(create_proxy_app(client), limits=dos.TEST_LIMITS) as url:

        def honest():
            response = httpx.post(url + "/v1/chat/completions", json=BODY, timeout=10)
            assert response.status_code == 200

        json_type = {"content-type": "application/json"}
        target = dos.Target(
            "proxy",
            url,
            honest,
            ("POST", "/v1/chat/completions", {**json_type, "host": "evil.example"}, b"{}"),
            403,
            ("/v1/chat/completions", json_type),
        )
        dos.run_all(target)
