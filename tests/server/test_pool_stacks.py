"""What the CPU kernels computed from a request on the OpenMP worker threads' stacks (tiles of
matmul results, spilled registers) is cleared: by `scrub_pool_stacks`, and by the engine thread's
idle work after every quiet spell.

Method: a worker's stack is read through /proc/self/mem in 64-byte lines. Its idle frames (the
worker waiting for the next parallel region) are the lines at the top that are non-zero before any
kernel ran; the lines below them that a quantized matmul made non-zero are what the kernel left.
Each must read zero after the scrub."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch

from tests.support.ggml_raw import random_tensor
from traceless.model.layers.kernels import NativeKernels
from traceless.model.layers.qkernels import QuantKernels
from traceless.model.layers.quant import QFormat, QuantTensor, to_kernel_layout

TOP = 1 << 20  # bytes read below each stack's top
LINE = 64


def _lines(bounds: tuple[int, int]) -> list[bytes]:
    """The top TOP bytes of a stack in 64-byte lines, the top line first."""
    low, high = bounds
    with open("/proc/self/mem", "rb", buffering=0) as mem:
        mem.seek(high - TOP)
        data = mem.read(TOP)
    return [data[i - LINE:i] for i in range(len(data), 0, -LINE)]


def _idle_depth(lines: list[bytes]) -> int:
    """Lines from the top down to the deepest non-zero one (the idle worker's live frames)."""
    return max((i + 1 for i, ln in enumerate(lines) if any(ln)), default=0)


class Workers:
    """The calling thread's OpenMP workers (thread 0, the caller, left out), read before and after."""

    def __init__(self, kernels: NativeKernels):
        self.kernels = kernels
        self.bounds = kernels.pool_stack_bounds()[1:]
        assert self.bounds, "needs an OpenMP team of at least two threads"
        fresh = [_lines(b) for b in self.bounds]
        self.depth = [_idle_depth(f) for f in fresh]

    def left(self) -> list[list[int]]:
        """Per worker: the lines below its idle frames that are non-zero now."""
        return [[i for i, ln in enumerate(_lines(b)) if i >= d and any(ln)] for b, d in zip(self.bounds, self.depth)]


def _quantized_matmul() -> None:
    w = QuantTensor(QFormat.Q4_1, (512, 576),
                    torch.from_numpy(random_tensor("Q4_1", 512, 576, np.random.default_rng(0), scale=0.02)))
    x = torch.randn(8, 576)
    QuantKernels.load().matmul(x, to_kernel_layout(w), torch.empty(8, 512))


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_scrub_clears_what_a_quantized_matmul_left_on_the_workers(two_threads):
    kernels = NativeKernels.load()
    workers = Workers(kernels)
    _quantized_matmul()
    left = workers.left()
    assert any(left), "the kernel left nothing below the workers' idle frames: nothing to test"
    kernels.scrub_pool_stacks()
    now = [_lines(b) for b in workers.bounds]
    after = [[i for i in lines if any(now[w][i])] for w, lines in enumerate(left)]
    assert after == [[] for _ in left]


def test_the_engine_clears_its_workers_stacks_when_idle(tiny_llama_dir):
    from traceless.config import EngineConfig
    from traceless.entrypoints.build import build_engine
    from traceless.server.async_engine import AsyncEngine

    engine = AsyncEngine(build_engine(EngineConfig(model=str(tiny_llama_dir), dtype="float32",
                                                   kv_cache_memory=4 * 2**20)))
    idle = threading.Event()
    engine.on_idle(idle.set)

    def dirty(_engine) -> tuple[Workers, list[list[int]]]:
        torch.set_num_threads(2)  # the engine thread's team
        workers = Workers(NativeKernels.load())
        _quantized_matmul()
        return workers, workers.left()

    def still_left(_engine, workers: Workers, left: list[list[int]]) -> list[list[int]]:
        now = [_lines(b) for b in workers.bounds]
        return [[i for i in lines if any(now[w][i])] for w, lines in enumerate(left)]

    async def main() -> None:
        engine.start(asyncio.get_running_loop())
        await asyncio.to_thread(idle.wait, 30)  # the first quiet spell after start
        idle.clear()
        workers, left = await engine.call(dirty)
        assert any(left)
        engine.note_activity()  # as a request's end does: the idle work runs again once quiet
        assert await asyncio.to_thread(idle.wait, 30)
        assert await engine.call(lambda e: still_left(e, workers, left)) == [[] for _ in left]

    try:
        asyncio.run(asyncio.wait_for(main(), 90))
    finally:
        engine.stop()
