"""A server that stops ends its open requests properly (AsyncEngine.end_requests, what the bounded
drain calls): each stream gets an error event then [DONE], a non-streamed request a 503, each
engine request is aborted (every block free and zero while the server still runs), and requests
that come later are refused with 503 `shutting_down`."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest

from tests.support.serving import make_served_app, serve
from traceless.config import EngineConfig


@pytest.fixture
def server(tiny_llama_dir):
    app, engine = make_served_app(
        EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=128)
    )
    with serve(app, engine) as s:
        yield s


def _end_requests(server) -> None:
    server.loop.call_soon_threadsafe(server.engine.end_requests)


def test_ending_requests_ends_streams_with_an_error_then_done_and_frees_every_block(server):
    model = server.engine.model_name
    body = {"model": model, "prompt": "hello", "max_tokens": 100, "ignore_eos": True}
    plain: dict = {}

    def non_streamed():
        plain["response"] = httpx.post(server.url + "/v1/completions", json=body, timeout=60)

    with server.slowed(0.05):  # 100 tokens: 5 s, far longer than the test waits
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        chat = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            n=2,
            max_tokens=100,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            events = (line for line in r.iter_lines() if line.startswith("data: "))
            assert json.loads(next(events)[6:])["choices"]
            next(iter(chat))
            waiter = threading.Thread(target=non_streamed)
            waiter.start()
            server.wait_until(lambda e: len(e.request_ids()) == 4)  # both choices, the stream, the plain one
            _end_requests(server)
            rest = list(events)
        with pytest.raises(openai.APIError, match="shutting down"):
            for _ in chat:
                pass
        waiter.join(30)
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2][6:])["error"]["code"] == "shutting_down"
    assert plain["response"].status_code == 503 and plain["response"].json()["error"]["code"] == "shutting_down"
    server.check_integrity()  # aborted in the engine: nothing held, every block zero
    later = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert later.status_code == 503 and later.json()["error"]["code"] == "shutting_down"
