"""A command run on a pseudo-terminal, as a user at a terminal runs it: its output read as it
comes, lines typed, signals sent."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time


class Terminal:
    def __init__(self, *args: str):
        master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "traceless_tools.cli", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            close_fds=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        os.close(slave)
        self._master = master
        self.output = b""

    def read_until(self, text: bytes, timeout: float = 120.0, start: int = 0) -> bool:
        """Read until `text` appears in the output after offset `start` (or `timeout` passes)."""
        deadline = time.monotonic() + timeout
        while text not in self.output[start:] and time.monotonic() < deadline:
            if not self._read(0.2):
                if self.proc.poll() is not None:
                    break
        return text in self.output[start:]

    def drain(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self._read(0.1)

    def type(self, line: str) -> None:
        os.write(self._master, line.encode() + b"\n")

    def interrupt(self) -> None:
        """Ctrl-C (SIGINT to the command)."""
        os.kill(self.proc.pid, signal.SIGINT)

    def close(self) -> int | None:
        """Wait for the command (killed after 30 s); returns its exit status."""
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = None
        self.drain(0.3)
        os.close(self._master)
        return code

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self._master], [], [], timeout)
        if not ready:
            return False
        try:
            chunk = os.read(self._master, 65536)
        except OSError:  # the command closed the terminal
            return False
        self.output += chunk
        return bool(chunk)
