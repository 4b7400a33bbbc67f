"""A private node on a tiny model, served on loopback, and one encapsulated call to it."""
from __future__ import annotations

import json
from contextlib import contextmanager

import httpx

from tests.server.serving import serve
from traceless.config import EngineConfig
from traceless.entrypoints.build import build_engine
from traceless.node.app import create_node_app
from traceless.node.identity import NodeIdentity
from traceless.node.settings import NodeSettings
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.software import SoftwareAttester
from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.ohttp.gateway import encapsulate_request
from traceless.server.async_engine import AsyncEngine

MODEL = "tiny"


@contextmanager
def tiny_node(model_dir, settings: NodeSettings = NodeSettings(MODEL), max_model_len: int = 128):
    engine = AsyncEngine(build_engine(EngineConfig(model=str(model_dir), dtype="float32", kv_cache_memory=2**20,
                                                max_model_len=max_model_len)))
    identity = NodeIdentity(SoftwareAttester(), Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32),
                            capacity=1, node_url="http://node.test:8100")
    with serve(create_node_app(engine, identity, settings), engine) as s:
        s.identity = identity
        yield s


def call_raw(s, path: bytes, content: bytes) -> tuple[int, bytes]:
    """(inner status, inner body) of one encapsulated POST of `content`."""
    inner = bhttp.encode_request(bhttp.Request(b"POST", b"https", b"node", path, (), content))
    enc, ctx = encapsulate_request(s.identity.keys.current.key_config, inner)
    r = httpx.post(s.url + "/pcc/v1/ohttp", content=enc, headers={"content-type": "message/ohttp-req"})
    assert r.status_code == 200
    msg = bhttp.decode_response(ctx.decapsulate(r.content))
    return msg.status, msg.content


def call(s, path: bytes, body: dict) -> tuple[int, dict]:
    status, content = call_raw(s, path, json.dumps(body).encode())
    return status, json.loads(content)
