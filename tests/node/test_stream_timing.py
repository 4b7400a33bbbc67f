"""A shaped stream's timing: the outer response head leaves on the tick grid with the first chunk,
not when the first token is known; no stream starts before its request bucket's prefill budget;
and a stream runs to a power-of-two number of ticks (at most max_tokens)."""
from __future__ import annotations

import httpx
import pytest

from tests.support.node import MODEL, tiny_node
from traceless.audit.stream_observe import key_config, observe
from traceless.node.settings import NodeSettings
from traceless.privacy.shape import ShapePolicy

TICK, BUDGET_PER_KIB = 0.1, 0.3


@pytest.fixture(scope="module")
def node(tiny_llama_dir):
    shape = ShapePolicy(tick_ms=int(TICK * 1000), prefill_ms_per_kib=int(BUDGET_PER_KIB * 1000))
    with tiny_node(tiny_llama_dir, NodeSettings(MODEL, shape=shape), max_model_len=256) as s:
        yield s


def trace(node, prompt, max_tokens: int, natural: bool = False):
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": not natural}
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


@pytest.mark.parametrize("max_tokens", [3, 7, 20])
def test_streams_run_to_a_power_of_two_of_ticks_at_most_max_tokens(node, max_tokens):
    t = trace(node, [5, 6], max_tokens)
    n = len(t.times)
    assert n == max_tokens or n & (n - 1) == 0, (n, t.times)  # a power of two, or the max_tokens bound
    assert n <= max(max_tokens, 2)
    gaps = [b - a for a, b in zip(t.times, t.times[1:])]
    assert all(abs(g - TICK) < 0.05 for g in gaps[:-1]), gaps


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
    assert [padded_ticks(n, 32) for n in (3, 5, 17, 32, 33, 40)] == [4, 8, 32, 32, 33, 40]
    assert [padded_ticks(n, 6) for n in (3, 5, 6, 7)] == [4, 6, 6, 7]


@pytest.mark.parametrize("bound", [None, 6, 64])
def test_after_its_content_a_stream_runs_on_to_a_power_of_two_of_ticks(bound):
    import asyncio

    from traceless.node.paced import Pace, paced
    from traceless.privacy.shape import sse_filler

    tick = 0.05

    async def events():
        for _ in range(11):  # content for 5.5 ticks (longer on a loaded machine)
            await asyncio.sleep(tick / 2)
            yield b"data: x\n\n"

    async def run() -> list[bytes]:
        loop = asyncio.get_running_loop()
        return [c async for c in paced(_Plain(), 200, (), events(), Pace(loop.time() + tick, tick, bound), sse_filler)]

    chunks = asyncio.run(run())
    assert b"".join(chunks).count(b"data: x") == 11 and chunks[-1].startswith(b"FINAL")
    k = max(i for i, c in enumerate(chunks, 1) if b"data: x" in c)  # the tick the content ended in
    pow2 = 1 << (k - 1).bit_length()
    assert len(chunks) == (pow2 if bound is None else max(k, min(pow2, bound))), (k, len(chunks))
