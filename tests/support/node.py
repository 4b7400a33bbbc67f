"""A private node on a tiny model, served on loopback, and encapsulated calls to it (through the
core's OHTTP call codec, privacy/ohttp/call.py: the bytes the client sends)."""

from __future__ import annotations

import json
from contextlib import contextmanager

import httpx

from tests.support.serving import serve
from traceless.config import EngineConfig
from traceless.entrypoints.build import build_engine
from traceless.node.app import create_node_app
from traceless.node.identity import NodeIdentity
from traceless.node.settings import NodeSettings
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.software import SoftwareAttester
from traceless.privacy.ohttp.call import CallResponse, encapsulate_call, open_response
from traceless.privacy.ohttp.media import response_media_type
from traceless.privacy.shape import split_sse
from traceless.server.async_engine import AsyncEngine

MODEL = "tiny"


@contextmanager
def tiny_node(model_dir, settings: NodeSettings = NodeSettings(MODEL), max_model_len: int = 128):
    engine = AsyncEngine(
        build_engine(
            EngineConfig(model=str(model_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=max_model_len)
        )
    )
    identity = NodeIdentity(
        SoftwareAttester(),
        Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32),
        capacity=1,
        node_url="http://node.test:8100",
    )
    with serve(create_node_app(engine, identity, settings), engine) as s:
        s.identity = identity
        yield s


def call_response(
    s, path: bytes, content: bytes | None, stream: bool = False, method: bytes | None = None
) -> CallResponse:
    """The inner response of one encapsulated call (`content` None: a GET)."""
    call = encapsulate_call(s.identity.keys.current.key_config, path, content, stream=stream, method=method)
    r = httpx.post(s.url + "/pcc/v1/ohttp", content=call.body, headers={"content-type": call.media_type}, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == response_media_type(call.media_type), r.text
    return open_response(call, r.content)


def call_raw(s, path: bytes, content: bytes) -> tuple[int, bytes]:
    """(inner status, inner body) of one encapsulated POST of `content`."""
    got = call_response(s, path, content)
    return got.status, got.content


def call(s, path: bytes, body, stream: bool = False, method: bytes | None = None):
    """(status, decoded JSON) or, for a stream answered 200, (status, SSE events as a client reads
    them: whole events, padding dropped). `body` a dict, raw bytes, or None (a GET)."""
    content = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    got = call_response(s, path, content, stream, method)
    if stream and got.status == 200:
        return 200, split_sse(got.content)
    return got.status, json.loads(got.content)
