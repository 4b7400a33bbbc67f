"""Bodies at the boundary: a client that leaves (or is cut off) mid-body is a client error in the
events, not a server error; a streamed body is capped on the way."""

import time

import pytest
from starlette.routing import Route

from tests.cluster import _raw as raw
from traceless.http.app import create_app, endpoint
from traceless.http.body import read_body, stream_body
from traceless.http.limits import ConnectionLimits
from traceless.http.serve import serve_in_thread


async def _whole(request):
    await read_body(request, 10_000)
    raise AssertionError("unreachable: the body never completes")


async def _streamed(request):
    _, chunks = stream_body(request, 10_000)
    async for _ in chunks:
        pass
    raise AssertionError("unreachable: the body never completes")


@pytest.mark.parametrize("route", ["whole", "streamed"])
def test_a_body_cut_off_by_its_deadline_is_a_client_error(captured_events, route):
    routes = [
        Route("/whole", endpoint("server", "completions", _whole), methods=["POST"]),
        Route("/streamed", endpoint("server", "chat_completions", _streamed), methods=["POST"]),
    ]
    app = create_app("server", routes)
    with serve_in_thread(app, limits=ConnectionLimits(body_timeout_s=0.5)) as url:
        with raw.connect(url) as sock:
            sock.sendall(raw.head("POST", f"/{route}", {"content-length": "1000"}) + b"x" * 10)
            assert raw.read_response(sock) == b""  # closed at the deadline, nothing answered
        deadline = time.monotonic() + 5
        while not [e for e in captured_events() if e["event"] == "http.request"] and time.monotonic() < deadline:
            time.sleep(0.02)
    (request,) = [e for e in captured_events() if e["event"] == "http.request"]
    assert request["status_code"] == 400
    assert [e["error_kind"] for e in captured_events() if e["event"] == "http.error"] == ["invalid_request"]
