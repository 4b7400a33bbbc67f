"""A shaped stream's timing: the outer response head leaves on the tick grid with the first chunk,
not when the first token is known; no stream starts before its request bucket's prefill budget;
a stream with max_tokens runs to its decode budget whatever its answer's length, one without to a
power-of-two number of ticks."""

from __future__ import annotations

import httpx
import pytest

from tests.support.node import MODEL, call, tiny_node
from traceless.node.settings import NodeSettings
from traceless.privacy.shape import ShapePolicy
from traceless_tools.audit.stream_observe import key_config, observe

TICK, BUDGET_PER_KIB, DECODE_PER_TOKEN = 0.1, 0.3, 0.05


@pytest.fixture(scope="module")
def node(tiny_llama_dir):
    shape = ShapePolicy(
        tick_ms=int(TICK * 1000),
        prefill_ms_per_kib=int(BUDGET_PER_KIB * 1000),
        decode_ms_per_token=int(DECODE_PER_TOKEN * 1000),
    )
    with tiny_node(tiny_llama_dir, NodeSettings(MODEL, shape=shape), max_model_len=256) as s:
        yield s


def trace(node, prompt, max_tokens: int, stop_after_one: bool = False):
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    if stop_after_one:  # the greedy second token's text as a stop string: the answer is one token
        status, whole = call(
            node,
            b"/v1/completions",
            {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True},
        )
        body["stop"] = [whole["choices"][0]["text"].split()[-1]]
    with httpx.Client(timeout=60) as client:
        return observe(client, node.url, key_config(node.url), b"/v1/completions", body, pad=True)


def test_the_head_leaves_with_the_first_chunk_after_the_budget(node):
    for prompt in ([5], list(range(5, 100))):  # both in the 1 KiB bucket; prefill differs
        t = trace(node, prompt, 3)
        assert t.head >= BUDGET_PER_KIB - 0.02, t  # not before the 1 KiB bucket's budget
        assert abs(t.times[0] - t.head) < 0.05, t  # the head and the first chunk leave on the same tick
        assert t.first_token >= t.head - 0.01


def test_a_larger_bucket_waits_for_its_larger_budget_up_to_the_context(node):
    t = trace(node, "w5" + " " * 1200 + "w6", 2)  # two tokens in ~1.3 KiB: the 2 KiB bucket
    assert t.head >= 2 * BUDGET_PER_KIB - 0.02, t
    t = trace(node, "w5" + " " * 5000 + "w6", 2)  # the 8 KiB bucket; but 256 tokens fit in ~2 KiB
    assert 2 * BUDGET_PER_KIB - 0.02 <= t.head < 4 * BUDGET_PER_KIB, t


def test_an_answer_that_ends_early_runs_as_long_as_one_that_runs_to_max_tokens(node):
    full = trace(node, [5, 6], 20)  # ignore_eos: 20 tokens
    stopped = trace(node, [5, 6], 20, stop_after_one=True)  # one token, then a stop string ends it
    assert stopped.tokens < full.tokens and len(stopped.times) == len(full.times) == 20 * DECODE_PER_TOKEN / TICK
    gaps = sorted(b - a for a, b in zip(full.times, full.times[1:]))
    assert abs(gaps[len(gaps) // 2] - TICK) < 0.02, gaps  # on the tick (a loaded machine delays a few)


class _Plain:
    """An encryptor that does not encrypt: chunk counting needs no keys."""

    def encryptor(self):
        return self

    def seal_chunk(self, chunk: bytes) -> bytes:
        return chunk

    def seal_final(self, chunk: bytes) -> bytes:
        return b"FINAL" + chunk


def test_padded_ticks():
    from traceless.privacy.shape import padded_ticks

    assert [padded_ticks(n, None) for n in (1, 2, 3, 5, 8, 9, 100)] == [1, 2, 4, 8, 8, 16, 128]
    assert [padded_ticks(n, 32) for n in (1, 3, 17, 32, 33, 40)] == [32, 32, 32, 32, 64, 64]
    assert ShapePolicy(tick_ms=100, decode_ms_per_token=200).decode_budget_ticks(32) == 64
    assert ShapePolicy(tick_ms=100, decode_ms_per_token=200).decode_budget_ticks(10_000) is None  # past 120 s
    assert ShapePolicy().decode_budget_ticks(None) is None


@pytest.mark.parametrize("bound", [None, 4, 12])
def test_after_its_content_a_stream_runs_on_to_its_budget_or_a_power_of_two(bound):
    import asyncio

    from traceless.node.framing import Inner
    from traceless.node.framing.paced import Pace, paced
    from traceless.privacy.shape import sse_filler

    tick = 0.05

    async def events():
        for _ in range(11):  # content for 5.5 ticks (longer on a loaded machine)
            await asyncio.sleep(tick / 2)
            yield b"data: x\n\n"

    async def run() -> list[bytes]:
        loop = asyncio.get_running_loop()
        inner = loop.create_future()
        inner.set_result(Inner(200, (), events(), sse_filler))
        return [c async for c in paced(_Plain(), inner, Pace(loop.time() + tick, tick), lambda got: bound)]

    chunks = asyncio.run(run())
    assert b"".join(chunks).count(b"data: x") == 11 and chunks[-1].startswith(b"FINAL")
    k = max(i for i, c in enumerate(chunks, 1) if b"data: x" in c)  # the tick the content ended in
    pow2 = 1 << (k - 1).bit_length()
    assert len(chunks) == (bound if bound is not None and k <= bound else pow2), (k, len(chunks))
