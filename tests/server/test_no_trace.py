"""Canaries sent as prompts appear nowhere: not in logs (stderr/stdout of the server process),
not in /metrics, not in any file the server wrote. Plain, streamed, failing and aborted requests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.support.serving import free_port

pytestmark = pytest.mark.slow


def token_id_patterns(ids: list[int]) -> list[str]:
    """How a token-id sequence could be written down: JSON lists, spaces, commas."""
    seq = ids[1:4] if len(ids) > 4 else ids  # any 3 consecutive ids of the canary
    return [",".join(map(str, seq)), ", ".join(map(str, seq)), " ".join(map(str, seq))]


def scan_files(root: Path, needles: list[bytes]) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits += [f"{path}: {n!r}" for n in needles if n in data]
    return hits


def test_canaries_leave_no_trace(tmp_path, real_llm):
    home, tmp, cwd = tmp_path / "home", tmp_path / "tmp", tmp_path / "cwd"
    for d in (home, tmp, cwd):
        d.mkdir()
    port, metrics_port = free_port(), free_port()
    env = {
        **os.environ,
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "PYTHONUNBUFFERED": "1",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "traceless_tools.cli",
            "serve",
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
            "--kv-cache-memory",
            "256MiB",
            "--max-model-len",
            "512",
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    canaries = {
        kind: f"CANARY-{kind}-{uuid.uuid4().hex[:12]}"
        for kind in ("plain", "stream", "fail", "abort", "chat", "echo", "tok", "schema", "tool", "badschema")
    }
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "server did not start"
            time.sleep(0.5)
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        c = httpx.Client(base_url=url, timeout=60)
        r = c.post("/v1/completions", json={"model": model, "prompt": f"Repeat: {canaries['plain']}", "max_tokens": 16})
        assert r.status_code == 200
        r = c.post(
            "/v1/chat/completions",
            json={
                "model": model,
                "max_tokens": 16,
                "messages": [{"role": "user", "content": f"Say {canaries['chat']} twice"}],
            },
        )
        assert r.status_code == 200
        # echo with logprobs, vLLM's prompt_logprobs and a logit_bias; tokenize and detokenize
        r = c.post(
            "/v1/completions",
            json={
                "model": model,
                "prompt": f"Echo back {canaries['echo']}",
                "echo": True,
                "logprobs": 2,
                "prompt_logprobs": 1,
                "max_tokens": 4,
                "logit_bias": {"42": 5},
            },
        )
        assert r.status_code == 200 and canaries["echo"] in r.json()["choices"][0]["text"]
        ids = c.post("/tokenize", json={"model": model, "prompt": canaries["tok"]}).json()["tokens"]
        assert canaries["tok"] in c.post("/detokenize", json={"model": model, "tokens": ids}).json()["prompt"]
        with c.stream(
            "POST",
            "/v1/completions",
            json={"model": model, "prompt": f"Echo {canaries['stream']}", "max_tokens": 16, "stream": True},
        ) as s:
            assert sum(1 for line in s.iter_lines() if line.startswith("data: ")) > 1
        # failing: an unsupported field, a context overflow and an unknown model, each carrying the canary
        for body in (
            {"prompt": canaries["fail"], "frobnicate": canaries["fail"]},
            {"prompt": (canaries["fail"] + " ") * 200},
            {"prompt": canaries["fail"], "model": canaries["fail"]},
            {"prompt": canaries["fail"], "logit_bias": {canaries["fail"]: 1}},
        ):
            r = c.post("/v1/completions", json={"model": model, **body})
            assert r.status_code in (400, 404)
            assert canaries["fail"] not in r.text  # error bodies do not echo what was sent
        # structured outputs and tools: the canary in a schema, a tool's description and its forced arguments
        schema = {"type": "object", "properties": {"k": {"const": canaries["schema"]}}, "required": ["k"]}
        r = c.post(
            "/v1/chat/completions",
            json={
                "model": model,
                "max_tokens": 64,
                "messages": [{"role": "user", "content": "json"}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
            },
        )
        assert r.status_code == 200 and canaries["schema"] in r.text
        tool = {
            "type": "function",
            "function": {
                "name": "f",
                "description": canaries["tool"],
                "parameters": {
                    "type": "object",
                    "properties": {"v": {"const": canaries["tool"]}},
                    "required": ["v"],
                    "additionalProperties": False,
                },
            },
        }  # bounded: greedy decoding may not add keys until max_tokens
        r = c.post(
            "/v1/chat/completions",
            json={
                "model": model,
                "max_tokens": 128,
                "tools": [tool],
                "temperature": 0,
                "tool_choice": "required",
                "parallel_tool_calls": False,
                "messages": [{"role": "user", "content": "call"}],
            },
        )
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "tool_calls"
        bad = {"type": "json_schema", "json_schema": {"name": "b", "schema": {"not": {"const": canaries["badschema"]}}}}
        r = c.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "x"}], "response_format": bad},
        )
        assert r.status_code == 400 and canaries["badschema"] not in r.text
        # aborted mid-stream
        with c.stream(
            "POST",
            "/v1/completions",
            json={
                "model": model,
                "prompt": f"Story {canaries['abort']}",
                "max_tokens": 200,
                "ignore_eos": True,
                "stream": True,
            },
        ) as s:
            lines = s.iter_lines()
            next(lines)
            next(lines)
        time.sleep(1.0)
        assert c.get("/metrics").status_code == 404  # not on the public port
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert "traceless_requests_total" in metrics
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    logs = out + err
    assert b'"event":"http.request"' in logs and b'"route":"completions"' in logs  # the logs did record events
    assert b'"event":"request.finished"' not in logs  # no per-request record by default
    assert b'"event":"metrics.window"' not in logs  # fewer requests than a window needs
    tok = real_llm.get_tokenizer()
    needles = []
    for canary in canaries.values():
        needles.append(canary.encode())
        needles += [p.encode() for p in token_id_patterns(tok.encode(canary, add_special_tokens=False))]
    hay = {"server logs": logs, "metrics": metrics.encode()}
    hits = [f"{where}: {n!r}" for where, data in hay.items() for n in needles if n in data]
    hits += scan_files(tmp_path, needles)
    assert hits == []
    assert b"127.0.0.1:" not in logs  # no access log (client addresses)
    for line in logs.decode().splitlines():  # every line is an event from the schema
        assert line.startswith('{"ts":'), line[:80]
