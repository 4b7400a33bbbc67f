"""Connection limits (http/limits.py) on both parsers, with short limits: slow heads and bodies are
cut off, idle connections closed, a request answered before its body is read gets its answer and
a lingering close (not a drain of the whole body), a flood of connections gets a JSON 503, and an
honest client is served throughout."""

import threading
import time

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.cluster import _raw as raw
from traceless.http.limits import ConnectionLimits, uvicorn_options
from traceless.http.serve import serve_in_thread

LIMITS = ConnectionLimits(
    max_connections=16,
    head_timeout_s=0.6,
    body_timeout_s=0.6,
    keep_alive_s=0.6,
    linger_s=0.3,
    linger_bytes=64 * 1024,
    max_head_bytes=8 * 1024,
)


class Recorder:
    def __init__(self) -> None:
        self.disconnects = 0
        self.lock = threading.Lock()

    def app(self) -> Starlette:
        async def echo(request: Request):
            try:
                body = await request.body()
            except ClientDisconnect:
                with self.lock:
                    self.disconnects += 1
                raise
            return JSONResponse({"bytes": len(body)})

        async def reject(request: Request):
            return JSONResponse({"error": {"message": "no"}}, status_code=401)

        async def ok(request: Request):
            return JSONResponse({"ok": True})

        return Starlette(
            routes=[
                Route("/echo", echo, methods=["POST"]),
                Route("/reject", reject, methods=["POST"]),
                Route("/ok", ok),
            ]
        )


@pytest.fixture(params=["httptools", "h11"], scope="module")
def served(request):
    recorder = Recorder()
    config = uvicorn.Config(
        recorder.app(), log_config=None, access_log=False, lifespan="on", **uvicorn_options(LIMITS, request.param)
    )
    with serve_in_thread(server=uvicorn.Server(config)) as url:
        yield url, recorder


def _honest(url):
    assert httpx.get(url + "/ok", timeout=5).json() == {"ok": True}


def _closed_within(sock, seconds) -> float:
    """Seconds until the server closed `sock` (fails past `seconds`)."""
    started = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for more than {seconds} s")
    return time.monotonic() - started


def test_an_idle_connection_is_closed_after_the_head_timeout(served):
    url, _ = served
    with raw.connect(url) as sock:
        assert _closed_within(sock, 3) >= LIMITS.head_timeout_s * 0.8
    _honest(url)


def test_a_trickled_head_is_cut_off(served):
    url, _ = served
    with raw.connect(url) as sock:
        sock.sendall(b"GET /ok HTTP/1.1\r\nhost: x\r\n")
        started = time.monotonic()
        sock.settimeout(0.05)
        closed = False
        while not closed and time.monotonic() - started < 5:
            try:
                sock.sendall(b"x")  # one byte of a header name every 50 ms: never a whole head
                closed = sock.recv(1) == b""
            except TimeoutError:
                pass
            except OSError:
                closed = True
        assert closed and time.monotonic() - started < LIMITS.head_timeout_s + 1.5
    _honest(url)


def test_a_trickled_body_is_cut_off_and_the_app_sees_a_disconnect(served):
    url, recorder = served
    before = recorder.disconnects
    with raw.connect(url) as sock:
        sock.sendall(raw.head("POST", "/echo", {"content-length": "1000"}) + b"x" * 10)
        assert _closed_within(sock, 3) < LIMITS.body_timeout_s + 1.5
    deadline = time.monotonic() + 3
    while recorder.disconnects == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert recorder.disconnects == before + 1
    _honest(url)


def test_an_answer_before_the_body_lingers_briefly_instead_of_draining(served):
    """401 on the head of a 100 MiB upload: the client reads its 401, and the server stops reading
    after at most linger_bytes / linger_s, not after 100 MiB."""
    url, _ = served
    sent = 0
    with raw.connect(url) as sock:
        sock.sendall(raw.head("POST", "/reject", {"content-length": str(100 * 2**20)}))
        assert raw.read_status(sock) == 401
        sock.settimeout(3)
        chunk = b"\0" * 65536
        started = time.monotonic()
        try:
            while sent < 100 * 2**20:
                sent += sock.send(chunk)
        except OSError:
            pass
        elapsed = time.monotonic() - started
    print(
        f"lingering close: the client got {sent / 2**20:.2f} MiB out of 100 MiB in before the close ({elapsed:.2f} s)"
    )
    assert sent < 16 * 2**20  # the linger budget, plus what the kernel's socket buffers take
    _honest(url)


def test_an_early_answer_says_connection_close_so_the_client_does_not_reuse_it(served):
    url, _ = served
    with httpx.Client(base_url=url, timeout=5) as http:
        for _ in range(3):
            early = http.post("/reject", content=b"x" * 100_000)
            assert early.status_code == 401 and early.headers["connection"] == "close"
            assert http.get("/ok").status_code == 200  # on a new connection, not the closing one
            read = http.post("/echo", content=b"x" * 100_000)  # a body read to its end: kept alive
            assert read.json() == {"bytes": 100_000} and "connection" not in read.headers


def test_keep_alive_still_works_and_idle_keep_alive_is_closed(served):
    url, _ = served
    with httpx.Client(base_url=url, timeout=5) as http:
        for _ in range(3):
            assert http.post("/echo", content=b"abc").json() == {"bytes": 3}
            time.sleep(LIMITS.head_timeout_s / 3)  # below every deadline
    with raw.connect(url) as sock:
        sock.sendall(raw.head("GET", "/ok", {}))
        assert raw.read_status(sock) == 200
        assert _closed_within(sock, 3) < LIMITS.keep_alive_s + 1.5


def test_a_head_over_the_cap_is_refused(served):
    url, _ = served
    with raw.connect(url) as sock:
        sock.sendall(raw.head("GET", "/ok", {"x-big": "a" * (LIMITS.max_head_bytes * 2)}))
        assert raw.read_status(sock) in (431, 400)
    _honest(url)


def test_connections_over_the_cap_get_a_json_503_and_honest_clients_return_after(served):
    url, _ = served
    held = [raw.connect(url) for _ in range(LIMITS.max_connections)]
    try:
        time.sleep(0.1)
        with raw.connect(url) as extra:
            extra.sendall(raw.head("GET", "/ok", {}))
            reply = raw.read_response(extra)
        assert reply.startswith(b"HTTP/1.1 503") and b'"too_many_connections"' in reply
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    _honest(url)


def test_limits_validate():
    with pytest.raises(ValueError):
        ConnectionLimits(max_connections=0)
    with pytest.raises(ValueError):
        ConnectionLimits(body_timeout_s=0)
