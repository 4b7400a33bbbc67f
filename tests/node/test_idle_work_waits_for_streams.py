"""The engine's idle work (a garbage collection, then a residue scan) holds the interpreter for
hundreds of milliseconds on a loaded machine, so the node's tick timer stalls while it runs. Started
when the engine went idle, it ran in the middle of a shaped stream at a fixed delay after the
answer's last token: the relay saw a gap of 300-550 ms about 0.9 s after the content ended, which
is the answer's length (the stream-shape attack's natural-length reading, docs/shape-hiding.md).
It waits until no shaped stream is open."""

from __future__ import annotations

import random
import time

import httpx

from tests.support.serving import serve
from traceless.config import EngineConfig
from traceless.entrypoints.build import build_engine
from traceless.node.app import create_node_app
from traceless.node.identity import NodeIdentity
from traceless.node.settings import NodeSettings
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.software import SoftwareAttester
from traceless.privacy.shape import ShapePolicy
from traceless.server.async_engine import AsyncEngine
from traceless_tools.audit.stream_observe import key_config, observe


def test_no_idle_collection_runs_while_a_shaped_stream_is_open(tiny_llama_dir):
    engine = AsyncEngine(
        build_engine(EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=128))
    )
    collected: list[float] = []
    engine.on_idle(lambda: collected.append(time.perf_counter()))
    identity = NodeIdentity(SoftwareAttester(), Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32))
    shape = ShapePolicy(tick_ms=100, prefill_ms_per_kib=100, decode_ms_per_token=250)
    with serve(create_node_app(engine, identity, NodeSettings("tiny", shape=shape)), engine) as node:
        config = key_config(node.url)
        with httpx.Client(timeout=60) as client:
            body = {
                "model": "tiny",
                "prompt": "w5 w6 w7",
                "max_tokens": 12,
                "temperature": 0.0,
                "ignore_eos": False,
                "seed": random.randrange(2**31),
                "stream": True,
            }
            observe(client, node.url, config, b"/v1/completions", body, True)  # warm-up
            node.wait_until(lambda _: collected, timeout=20)  # its idle collection is done (seconds, loaded)
            time.sleep(0.2)
            collected.clear()
            start = time.perf_counter()
            trace = observe(client, node.url, config, b"/v1/completions", body, True)
            end = start + trace.times[-1]
        # the answer is a few milliseconds of work; the stream runs its 3 s decode budget
        assert trace.content_end < 0.5 * trace.times[-1] and len(trace.times) >= 30
        node.wait_until(lambda _: collected, timeout=10)  # the idle work still runs, after the stream
        assert all(t >= end - 0.05 for t in collected), [round(t - start, 2) for t in collected]
