"""`traceless up` as a user runs it: a process that starts the whole private path and, however it
is told to stop (Ctrl-C, `kill`, a closed terminal), stops every service it started."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from traceless_tools.local.services import free_port


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_up_stops_every_service_it_started_on_kill(tmp_path, tiny_llama_dir, sig):
    port, state = free_port(), tmp_path / "state"
    # start_new_session: like a service manager's process, and so the test's own group is not signalled
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "traceless_tools.cli",
            "up",
            "--nodes",
            "1",
            "--port",
            str(port),
            "--state-dir",
            str(state),
            "--node-args",
            f"--model {tiny_llama_dir} --dtype float32 --kv-cache-memory 64MiB",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not (state / "endpoints.json").exists():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "traceless up did not start"
            time.sleep(0.5)
        endpoints = json.loads((state / "endpoints.json").read_text())
        for secret_file in ("endpoints.json", "api-key", "api-keys.json"):  # each holds the API key
            assert (state / secret_file).stat().st_mode & 0o777 == 0o600, secret_file
        assert httpx.get(endpoints["proxy"] + "/health", timeout=30).status_code == 200
        services = _children(proc.pid)
        assert len(services) == 7  # log, witness, issuer, gateway, relay, node, proxy
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=90)
        assert "stopping" in out
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in services) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in services if _alive(p)], "services outlived traceless up"
        with pytest.raises(httpx.TransportError):
            httpx.get(endpoints["proxy"] + "/health", timeout=2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_node_that_fails_at_start_fails_up_and_its_log_is_kept(tiny_llama_dir):
    """Once: the message pointed at a log in a temporary directory `up` had already deleted, and the
    status was 0."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "traceless_tools.cli",
            "up",
            "--nodes",
            "1",
            "--port",
            str(free_port()),
            "--node-args",
            f"--model {tiny_llama_dir} --dtype float32 --kv-cache-memory 64MiB --max-model-len 100000",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = next(li for li in proc.stderr.splitlines() if "node0 exited during startup" in li)
    log = Path(line.split("(see ")[1].rstrip(")"))
    assert log.is_file() and "max_model_len 100000 exceeds" in log.read_text()
    state = log.parent.parent
    assert sorted(p.name for p in state.iterdir()) == ["logs"]  # keys and the log's state are gone
    shutil.rmtree(state)
