"""Starting and stopping traceless services as processes on loopback (`traceless up`, audits, benchmarks)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

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


@contextmanager
def serve_in_thread(app=None, *, server=None, what: str = "the loopback service") -> Iterator[str]:
    """Serve `app` (or run a prepared uvicorn `server`) on a free loopback port in a daemon thread,
    lifespan on; yields its base URL and stops the server on exit."""
    import uvicorn

    if (app is None) == (server is None):
        raise ValueError("give exactly one of app and server")
    if server is None:
        server = uvicorn.Server(uvicorn.Config(app, access_log=False, log_config=None, server_header=False,
                                               date_header=False, lifespan="on"))
    # IPPROTO_TCP named: asyncio then sets TCP_NODELAY (else Nagle + delayed ACK: ~40 ms a call).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError(f"{what} did not start")
            time.sleep(0.005)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
