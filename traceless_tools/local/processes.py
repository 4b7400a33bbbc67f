"""Starting and stopping traceless services as processes on loopback (`traceless up`, audits, benchmarks)."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import httpx


class StartupError(RuntimeError):
    pass


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel send the child SIGTERM when this process dies, however it
    dies (`kill -9` included), so no service outlives the command that started it and goes on
    serving as an orphan; SIGTERM, not SIGKILL, so the service still shuts down cleanly (its
    requests aborted, their buffers and spill files released). None where Linux's prctl is missing.
    The kernel ties the signal to the thread that started the child: start services from a thread
    that lives as long as they should (the main thread)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the child between fork and exec only calls it
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


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
