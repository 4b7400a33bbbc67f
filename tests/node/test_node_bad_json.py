"""A node answers bad JSON inside the encryption with a 400 `invalid_json`, never a 500."""

from __future__ import annotations

import json

from tests.support.bad_json import BAD_JSON
from tests.support.node import call_raw, tiny_node


def test_the_node_answers_400_inside_the_encryption(tiny_llama_dir):
    with tiny_node(tiny_llama_dir) as s:
        for name, raw in BAD_JSON.items():
            status, body = call_raw(s, b"/v1/completions", raw)
            assert (name, status, json.loads(body)["error"]["code"]) == (name, 400, "invalid_json")
