"""The proxy ends a stream that breaks off on the private path with an OpenAI-style error event
(as the server's own streams do), so the openai SDK raises APIError rather than a transport error."""

import threading
from types import SimpleNamespace

import httpx
import pytest

from traceless.http.serve import serve_in_thread
from traceless_tools.client.private_client import PrivateClientError
from traceless_tools.client.proxy import create_proxy_app
from traceless_tools.client.routing_watch import RoutingWatch


class BreakingClient:
    """An AsyncPrivateClient stand-in whose streams yield two events, then break off."""

    def __init__(self) -> None:
        self.config = SimpleNamespace(model="m")
        self.routing = RoutingWatch()
        self.closed = threading.Event()

    def start(self) -> None:  # the proxy starts the token wallet's schedule with its lifespan
        pass

    async def aclose(self) -> None:
        pass

    async def request(self, path: str, body: dict):
        return self._events()

    async def _events(self):
        try:
            yield (
                b'data: {"id":"x","object":"text_completion","created":0,"model":"m","choices":[{"index":0,'
                b'"text":"a","logprobs":null,"finish_reason":null}]}\n\n'
            )
            raise PrivateClientError("the response stream broke off (the node or a hop failed)")
        finally:
            self.closed.set()


def test_a_broken_stream_ends_with_an_error_event_the_openai_sdk_raises():
    from openai import APIError, OpenAI

    fake = BreakingClient()
    with serve_in_thread(create_proxy_app(fake), what="proxy") as url:
        raw = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "p", "stream": True}, timeout=10)
        assert raw.status_code == 200
        events = [e for e in raw.text.split("\n\n") if e]
        assert events[-1] == "data: [DONE]" and '"code":"private_path_failed"' in events[-2]
        assert "broke off" not in raw.text  # the fixed message, not the exception's text
        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        got = []
        with pytest.raises(APIError, match="private path could not complete"):
            for chunk in client.completions.create(model="m", prompt="p", stream=True):
                got.append(chunk.choices[0].text)
        assert got == ["a"] and fake.closed.is_set()


class SilentClient(BreakingClient):
    """A stand-in whose path goes silent: a non-streamed call, and a stream after one event, time out."""

    async def request(self, path: str, body: dict):
        from traceless_tools.client.private_client import PathTimeoutError

        if not body.get("stream"):
            raise PathTimeoutError("no answer within 300s; the request was abandoned")
        return self._silent()

    async def _silent(self):
        from traceless_tools.client.private_client import PathTimeoutError

        yield b'data: {"id":"x","object":"text_completion","created":0,"model":"m","choices":[]}\n\n'
        raise PathTimeoutError("nothing arrived for 30s while waiting for the next chunk")


def test_a_path_that_went_silent_is_a_504_upstream_timeout():
    with serve_in_thread(create_proxy_app(SilentClient()), what="proxy") as url:
        plain = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "p"}, timeout=10)
        assert plain.status_code == 504 and plain.json()["error"]["code"] == "upstream_timeout"
        streamed = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "p", "stream": True}, timeout=10)
        events = [e for e in streamed.text.split("\n\n") if e]
        assert events[-1] == "data: [DONE]" and '"code":"upstream_timeout"' in events[-2]
