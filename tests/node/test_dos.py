"""The node under slowloris clients, 100 MiB bodies, 500 connections and a flood of requests that
do not decapsulate: honest encrypted requests keep being served, memory stays bounded (threat T28,
docs/threat-model.md). Figures are printed (pytest -s shows them)."""

import json

import httpx

from tests import dos
from tests.support.serving import serve
from traceless.config import EngineConfig
from traceless.entrypoints.build import build_engine
from traceless.node.app import create_node_app
from traceless.node.identity import NodeIdentity
from traceless.node.settings import NodeSettings
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.software import SoftwareAttester
from traceless.privacy.ohttp.call import encapsulate_call, open_response
from traceless.server.async_engine import AsyncEngine

OHTTP_REQ = {"content-type": "message/ohttp-req"}


def test_the_node_holds(tiny_llama_dir):
    engine = AsyncEngine(
        build_engine(EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=128))
    )
    identity = NodeIdentity(SoftwareAttester(), Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32))
    body = json.dumps({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2, "ignore_eos": True}).encode()
    with serve(create_node_app(engine, identity, NodeSettings("tiny")), engine, dos.TEST_LIMITS) as s:

        def honest():
            call = encapsulate_call(identity.keys.current.key_config, b"/v1/completions", body, stream=False)
            response = httpx.post(s.url + "/pcc/v1/ohttp", content=call.body, headers=OHTTP_REQ, timeout=30)
            assert response.status_code == 200, (response.status_code, response.text)
            reply = open_response(call, response.content)
            assert reply.status == 200 and json.loads(reply.content)["usage"]["completion_tokens"] == 2

        garbage = b"\x01\x00\x20" + b"\x00" * 200  # names the key, but does not decapsulate
        target = dos.Target(
            "node", s.url, honest, ("POST", "/pcc/v1/ohttp", OHTTP_REQ, garbage), 400, ("/pcc/v1/ohttp", OHTTP_REQ)
        )
        dos.run_all(target)
        s.check_integrity()
