"""HTTP/1.1 over a bare socket, for what httpx will not do: send a request's head and hold its
body back (or trickle it), and read whatever status comes back meanwhile."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit


def connect(url: str, timeout_s: float = 5.0) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout_s)
    return sock


def head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_status(sock: socket.socket) -> int | None:
    """The status of the first response on `sock`; None when the server closed without one."""
    data = b""
    while b"\r\n" not in data:
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
    return int(data.split(b" ", 2)[1])


def read_response(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (or the socket times out)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return data
        if not chunk:
            return data
        data += chunk
