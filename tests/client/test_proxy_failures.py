"""What the proxy answers when the private path fails: a status and code naming the cause class, and
`x-should-retry: false`, so that the official openai SDK does not retry (each retry would be a new
request: with a fresh draw, a gateway could steer the caller by failing it). Web pages of other sites
(`Sec-Fetch-Site`, sent on no-cors GETs too) cannot make it spend tokens; `/v1/models` and
`/tokenizer_info` go over the private path once."""

import httpx
import pytest

from tests.support.cluster_services import running_app
from traceless_tools.client.private_client import PrivateClientError
from traceless_tools.client.proxy import create_proxy_app
from traceless_tools.client.routing_watch import RoutingWatch


class _Config:
    model = "m"


class FailingClient:
    """An AsyncPrivateClient stand-in: every call fails with `error`, or answers `answer`."""

    def __init__(self, error: Exception | None = None) -> None:
        self.config = _Config()
        self.routing = RoutingWatch()
        self.error = error
        self.calls: list[str] = []

    def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    async def request(self, path: str, body):
        self.calls.append(path)
        if self.error is not None:
            raise self.error
        return {"object": "list", "data": [{"id": "m"}]}


def _error(cause: str) -> PrivateClientError:
    from traceless_tools.client.errors import FailureCause

    return PrivateClientError("x", FailureCause(cause))


@pytest.mark.parametrize(
    "cause, status",
    [
        ("relay_unreachable", 503),
        ("no_healthy_node", 503),
        ("quota_exhausted", 429),
        ("private_path_failed", 502),
        ("tokens_unavailable", 503),
    ],
)
def test_a_failure_names_its_cause_and_asks_not_to_be_retried(cause, status):
    client = FailingClient(_error(cause))
    with running_app(create_proxy_app(client)) as url:
        r = httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": []})
    assert r.status_code == status and r.json()["error"]["code"] == cause
    assert r.headers["x-should-retry"] == "false"


def test_the_openai_sdk_makes_one_attempt():
    """Retry steering: the SDK retries a 5xx twice by default; each retry would be a fresh request."""
    import openai

    client = FailingClient(_error("private_path_failed"))
    with running_app(create_proxy_app(client)) as url:
        sdk = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        with pytest.raises(openai.APIStatusError) as e:
            sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 502 and len(client.calls) == 1


def test_the_relay_down_is_503_relay_unreachable_not_500():
    """The real client, holding tokens (the candidate list costs one), against a relay that accepts no
    connection."""
    from traceless.privacy.privacypass import protocol as privacypass
    from traceless.privacy.privacypass.wire import TokenChallenge
    from traceless_tools.client.private_client import AsyncPrivateClient, ClientConfig

    config = ClientConfig(
        "http://127.0.0.1:9",
        "k",
        "http://127.0.0.1:9",
        "http://127.0.0.1:9",
        bytes(32),
        (bytes(32),),
        "m",
        token_wait_s=0.5,
    )
    client = AsyncPrivateClient(config)
    issuer = privacypass.Issuer.generate()
    challenge = TokenChallenge(2, "127.0.0.1:9", bytes(32), "")
    for _ in range(2):
        request, state = privacypass.begin(challenge, issuer.public_key)
        client.wallet._tokens.append(privacypass.finalize(state, issuer.issue(request)))
    with running_app(create_proxy_app(client)) as url:
        r = httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": []}, timeout=30)
    assert r.status_code == 503 and r.json()["error"]["code"] == "relay_unreachable"


def test_with_no_token_to_pay_for_the_candidate_list_nothing_is_sent():
    """The relay and the issuer down, the wallet empty: the candidate list waits for a token (it makes
    the nodes sign), so the cause named is the tokens."""
    from traceless_tools.client.private_client import AsyncPrivateClient, ClientConfig

    config = ClientConfig(
        "http://127.0.0.1:9",
        "k",
        "http://127.0.0.1:9",
        "http://127.0.0.1:9",
        bytes(32),
        (bytes(32),),
        "m",
        token_wait_s=0.5,
    )
    with running_app(create_proxy_app(AsyncPrivateClient(config))) as url:
        r = httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": []}, timeout=30)
    assert r.status_code == 503 and r.json()["error"]["code"] == "tokens_unavailable"


def test_routing_concentration_reaches_the_caller():
    client = FailingClient()
    with running_app(create_proxy_app(client)) as url:
        assert httpx.get(url + "/v1/models").headers["x-traceless-routing"] == "ok"
        for _ in range(40):
            client.routing.observe("evil", {"evil": 1, "honest": 9})
        assert (
            httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": []}).headers["x-traceless-routing"]
            == "concentrated"
        )


@pytest.mark.parametrize("site", ["cross-site", "same-site"])
def test_a_page_of_another_site_cannot_spend_tokens(site):
    """No-cors GETs carry no Origin, but browsers name the page's site in Sec-Fetch-Site."""
    client = FailingClient()
    with running_app(create_proxy_app(client)) as url:
        for method, path in (("GET", "/v1/models"), ("GET", "/tokenizer_info"), ("POST", "/v1/chat/completions")):
            r = httpx.request(
                method,
                url + path,
                headers={"sec-fetch-site": site},
                json={"model": "m", "messages": []} if method == "POST" else None,
            )
            assert r.status_code == 403 and r.json()["error"]["code"] == "site_not_allowed"
        assert httpx.get(url + "/v1/models", headers={"sec-fetch-site": "same-origin"}).status_code == 200
    assert client.calls == ["/v1/models"]


def test_the_model_list_goes_over_the_private_path_once():
    client = FailingClient()
    with running_app(create_proxy_app(client)) as url:
        answers = [httpx.get(url + "/v1/models").json() for _ in range(3)] + [
            httpx.get(url + "/tokenizer_info").json() for _ in range(2)
        ]
    assert answers[0] == answers[2] and client.calls == ["/v1/models", "/tokenizer_info"]
