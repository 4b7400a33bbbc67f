"""Independent capture at the relay: with default settings every request body and every response
chunk that passes the relay has one of the documented bucket sizes (docs/shape-hiding.md), whatever
the prompt's and the answer's lengths. A TCP tap in front of the relay records each connection's
bytes; the test parses HTTP/1.1 and the OHTTP framing itself."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import pytest

from tests.cluster.tap import Tap
from tests.support.ohttp_frames import chunked_ciphertexts
from tests.support.private_path import client_config
from traceless.privacy.shape import BUCKETS, STREAM_CHUNK
from traceless_tools.client.private_client import PrivateClient
from traceless_tools.local.services import free_port
from traceless_tools.local.up import Deployment, UpOptions

pytestmark = pytest.mark.slow

REQ_OVERHEAD = 7 + 32 + 16  # message/ohttp-req: key id and algorithms, X25519 share, AES-128-GCM tag
CHUNKED_REQ_OVERHEAD = REQ_OVERHEAD + 1  # message/ohttp-chunked-req: the final chunk's indicator (one chunk)
RES_OVERHEAD = 16 + 16  # message/ohttp-res: response nonce, tag
TAG = 16  # AES-128-GCM, the key config's first choice


class FlowTap(Tap):
    """A Tap that keeps each connection's two directions apart."""

    def __init__(self, target_port: int):
        self.flows: dict[tuple[int, int], dict[str, bytearray]] = {}
        super().__init__(target_port)

    def _pump(self, src: socket.socket, dst: socket.socket):
        key = (min(id(src), id(dst)), max(id(src), id(dst)))
        direction = "response" if src.getpeername()[1] == self.target_port else "request"
        with self._lock:
            buf = self.flows.setdefault(key, {"request": bytearray(), "response": bytearray()})[direction]
        try:
            while data := src.recv(65536):
                with self._lock:
                    buf += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class TappedRelay(Deployment):
    def __init__(self, opts):
        super().__init__(opts)
        self.tap: FlowTap | None = None

    def link(self, target: str, url: str) -> str:
        if target != "relay":
            return url
        self.tap = FlowTap(urlparse(url).port)
        return f"http://127.0.0.1:{self.tap.port}"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    d = TappedRelay(
        UpOptions(
            [1],
            free_port(),
            str(tmp_path_factory.mktemp("up")),
            ["--dtype", "float32", "--kv-cache-memory", "256MiB", "--max-model-len", "2048"],
        )
    )
    d.endpoints = d.start()
    try:
        yield d
    finally:
        d.stop()


def _head(data: bytearray, pos: int) -> tuple[str, dict[str, str], int]:
    end = data.index(b"\r\n\r\n", pos)
    lines = bytes(data[pos:end]).decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return lines[0], headers, end + 4


def _body(data: bytearray, pos: int, headers: dict[str, str]) -> tuple[bytes, int]:
    if "content-length" in headers:
        n = int(headers["content-length"])
        return bytes(data[pos : pos + n]), pos + n
    if headers.get("transfer-encoding") != "chunked":
        return b"", pos  # a request without a body (GET)
    out = bytearray()
    while True:
        eol = data.index(b"\r\n", pos)
        size = int(bytes(data[pos:eol]).split(b";")[0], 16)
        pos = eol + 2
        if size == 0:
            return bytes(out), data.index(b"\r\n", pos) + 2  # no trailers
        out += data[pos : pos + size]
        pos += size + 2


def exchanges(flow: dict[str, bytearray]) -> list[tuple[str, dict, bytes, dict, bytes]]:
    """(request line, request headers, request body, response headers, response body), in order."""
    out, req, res, rp, sp = [], flow["request"], flow["response"], 0, 0
    while rp < len(req):
        line, rh, rp = _head(req, rp)
        body, rp = _body(req, rp, rh)
        _, sh, sp = _head(res, sp)
        answer, sp = _body(res, sp, sh)
        out.append((line, rh, body, sh, answer))
    return out


def _send(config, calls: list[tuple[str, dict]]) -> None:
    """The calls one after another, from a client of their own."""
    client = PrivateClient(config)
    try:
        for kind, body in calls:
            call = client.chat if kind == "chat" else client.completions
            if body.get("stream"):
                events = list(call(body))
                assert events[-1] == b"data: [DONE]\n\n" and len(events) >= 2
            else:
                answer = call(body)
                assert kind == "chat" or answer["choices"][0]["text"] is not None
    finally:
        client.close()


def test_every_request_and_response_chunk_at_the_relay_has_a_bucket_size(deployment):
    e = deployment.endpoints
    assert deployment.tap is not None
    config = client_config(e, f"http://127.0.0.1:{deployment.tap.port}")
    short, long = "Hi", " ".join(f"word{i}" for i in range(200))  # ~1.5 KB: the next bucket up
    jobs = []
    for prompt in (short, long):
        for max_tokens in (1, 12):
            body = {
                "model": e["model"],
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            jobs.append([("completions", body), ("completions", {**body, "stream": True})])
        chat = {"model": e["model"], "messages": [{"role": "user", "content": prompt}], "max_tokens": 8}
        jobs.append([("chat", chat), ("chat", {**chat, "stream": True})])
    # the six pairs side by side, each from its own client: a shaped stream lasts its budgets
    # whatever the node does, and the relay sees each connection apart
    with ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(lambda calls: _send(config, calls), jobs))
    with deployment.tap._lock:
        flows = [{k: bytearray(v) for k, v in f.items()} for f in deployment.tap.flows.values()]
    seen = {"ohttp-req": set(), "ohttp-res": set(), "chunked-req": set(), "chunk": set(), "streams": 0}
    for flow in flows:
        for line, rh, body, sh, answer in exchanges(flow):
            if not line.startswith("POST /pcc/v1/ohttp/"):
                continue
            if rh["content-type"] == "message/ohttp-req":
                assert len(body) - REQ_OVERHEAD in BUCKETS, len(body)
                assert sh["content-type"] == "message/ohttp-res" and len(answer) - RES_OVERHEAD in BUCKETS
                seen["ohttp-req"].add(len(body))
                seen["ohttp-res"].add(len(answer))
            else:
                assert rh["content-type"] == "message/ohttp-chunked-req"
                assert len(body) - CHUNKED_REQ_OVERHEAD in BUCKETS, len(body)
                assert sh["content-type"] == "message/ohttp-chunked-res"
                sizes = chunked_ciphertexts(answer)
                assert set(sizes) == {STREAM_CHUNK + TAG}, sizes
                seen["chunked-req"].add(len(body))
                seen["chunk"].update(sizes)
                seen["streams"] += 1
    print(seen)
    assert seen["streams"] == 6  # every call went through the tap, and was parsed
    assert len(seen["ohttp-req"]) == 2 and len(seen["chunked-req"]) == 2  # the short and the long prompt's buckets
