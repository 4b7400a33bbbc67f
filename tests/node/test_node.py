"""The private node end to end over OHTTP (tiny model; no gateway)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.support.node import call
from tests.support.serving import serve
from traceless import SamplingParams
from traceless.config import EngineConfig
from traceless.entrypoints.build import build_engine
from traceless.entrypoints.llm import LLM
from traceless.node.app import create_node_app
from traceless.node.identity import NodeIdentity
from traceless.node.settings import NodeSettings
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.software import SoftwareAttester, verify_attestation
from traceless.privacy.ohttp.call import encapsulate_call
from traceless.privacy.ohttp.keys import decode_ohttp_keys
from traceless.privacy.shape import ShapePolicy
from traceless.server.async_engine import AsyncEngine
from traceless.server.ballast import BALLAST_ID
from traceless.server.telemetry import Telemetry, WindowPolicy

MODEL = "tiny"


@pytest.fixture(scope="module")
def node(tiny_llama_dir):
    engine = AsyncEngine(
        build_engine(EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=128))
    )
    identity = NodeIdentity(
        SoftwareAttester(),
        Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32),
        capacity=3,
        node_url="http://node.test:8100",
    )
    # min_requests=0 and no noise: the telemetry's explicit off switches, so a test can count single requests
    telemetry = Telemetry(WindowPolicy(1e-6, 0, None), engine)
    with serve(create_node_app(engine, identity, NodeSettings(MODEL), telemetry), engine) as s:
        s.identity = identity
        s.telemetry = telemetry
        yield s


def test_attestation_binds_the_served_key(node):
    r = httpx.get(node.url + "/pcc/v1/attestation", params={"nonce": "ab" * 16}).json()
    keys = __import__("base64").b64decode(r["ohttp_keys"])
    assert decode_ohttp_keys(keys)[0] == node.identity.keys.current.key_config
    claims = verify_attestation(
        r["attestation"],
        [node.identity.attester.public_key],
        time.time(),
        expected_nonce=bytes.fromhex("ab" * 16),
        ohttp_keys=keys,
    )
    assert claims.measurement == node.identity.measurement
    assert claims.capacity == 3 and claims.node_url == "http://node.test:8100" and claims.attester_type == "software"
    assert httpx.get(node.url + "/pcc/v1/ohttp-keys").content == node.identity.ohttp_keys()
    assert httpx.get(node.url + "/pcc/v1/attestation", params={"nonce": "zz"}).status_code == 400


@pytest.mark.parametrize("state, code", [("restarting", "engine_restarting"), ("dead", "engine_dead")])
def test_a_node_whose_engine_cannot_serve_attests_nothing_and_says_why(node, state, code):
    setattr(node.engine, state, True)
    try:
        for path in ("/pcc/v1/attestation", "/health"):
            r = httpx.get(node.url + path, params={"nonce": "ab" * 16})
            assert r.status_code == 503
        assert r.json() == {"status": state}
        assert httpx.get(node.url + "/pcc/v1/attestation").json()["error"]["code"] == code
    finally:
        setattr(node.engine, state, False)
    assert httpx.get(node.url + "/pcc/v1/attestation", params={"nonce": "ab" * 16}).status_code == 200


def test_encapsulated_answers_equal_the_offline_engine(node, tiny_llama_dir):
    want = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20).generate(
        {"prompt_token_ids": [5, 6, 7]}, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False
    )[0]
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    status, data = call(node, b"/v1/completions", body)
    assert status == 200 and data["choices"][0]["text"] == want.outputs[0].text
    status, events = call(node, b"/v1/completions", {**body, "stream": True}, stream=True)
    assert status == 200 and events[-1] == b"data: [DONE]\n\n"
    text = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1])
    assert text == want.outputs[0].text
    node.check_integrity()


def test_inner_errors_come_back_encrypted(node):
    assert call(node, b"/v1/completions", b"{not json")[0] == 400
    assert call(node, b"/v1/embeddings", {})[0] == 404
    assert call(node, b"/v1/models", {})[0] == 405
    assert call(node, b"/tokenize", {"model": MODEL}, method=b"GET")[0] == 405
    assert call(node, b"/detokenize", {"model": MODEL, "tokens": [10**6]})[0] == 400
    assert call(node, b"/v1/completions", {"model": MODEL, "prompt": [5], "bogus": 1})[0] == 400
    status, body = call(node, b"/v1/completions", {"model": MODEL, "prompt": [5], "stream": True})
    assert status == 400 and body["error"]["param"] == "stream"  # streaming needs a chunked request
    assert call(node, b"/v1/chat/completions", {"model": MODEL, "messages": []}, stream=True)[0] == 400


def test_models_tokenize_and_detokenize_over_ohttp(node):
    status, models = call(node, b"/v1/models", b"", method=b"GET")
    assert status == 200 and models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == 128
    status, tok = call(node, b"/tokenize", {"model": MODEL, "prompt": "w5 w6 w7", "return_token_strs": True})
    assert status == 200 and tok == {
        "count": 3,
        "max_model_len": 128,
        "tokens": [5, 6, 7],
        "token_strs": ["w5", "w6", "w7"],
    }
    status, detok = call(node, b"/detokenize", {"model": MODEL, "tokens": [5, 6, 7]})
    assert status == 200 and detok == {"prompt": "w5 w6 w7"}
    status, info = call(node, b"/tokenizer_info", b"", method=b"GET")
    assert status == 200 and info["eos_token"] == "</s>" and info["model_max_length"] == 128


def test_tampered_ciphertext_is_refused_and_nothing_runs(node):
    enc = encapsulate_call(
        node.identity.keys.current.key_config,
        b"/v1/completions",
        json.dumps({"model": MODEL, "prompt": [5]}).encode(),
        stream=False,
    ).body
    bad = bytearray(enc)
    bad[-5] ^= 0x01
    r = httpx.post(node.url + "/pcc/v1/ohttp", content=bytes(bad), headers={"content-type": "message/ohttp-req"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "decapsulation_failed"
    r = httpx.post(node.url + "/pcc/v1/ohttp", content=b"plain", headers={"content-type": "application/json"})
    assert r.status_code == 415
    node.check_integrity()
    assert call(node, b"/v1/completions", {"model": MODEL, "prompt": [5], "max_tokens": 2})[0] == 200


def test_a_replayed_request_runs_once(node):
    """Threat T19 (docs/threat-model.md): the gateway replays an encapsulated request; the node runs it once."""
    enc = encapsulate_call(
        node.identity.keys.current.key_config,
        b"/v1/completions",
        json.dumps({"model": MODEL, "prompt": [5], "max_tokens": 2}).encode(),
        stream=False,
    ).body
    before = _requests_total(node)
    first = httpx.post(node.url + "/pcc/v1/ohttp", content=enc, headers={"content-type": "message/ohttp-req"})
    again = httpx.post(node.url + "/pcc/v1/ohttp", content=enc, headers={"content-type": "message/ohttp-req"})
    assert first.status_code == 200
    assert again.status_code == 409 and again.json()["error"]["code"] == "request_replayed"
    assert _requests_total(node) == before + 1
    node.check_integrity()


def _requests_total(node) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in node.telemetry.render().splitlines()
        if line.startswith("traceless_requests_total")
    )


def test_the_node_serves_no_plaintext_api(node):
    for method, path in (
        ("GET", "/v1/models"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/debug"),
        ("GET", "/admin"),
    ):
        assert httpx.request(method, node.url + path, json={}).status_code == 404
    assert httpx.get(node.url + "/health").status_code == 200
    assert httpx.get(node.url + "/metrics").status_code == 404  # metrics: only on the operator's listener


def test_decrypted_buffers_are_wiped(node, monkeypatch):
    held = []
    ohttp = node.identity.keys.current
    for name in ("decapsulate_request_buffer", "decapsulate_chunked_request_buffer"):
        real = getattr(type(ohttp), name)

        def capture(self, enc, _real=real):
            buf, ctx = _real(self, enc)
            held.append(buf)
            return buf, ctx

        monkeypatch.setattr(type(ohttp), name, capture)
    body = {"model": MODEL, "prompt": "w7 w8", "max_tokens": 3}
    assert call(node, b"/v1/completions", body)[0] == 200
    assert call(node, b"/v1/completions", {**body, "stream": True}, stream=True)[0] == 200
    assert call(node, b"/v1/completions", b"{broken")[0] == 400
    assert len(held) == 3 and all(len(b) == 0 or not any(b) for b in held)


def test_a_client_that_leaves_aborts_non_streamed_work(tiny_llama_dir):
    """A non-streamed OHTTP request whose client goes away is aborted on the node (its blocks
    freed and zeroed), not run to its end."""
    from tests.conftest import ExecutorSpy, llm_with_executor
    from tests.support.serving import _SPIES

    steps: list[int] = []
    spies: list[ExecutorSpy] = []
    llm = llm_with_executor(
        EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=128),
        lambda real: spies.append(ExecutorSpy(real, lambda plan, out: steps.append(1))) or spies[0],
    )
    engine = AsyncEngine(llm.engine)
    _SPIES[engine] = spies[0]
    identity = NodeIdentity(SoftwareAttester(), Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32))
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 120, "ignore_eos": True}
    with serve(create_node_app(engine, identity, NodeSettings(MODEL)), engine) as s, s.slowed(0.05):
        enc = encapsulate_call(
            identity.keys.current.key_config, b"/v1/completions", json.dumps(body).encode(), stream=False
        ).body
        with pytest.raises(httpx.ReadTimeout):  # 120 steps take >= 6 s; the client leaves after 0.3 s
            httpx.post(s.url + "/pcc/v1/ohttp", content=enc, headers={"content-type": "message/ohttp-req"}, timeout=0.3)
        s.wait_idle(timeout=60)
        assert len(steps) < 120  # aborted, not run to max_tokens
        s.check_integrity()


def test_a_stopping_node_ends_its_encrypted_streams_with_an_error_then_done(tiny_llama_dir):
    """The bounded drain's end (AsyncEngine.end_requests) reaches a stream inside OHTTP as it does a
    plaintext one: an error event, then [DONE], in a whole encrypted response; nothing held after."""
    import threading

    from tests.support.serving import make_served_app

    _, engine = make_served_app(
        EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=128)
    )
    identity = NodeIdentity(SoftwareAttester(), Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32))
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 100, "ignore_eos": True, "stream": True}
    result: dict = {}
    # a paced stream runs on to its decode budget after its content ends: 100 tokens x 20 ms, not
    # the default 200 ms a token (20 s of filler); the 100 tokens at 50 ms a step keep the request
    # running until the drain reaches it
    settings = NodeSettings(MODEL, shape=ShapePolicy(decode_ms_per_token=20))
    with serve(create_node_app(engine, identity, settings), engine) as s, s.slowed(0.05):
        s.identity = identity
        caller = threading.Thread(target=lambda: result.update(answer=call(s, b"/v1/completions", body, True)))
        caller.start()
        # the request itself, not the ballast the open stream keeps the engine busy with
        s.wait_until(lambda e: e.num_running == 1 and BALLAST_ID not in e.request_ids())
        s.loop.call_soon_threadsafe(engine.end_requests)
        caller.join(30)
        s.check_integrity()
    status, events = result["answer"]
    assert status == 200 and events[-1] == b"data: [DONE]\n\n"
    assert json.loads(events[-2].removeprefix(b"data: "))["error"]["code"] == "shutting_down"
