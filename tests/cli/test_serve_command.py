"""`traceless serve` as a process: after canary requests end, its memory holds none of them
(it scrubs freed memory as nodes do)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time

import httpx
import pytest

from traceless_tools.audit.memscan import scan_process
from traceless_tools.local.services import spawn_serve


def _send(url: str, model: str, canaries: dict[str, str]) -> None:
    c = canaries
    with httpx.Client(timeout=120) as client:
        assert (
            client.post(
                url + "/v1/completions", json={"model": model, "prompt": f"w5 {c['plain']}", "max_tokens": 4}
            ).status_code
            == 200
        )
        assert (
            client.post(
                url + "/v1/chat/completions",
                json={
                    "model": model,
                    "messages": [{"role": "user", "content": f"w6 {c['chat']}"}],
                    "max_tokens": 4,
                },
            ).status_code
            == 200
        )
        with client.stream(
            "POST",
            url + "/v1/completions",
            json={"model": model, "prompt": f"w7 {c['stream']}", "max_tokens": 4, "stream": True},
        ) as r:
            assert r.status_code == 200 and b"".join(r.iter_raw())
        with client.stream(
            "POST",
            url + "/v1/completions",
            json={"model": model, "prompt": f"w8 {c['abort']}", "max_tokens": 100, "ignore_eos": True, "stream": True},
        ) as r:
            next(r.iter_raw())  # then leave: the server aborts the request
        assert (
            client.post(
                url + "/v1/completions", json={"model": model, "prompt": c["fail"], "frobnicate": c["fail"]}
            ).status_code
            == 400
        )


def test_serve_holds_no_canary_after_requests_end(tiny_llama_dir):
    canaries = {p: f"TRACELESS-CANARY-{p}-{secrets.token_hex(8)}" for p in ("plain", "chat", "stream", "abort", "fail")}
    with spawn_serve(
        "--model", str(tiny_llama_dir), "--dtype", "float32", "--kv-cache-memory", "1MiB", "--max-model-len", "128"
    ) as serve:
        model = httpx.get(serve.url + "/v1/models").json()["data"][0]["id"]
        _send(serve.url, model, canaries)
        time.sleep(3.0)  # the engine's idle work: a garbage collection once quiet
        found = scan_process(serve.proc.pid, [c.encode() for c in canaries.values()])
        assert sum(found.values()) == 0, {k.decode().split("-")[2]: v for k, v in found.items() if v}


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--port", "8123", "--metrics-port", "8123"], "--metrics-port must differ from --port"),
        (["--metrics-min-requests", "-1"], "minimum number of requests"),
        (["--metrics-window", "0"], "positive number of seconds"),
        (["--metrics-epsilon", "0"], "telemetry epsilon must be a number from 0.01"),
        (["--metrics-epsilon", "none"], "a number, or off"),
    ],
)
def test_serve_refuses_metrics_on_the_public_port_and_bad_windows(extra, message):
    r = subprocess.run(
        [sys.executable, "-m", "traceless_tools.cli", "serve", *extra], capture_output=True, text=True, timeout=120
    )
    assert r.returncode != 0 and message in r.stderr


def test_serve_exits_70_when_its_engine_stops_for_good(tiny_llama_dir, tmp_path):
    from traceless.cli.serve import ENGINE_STOPPED_EXIT
    from traceless.server.async_engine import AsyncEngine
    from traceless_tools.local.processes import free_port, wait_ready

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PYTHONUNBUFFERED": "1"}
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.broken_serve",
                "--model",
                str(tiny_llama_dir),
                "--dtype",
                "float32",
                "--kv-cache-memory",
                "1MiB",
                "--max-model-len",
                "128",
                "--no-scrub-freed-memory",
                "--port",
                str(port),
                "--metrics-port",
                "0",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(proc, url + "/health", what="serve")
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        codes = []
        # every step fails: each failure fails its request and restarts the engine, until the
        # restart budget is spent and the engine stays stopped
        for _ in range(AsyncEngine.MAX_RESTARTS + 1):
            r = httpx.post(url + "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2}, timeout=60)
            codes.append((r.status_code, r.json()["error"]["code"]))
        assert proc.wait(60) == ENGINE_STOPPED_EXIT
    finally:
        if proc.poll() is None:
            proc.kill()
    text = (tmp_path / "serve.log").read_text()
    assert codes == [(503, "engine_dead")] * (AsyncEngine.MAX_RESTARTS + 1), codes
    assert '"event":"engine.stopped"' in text and "exiting (70) for a supervisor to restart" in text
    assert "Traceback" not in text
