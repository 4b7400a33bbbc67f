"""Starting and stopping traceless services as processes on loopback (`traceless up`, audits, benchmarks)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import httpx


class StartupError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, url: str, timeout: float = 180.0, what: str = "the service") -> None:
    """Poll `url` until it answers 200; StartupError if the process exits or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StartupError(f"{what} exited during startup")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise StartupError(f"{what} did not become ready in {timeout:.0f}s")


def stop(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGINT to the process group (graceful shutdown), SIGKILL if it lingers."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
