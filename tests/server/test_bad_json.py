"""The plaintext server answers bad JSON with a 400 `invalid_json`, never a 500, in the body and in
JSON text inside it (tool-call arguments, a schema given as a string)."""

from __future__ import annotations

import httpx
import pytest

from tests.support.bad_json import BAD_JSON


@pytest.mark.parametrize("raw", BAD_JSON.values(), ids=BAD_JSON.keys())
def test_the_plaintext_server_answers_400(tiny_server, raw):
    r = httpx.post(tiny_server.url + "/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_json_text_inside_the_body_refuses_a_lone_surrogate(tiny_server):
    bad_args = {
        "model": "tiny",
        "max_tokens": 1,
        "messages": [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": "\\ud800"}'}}
                ],
            },
            {"role": "user", "content": "w5"},
        ],
    }
    r = httpx.post(tiny_server.url + "/v1/chat/completions", json=bad_args)
    assert r.status_code == 400 and "arguments" in r.json()["error"]["message"]
    bad_schema = {
        "model": "tiny",
        "prompt": "w5",
        "max_tokens": 1,
        "structured_outputs": {"json": '{"const": "\\ud800"}'},
    }
    r = httpx.post(tiny_server.url + "/v1/completions", json=bad_schema)
    assert r.status_code == 400 and "JSON Schema" in r.json()["error"]["message"]
