"""A node's default shape: whole responses in size buckets, streams in equal chunks on a timer."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.node import call
from tests.support.ohttp_frames import chunked_ciphertexts
from tests.support.serving import serve
from traceless.config import EngineConfig
from traceless.entrypoints.build import build_engine
from traceless.node.app import create_node_app
from traceless.node.identity import NodeIdentity
from traceless.node.settings import NodeSettings
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.software import SoftwareAttester
from traceless.privacy.ohttp.call import encapsulate_call
from traceless.privacy.shape import BUCKETS, STREAM_CHUNK
from traceless.server.async_engine import AsyncEngine

TAG, NONCE = 16, 16  # AES-128-GCM, the key config's first choice


@pytest.fixture(scope="module")
def node(tiny_llama_dir):
    engine = AsyncEngine(
        build_engine(EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=256))
    )
    identity = NodeIdentity(SoftwareAttester(), Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32))
    with serve(create_node_app(engine, identity, NodeSettings("tiny")), engine) as s:
        s.identity = identity
        yield s


def raw(node, body: dict, stream: bool) -> bytes:
    call = encapsulate_call(
        node.identity.keys.current.key_config, b"/v1/completions", json.dumps(body).encode(), stream=stream
    )
    return httpx.post(node.url + "/pcc/v1/ohttp", content=call.body, headers={"content-type": call.media_type}).content


@pytest.mark.parametrize("prompt_len,max_tokens", [(1, 1), (3, 9), (40, 30)])
def test_streams_leave_in_equal_chunks_and_whole_responses_in_buckets(node, prompt_len, max_tokens):
    body = {
        "model": "tiny",
        "prompt": list(range(5, 5 + prompt_len)),
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 2,
    }
    # the stream read as the relay sees it, beside the calls below: a paced stream lasts its budgets
    # (prefill 0.5 s + max_tokens x 200 ms) whatever else the node does
    with ThreadPoolExecutor(1) as pool:
        seen = pool.submit(lambda: chunked_ciphertexts(raw(node, {**body, "stream": True}, stream=True)))
        assert len(raw(node, body, stream=False)) - NONCE - TAG in BUCKETS
        # and the content is intact: the stream's text is the whole response's
        status, whole = call(node, b"/v1/completions", body)
        status2, events = call(node, b"/v1/completions", {**body, "stream": True}, stream=True)
        sizes = seen.result()
    assert len(sizes) >= 2 and set(sizes) == {STREAM_CHUNK + TAG}, sizes
    assert status == status2 == 200 and events[-1] == b"data: [DONE]\n\n"
    assert "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]) == whole["choices"][0]["text"]


def test_an_error_in_a_chunked_response_is_shaped_and_readable(node):
    sizes = chunked_ciphertexts(raw(node, {"model": "tiny", "prompt": [5], "max_tokens": -1, "stream": True}, True))
    assert set(sizes) == {STREAM_CHUNK + TAG}
    status, err = call(
        node, b"/v1/completions", {"model": "tiny", "prompt": [5], "max_tokens": -1, "stream": True}, stream=True
    )
    assert status == 400 and err["error"]["type"] == "invalid_request_error"


def test_without_a_timer_each_event_is_its_own_bucket_sized_chunk(tiny_llama_dir):
    from traceless.privacy.shape import ShapePolicy

    engine = AsyncEngine(
        build_engine(EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=256))
    )
    identity = NodeIdentity(SoftwareAttester(), Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32))
    with serve(create_node_app(engine, identity, NodeSettings("tiny", shape=ShapePolicy(tick_ms=0))), engine) as n:
        n.identity = identity
        body = {
            "model": "tiny",
            "prompt": [5, 6, 7],
            "max_tokens": 6,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": 5,
            "stream": True,
        }
        sizes = chunked_ciphertexts(raw(n, body, stream=True))
        # head, six token events (with logprobs: some above 1 KiB), [DONE], final
        assert len(sizes) == 9 and all(s - TAG in BUCKETS for s in sizes), sizes
        status, events = call(n, b"/v1/completions", body, stream=True)
        assert status == 200 and len(events) == 7 and events[-1] == b"data: [DONE]\n\n"
