"""A node writes no log line per request: no `http.request` (a millisecond timestamp, the exact
duration) and no `http.error` (the inner status) unless it runs with --request-events, a measured
switch that is off by default."""

from __future__ import annotations

import json
import logging

import httpx

from tests.support.node import MODEL, call, tiny_node
from traceless.events import LOGGER_NAME
from traceless.node.settings import NodeSettings


def traffic(s) -> None:
    """A request that succeeds, one the inner API refuses, one that fails to decrypt, a 404, and the
    attestation and key routes."""
    assert call(s, b"/v1/completions", {"model": MODEL, "prompt": [5], "max_tokens": 2})[0] == 200
    assert call(s, b"/v1/completions", {"model": MODEL, "prompt": [5], "bogus": 1})[0] == 400
    r = httpx.post(s.url + "/pcc/v1/ohttp", content=b"\x00" * 64, headers={"content-type": "message/ohttp-req"})
    assert r.status_code == 400
    assert httpx.get(s.url + "/nowhere").status_code == 404
    assert httpx.get(s.url + "/pcc/v1/attestation", params={"nonce": "ab" * 16}).status_code == 200
    assert httpx.get(s.url + "/pcc/v1/ohttp-keys").status_code == 200


def http_events(caplog) -> list[dict]:
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == LOGGER_NAME]
    return [e for e in lines if e["event"].startswith("http.")]


def test_a_node_logs_no_line_per_request_by_default(tiny_llama_dir, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    with tiny_node(tiny_llama_dir) as s:
        traffic(s)
    assert http_events(caplog) == []


def test_request_events_log_each_request(tiny_llama_dir, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    with tiny_node(tiny_llama_dir, NodeSettings(MODEL, request_events=True)) as s:
        traffic(s)
    events = http_events(caplog)
    assert sum(e["event"] == "http.request" and e["route"] == "ohttp" for e in events) == 3
    assert {e["status_code"] for e in events if e["event"] == "http.error"} >= {400, 404}
