"""Start traceless services as real processes on loopback, for the audit and attack tools."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Service:
    name: str
    url: str
    proc: subprocess.Popen
    log_path: Path

    def logs(self) -> bytes:
        return self.log_path.read_bytes() if self.log_path.exists() else b""


def wait_ready(proc: subprocess.Popen, url: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the service exited during startup")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError("the service did not become ready")


@contextmanager
def spawn_serve(*args: str, name: str = "serve", workdir: Path | None = None):
    """`traceless serve ARGS` on a free port; yields a Service; stops it (SIGINT) on exit."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="traceless-audit-"))
    port = free_port()
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "traceless.cli", "serve", "--port", str(port), *args],
                                stdout=log, stderr=subprocess.STDOUT, cwd=workdir, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    service = Service(name, f"http://127.0.0.1:{port}", proc, log_path)
    try:
        wait_ready(proc, service.url + "/health")
        yield service
    finally:
        stop(proc)


def stop(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
