"""Denial-of-service checks shared by every component's test (threat T28, docs/threat-model.md): slowloris
clients, a 100 MiB body (declared and chunked), 500 concurrent connections and a flood of refused
requests, each while an honest client keeps being served; the process's resident memory is
sampled throughout and its growth printed and bounded.

The service runs in this process (a thread), so the resident set measured is the service's plus
the attackers' (a few sockets and small buffers: nothing that grows with the body sizes).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from traceless.http.limits import ConnectionLimits

# Short client deadlines so a test can watch them fire; everything else at the documented default.
TEST_LIMITS = ConnectionLimits(head_timeout_s=1.5, body_timeout_s=1.5)
MIB = 2**20
BODY_BYTES = 100 * MIB
CONNECTIONS = 500
FLOOD = 200
SLOW_CLIENTS = 40
# Resident growth allowed during the attacks: well under the 100 MiB body, generous for the
# allocator's own slack and the 500 sockets' buffers.
MAX_GROWTH = 48 * MIB


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def peak_rss():
    """Yields a dict whose "peak" is the highest resident size seen while the block ran."""
    seen = {"base": rss(), "peak": rss()}
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            seen["peak"] = max(seen["peak"], rss())
            time.sleep(0.01)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


@dataclass
class Target:
    """One component under attack. `honest()` makes one honest request and asserts it succeeded;
    `refused` is (method, path, headers, body) of a request the component refuses cheaply (an
    invalid token, a foreign Host...) with `refused_status`; `upload` is (path, headers) of the
    POST that takes a body."""

    name: str
    url: str
    honest: Callable[[], None]
    refused: tuple[str, str, dict[str, str], bytes]
    refused_status: int
    upload: tuple[str, dict[str, str]]
    figures: dict[str, float] = field(default_factory=dict)


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=5)


def _head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(65536) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def slowloris(target: Target, limits: ConnectionLimits = TEST_LIMITS) -> None:
    """Half the clients trickle a head, half a body, a byte every 200 ms; honest requests are served
    meanwhile, and the server closes every slow client by its deadline."""
    path, headers = target.upload
    socks = []
    for i in range(SLOW_CLIENTS):
        sock = _connect(target.url)
        if i % 2:
            sock.sendall(_head("POST", path, {**headers, "content-length": str(MIB)}) + b"\0")
        else:
            sock.sendall(f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n".encode())
        socks.append(sock)
    started = time.monotonic()
    served = 0
    open_socks = list(socks)
    while open_socks and time.monotonic() - started < max(limits.head_timeout_s, limits.body_timeout_s) + 3:
        for sock in list(open_socks):
            try:
                sock.sendall(b"x")
            except OSError:
                open_socks.remove(sock)
                continue
            if _closed(sock):
                open_socks.remove(sock)
        if served < 3:
            target.honest()
            served += 1
        time.sleep(0.2)
    elapsed = time.monotonic() - started
    for sock in socks:
        sock.close()
    target.figures["slowloris_cut_off_s"] = round(elapsed, 2)
    assert served >= 1, "no honest request was served while the slow clients trickled"
    assert not open_socks, f"{len(open_socks)} slow clients still connected after {elapsed:.1f} s"
    target.honest()


def _send_body(url: str, path: str, headers: dict[str, str], declared: bool) -> tuple[int | None, int]:
    """(status seen, bytes the server let in) for a 100 MiB upload, declared or chunked."""
    sock = _connect(url)
    sent = 0
    status = None
    chunk = b"\0" * (256 * 1024)
    framing = {"content-length": str(BODY_BYTES)} if declared else {"transfer-encoding": "chunked"}
    try:
        sock.sendall(_head("POST", path, {**headers, **framing}))
        sock.settimeout(5)
        while sent < BODY_BYTES:
            piece = chunk if declared else b"%x\r\n" % len(chunk) + chunk + b"\r\n"
            sock.sendall(piece)
            sent += len(chunk)
    except OSError:
        pass
    try:
        sock.settimeout(5)
        data = sock.recv(4096)
        if data.startswith(b"HTTP/1.1 "):
            status = int(data.split(b" ", 2)[1])
    except OSError:
        pass
    sock.close()
    return status, sent


def big_bodies(target: Target) -> None:
    path, headers = target.upload
    for declared in (True, False):
        status, sent = _send_body(target.url, path, headers, declared)
        kind = "declared" if declared else "chunked"
        target.figures[f"body_{kind}_status"] = status or 0
        target.figures[f"body_{kind}_mib_let_in"] = round(sent / MIB, 2)
        assert sent < BODY_BYTES, f"the {kind} 100 MiB body was read to its end"
        # None: cut off before a status could be read; 502: a relay whose upstream refused the body
        # on its head and closed while the relay was still passing it on
        assert status is None or status in (401, 403, 413, 415, 502), status
        target.honest()


def connections(target: Target) -> None:
    """500 connections held open at once (each with the start of a request head): honest requests
    are still served. (The flood below is the test of many requests' worth of work.)"""
    path, _ = target.upload
    socks = []
    try:
        for _ in range(CONNECTIONS):
            sock = _connect(target.url)
            sock.sendall(f"POST {path} HTTP/1.1\r\n".encode())
            socks.append(sock)
        started = time.monotonic()
        target.honest()
        target.figures["honest_with_500_open_s"] = round(time.monotonic() - started, 3)
    finally:
        for sock in socks:
            sock.close()
    target.honest()


def flood(target: Target, concurrency: int = 50) -> None:
    """FLOOD refused requests, `concurrency` at a time, with honest requests among them."""
    method, path, headers, body = target.refused

    async def run() -> list[int]:
        statuses: list[int] = []
        limits = httpx.Limits(max_connections=concurrency)
        async with httpx.AsyncClient(base_url=target.url, timeout=30, limits=limits) as client:

            async def one() -> None:
                r = await client.request(method, path, headers=headers, content=body)
                statuses.append(r.status_code)

            for start in range(0, FLOOD, concurrency):
                await asyncio.gather(*(one() for _ in range(min(concurrency, FLOOD - start))))
        return statuses

    honest_done: list[int] = []
    honest_failed: list[BaseException] = []

    def honest_during() -> None:
        try:
            for _ in range(3):
                target.honest()
                honest_done.append(1)
        except BaseException as exc:  # reported by the test's thread below
            honest_failed.append(exc)

    thread = threading.Thread(target=honest_during)
    started = time.monotonic()
    thread.start()
    statuses = asyncio.run(run())
    thread.join(60)
    elapsed = time.monotonic() - started
    target.figures["flood_requests_per_s"] = round(len(statuses) / elapsed, 1)
    assert statuses.count(target.refused_status) == FLOOD, sorted(set(statuses))
    assert not honest_failed, f"an honest request failed during the flood: {honest_failed[0]!r}"
    assert len(honest_done) == 3


def run_all(target: Target, limits: ConnectionLimits = TEST_LIMITS) -> dict[str, float]:
    """Every attack in turn; prints and returns the figures (memory growth in MiB included)."""
    target.honest()  # warm: the first request's one-off allocations are not the attacks' doing
    started = time.monotonic()
    with peak_rss() as memory:
        slowloris(target, limits)
        big_bodies(target)
        connections(target)
        flood(target)
    growth = memory["peak"] - memory["base"]
    target.figures["attacks_s"] = round(time.monotonic() - started, 1)
    target.figures["rss_base_mib"] = round(memory["base"] / MIB, 1)
    target.figures["rss_peak_growth_mib"] = round(growth / MIB, 1)
    print(f"\n{target.name} under attack: " + ", ".join(f"{k}={v}" for k, v in target.figures.items()))
    assert growth < MAX_GROWTH, f"resident memory grew by {growth / MIB:.1f} MiB"
    return target.figures
