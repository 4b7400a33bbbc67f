"""Ctrl-C, as an operator and a user press it: `traceless serve` bounds its drain and says so (an
event on stderr), then ends each open stream properly (an error event, then [DONE]: the openai
client raises instead of hanging or seeing a cut); a second Ctrl-C ends them at once. `traceless
chat` streams its answer; Ctrl-C ends the answer and returns to the prompt, Ctrl-C at the prompt
ends the chat. No traceback. (That the ended requests' blocks are freed and zeroed is checked
in-process: tests/server/test_shutdown.py and tests/node/test_node.py.)"""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import openai
import pytest

from tests.conftest import make_tiny_model
from tests.support.terminal import Terminal
from traceless_tools.local.services import spawn_serve

EOS = 2  # make_tiny_model's eos_token_id


@pytest.fixture(scope="module")
def endless_model(tmp_path_factory):
    """A tiny model with an 8192-token context whose greedy answers never end on EOS: its output
    row is zero, so EOS's logit (0) stays below the largest of the others."""
    from safetensors.torch import load_file, save_file

    path = make_tiny_model(tmp_path_factory.mktemp("endless"), "llama", max_position_embeddings=8192)
    weights = load_file(path / "model.safetensors")
    weights["lm_head.weight"][EOS] = 0.0
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


def _serve(model, shutdown_timeout: float):
    return spawn_serve(
        "--model",
        str(model),
        "--dtype",
        "float32",
        "--kv-cache-memory",
        "8MiB",
        "--max-model-len",
        "8192",
        "--shutdown-timeout",
        str(shutdown_timeout),
    )


LONG = {"prompt": "hello", "max_tokens": 8000, "stream": True, "ignore_eos": True}  # ~20 s on one core


def test_serve_ctrl_c_ends_a_long_stream_when_the_drain_times_out(endless_model):
    with _serve(endless_model, 1.0) as serve:
        client = openai.OpenAI(base_url=serve.url + "/v1", api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        stream = client.completions.create(
            model=model,
            prompt=LONG["prompt"],
            max_tokens=LONG["max_tokens"],
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks, sent = 0, None
        with pytest.raises(openai.APIError) as error:
            for _ in stream:
                chunks += 1
                if chunks == 3:
                    os.kill(serve.proc.pid, signal.SIGINT)
                    sent = time.monotonic()
        ended_after = time.monotonic() - sent
        assert "shutting down" in str(error.value)
        assert 0.8 < ended_after < 15, ended_after  # the drain's 1 s, not the stream's ~20 s
        assert serve.proc.wait(30) == 0
        log = serve.logs().decode()
    assert '"event":"service.stopping","component":"server","drain_s":1.0' in log
    assert '"event":"service.ending_requests","component":"server","reason":"drain_timed_out"' in log
    assert "Traceback" not in log


def test_serve_second_ctrl_c_ends_the_streams_at_once_with_done(endless_model):
    with _serve(endless_model, 300.0) as serve:
        model = httpx.get(serve.url + "/v1/models").json()["data"][0]["id"]
        with httpx.stream("POST", serve.url + "/v1/completions", json={"model": model, **LONG}, timeout=60) as r:
            events = (line for line in r.iter_lines() if line.startswith("data: "))
            assert json.loads(next(events)[6:])["choices"]
            os.kill(serve.proc.pid, signal.SIGINT)
            time.sleep(1.0)
            assert serve.proc.poll() is None  # draining: the stream goes on
            os.kill(serve.proc.pid, signal.SIGINT)
            sent = time.monotonic()
            rest = list(events)
        ended_after = time.monotonic() - sent
        assert ended_after < 15, ended_after  # not the 300 s drain
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][6:])["error"]["code"] == "shutting_down"
        assert serve.proc.wait(30) == 0
        log = serve.logs().decode()
    assert '"event":"service.ending_requests","component":"server","reason":"second_signal"' in log
    assert "Traceback" not in log


def test_chat_streams_and_ctrl_c_ends_the_answer_then_the_chat(endless_model):
    term = Terminal(
        "chat",
        "--model",
        str(endless_model),
        "--dtype",
        "float32",
        "--kv-cache-memory",
        "8MiB",
        "--max-model-len",
        "8192",
        "--max-tokens",
        "8000",
    )
    try:
        assert term.read_until(b"you> "), term.output
        term.type("hello there")
        assert term.read_until(b"assistant> ")
        start = len(term.output)
        deadline = time.monotonic() + 30  # a loaded machine may take a while to the first tokens
        while len(term.output) - start <= 20 and time.monotonic() < deadline:
            term.drain(0.5)
        streamed = len(term.output) - start
        assert streamed > 20, term.output[-200:]  # the answer shows while it is made (it is far from done)
        term.interrupt()
        assert term.read_until(b"[interrupted]", 30, start)
        assert term.read_until(b"you> ", 30, start), term.output[-300:]
        term.type("and again")  # the chat goes on after an interrupted answer
        again = len(term.output)
        assert term.read_until(b"assistant> ", 30, again)
        term.drain(0.3)
        term.interrupt()
        assert term.read_until(b"you> ", 30, again)
        # readline draws the prompt before it waits: a signal in between waits for the next key
        # (CPython checks signals when its wait is interrupted), as no person's Ctrl-C would come
        term.drain(0.5)
        term.interrupt()  # at the prompt: the chat ends
        code = term.close()
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
    assert code == 0, term.output[-500:]
    assert b"Traceback" not in term.output and b"KeyboardInterrupt" not in term.output
