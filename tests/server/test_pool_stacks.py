"""What the CPU kernels computed from a request on the OpenMP worker threads' stacks (tiles of
matmul results, spilled registers) is cleared: by `scrub_pool_stacks`, which the engine thread's
idle work runs after every quiet spell.

Method: a worker's stack is read through /proc/self/mem in 64-byte lines. After a scrub (the
baseline) the worker idles in the OpenMP runtime, whose wait frames at the top of its stack change
a little from one region to the next: the lines a trivial parallel region changes mark how deep
that noise reaches. The lines below it that a quantized matmul changed are what the kernel left;
after a second scrub each must read as in the baseline again."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import numpy as np
import pytest
import torch

from tests.conftest import ExecutorSpy
from tests.support.ggml_raw import random_tensor
from tests.support.process_memory import read_own_memory
from traceless.model.layers.kernels import NativeKernels
from traceless.model.layers.qkernels import QuantKernels
from traceless.model.layers.quant import QFormat, QuantTensor, to_kernel_layout

TOP = 1 << 20  # bytes read below each stack's top
LINE = 64


def _lines(bounds: tuple[int, int]) -> list[bytes]:
    """The top TOP bytes of a stack in 64-byte lines, the top line first."""
    _, high = bounds
    data = read_own_memory(high - TOP, high)
    return [data[i - LINE : i] for i in range(len(data), 0, -LINE)]


class Workers:
    """The calling thread's OpenMP workers (thread 0, the caller, left out), scrubbed and read."""

    def __init__(self, kernels: NativeKernels):
        self.kernels = kernels
        self.bounds = kernels.pool_stack_bounds()[1:]
        assert self.bounds, "needs an OpenMP team of at least two threads"
        kernels.scrub_pool_stacks()
        self.baseline = self.read()
        kernels.pool_stack_bounds()  # a trivial region: how deep the runtime's own frames reach
        self.noise = [max(lines, default=-1) + 1 for lines in self.changed()]

    def read(self) -> list[list[bytes]]:
        return [_lines(b) for b in self.bounds]

    def changed(self) -> list[list[int]]:
        """Per worker: the lines that differ from the baseline now."""
        now = self.read()
        return [[i for i, (x, y) in enumerate(zip(n, b)) if x != y] for n, b in zip(now, self.baseline)]

    def left(self) -> list[list[int]]:
        """Per worker: the changed lines below the runtime's own frames."""
        return [[i for i in lines if i >= d] for lines, d in zip(self.changed(), self.noise)]


def _quantized_matmul() -> None:
    w = QuantTensor(
        QFormat.Q4_1,
        (512, 576),
        torch.from_numpy(random_tensor("Q4_1", 512, 576, np.random.default_rng(0), scale=0.02)),
    )
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
    assert any(left), "the kernel left nothing below the runtime's frames: nothing to test"
    kernels.scrub_pool_stacks()
    now = workers.changed()
    assert [[i for i in lines if i in set(n)] for lines, n in zip(left, now)] == [[] for _ in left]


def test_the_engine_scrubs_its_workers_when_idle(tiny_llama_dir):
    from traceless import SamplingParams
    from traceless.config import EngineConfig
    from traceless.engine.llm_engine import LLMEngine
    from traceless.runner.build import build_engine_parts
    from traceless.server.async_engine import AsyncEngine

    config = EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=4 * 2**20)
    parts = build_engine_parts(config)
    spy = ExecutorSpy(parts.executor)
    engine = AsyncEngine(LLMEngine(config, dataclasses.replace(parts, executor=spy)))
    idle = threading.Event()
    engine.on_idle(idle.set)

    async def main() -> None:
        engine.start(asyncio.get_running_loop())
        # An idle collection the start might bring comes within the quiet spell plus one wake-up of
        # the engine thread (IdleWork.IDLE_GC_S, 1 s): let it pass, so the count below is taken after it.
        await asyncio.to_thread(idle.wait, 3)
        idle.clear()
        before = getattr(spy, "scrubs", 0)
        async for _ in engine.generate("r", [5, 6, 7], SamplingParams(temperature=0, max_tokens=3)):
            pass
        assert await asyncio.to_thread(idle.wait, 30)
        assert getattr(spy, "scrubs", 0) > before

    try:
        asyncio.run(asyncio.wait_for(main(), 90))
    finally:
        engine.stop()


def test_scrub_clears_what_a_fused_step_left_on_the_workers(two_threads, tiny_llama_dir):
    """The same for the decoder layers run in one region (csrc/forward.c): its frames are deeper
    than one kernel's, and still inside the gap the scrub starts below."""
    from traceless import LLM, SamplingParams

    llm = LLM(str(tiny_llama_dir), quantization="q4_0", kv_cache_memory=4 * 2**20)
    assert llm.engine.model.fused_forward
    kernels = NativeKernels.load()
    workers = Workers(kernels)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    llm.generate([{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [9] * 5}], params, use_tqdm=False)
    left = workers.left()
    assert any(left), "the steps left nothing below the runtime's frames: nothing to test"
    kernels.scrub_pool_stacks()
    now = workers.changed()
    assert [[i for i in lines if i in set(n)] for lines, n in zip(left, now)] == [[] for _ in left]
