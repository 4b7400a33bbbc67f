"""Padded, grouped streams: every chunk has the same length, and clients still parse them."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.ohttp_frames import chunked_ciphertexts
from tests.support.serving import make_served_app, serve
from traceless.config import EngineConfig
from traceless.server.stream_shape import StreamShape, pad_event, padding_event

PAD = 512


def test_pad_event_sizes():
    e = b'data: {"x": 1}\n\n'
    assert len(pad_event(e, 128)) == 128 and pad_event(e, 128).startswith(b'data: {"x": 1}\n: ')
    assert len(pad_event(b"data: " + b"y" * 200 + b"\n\n", 128)) == 256  # too big: next multiple
    assert len(padding_event(100)) == 100 and padding_event(100).startswith(b": ")
    with pytest.raises(ValueError):
        StreamShape(padding=10)


@pytest.fixture(scope="module")
def padded(tiny_llama_dir):
    app, engine = make_served_app(
        EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=128),
        stream_shape=StreamShape(PAD, 4),
    )
    with serve(app, engine) as s:
        s.model = httpx.get(s.url + "/v1/models").json()["data"][0]["id"]
        yield s


def test_every_sse_event_has_the_same_length_and_the_text_is_intact(padded):
    body = {"model": padded.model, "prompt": [5, 6, 7], "max_tokens": 22, "temperature": 0, "ignore_eos": True}
    whole = httpx.post(padded.url + "/v1/completions", json=body).json()["choices"][0]["text"]
    raw = httpx.post(
        padded.url + "/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
    ).content
    events = [e + b"\n\n" for e in raw.split(b"\n\n") if e]
    assert len(events) >= 5 and {len(e) for e in events} == {PAD}
    texts = []
    for e in events:
        data = e.split(b"\n", 1)[0]
        assert data.startswith(b"data: ")
        if data != b"data: [DONE]":
            obj = json.loads(data[6:])
            texts += [c["text"] for c in obj["choices"]]
    assert "".join(texts) == whole
    # 22 tokens in groups of 4: 6 token events, then usage and [DONE]
    assert len(events) == 6 + 2


def test_the_openai_client_reads_padded_streams(padded):
    from openai import OpenAI

    client = OpenAI(base_url=padded.url + "/v1", api_key="-")
    text = "".join(
        c.choices[0].text
        for c in client.completions.create(model=padded.model, prompt="w5 w6", max_tokens=9, temperature=0, stream=True)
        if c.choices
    )
    want = client.completions.create(model=padded.model, prompt="w5 w6", max_tokens=9, temperature=0).choices[0].text
    assert text == want


def test_node_chunks_all_have_the_same_length(tiny_llama_dir):
    from tests.support.node import call as node_call
    from traceless.entrypoints.build import build_engine
    from traceless.node.app import create_node_app
    from traceless.node.identity import NodeIdentity
    from traceless.node.settings import NodeSettings
    from traceless.privacy.attestation.measurement import Measurement
    from traceless.privacy.attestation.software import SoftwareAttester
    from traceless.privacy.ohttp.call import encapsulate_call
    from traceless.server.async_engine import AsyncEngine

    engine = AsyncEngine(
        build_engine(EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=128))
    )
    identity = NodeIdentity(SoftwareAttester(), Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32))
    from traceless.privacy.shape import OFF

    # the per-event padding knob on its own (size buckets and the cadence off: tests/node/test_shape.py)
    app = create_node_app(engine, identity, NodeSettings("tiny", stream_shape=StreamShape(PAD, 2), shape=OFF))
    with serve(app, engine) as node:
        node.identity = identity
        body = {
            "model": "tiny",
            "prompt": [5, 6, 7],
            "max_tokens": 15,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        call = encapsulate_call(
            identity.keys.current.key_config, b"/v1/completions", json.dumps(body).encode(), stream=True
        )
        r = httpx.post(node.url + "/pcc/v1/ohttp", content=call.body, headers={"content-type": call.media_type})
        sizes = chunked_ciphertexts(r.content)
        assert len(sizes) >= 10 and len(set(sizes)) == 1, sizes  # head, data chunks and final chunk alike
        status, events = node_call(node, b"/v1/completions", body, stream=True)  # and it still decodes
        assert status == 200 and events[-1].startswith(b"data: [DONE]")
        text = "".join(
            json.loads(e.split(b"\n", 1)[0][6:])["choices"][0]["text"] for e in events[:-1] if e.startswith(b"data: {")
        )
        plain = {k: v for k, v in body.items() if k != "stream"}
        assert text == node_call(node, b"/v1/completions", plain)[1]["choices"][0]["text"]
