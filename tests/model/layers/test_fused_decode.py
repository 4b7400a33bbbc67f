"""The decoder layers in one native call (csrc/forward.c) compute what the per-call path computes.

A step goes through the fused forward when every sequence in it is in the paged kernel's batch,
and through LlamaModel's Python loop otherwise (a long prefill chunk): a request's numbers must not
depend on which path ran its steps, nor on how many threads ran them (the kernels go single-threaded
while the machine is oversubscribed, csrc/team.c). Every logits row is compared to the bit."""

from __future__ import annotations

import ctypes

import pytest
import torch

from tests.conftest import make_tiny_model
from traceless import LLM, SamplingParams
from traceless.config import EngineConfig
from traceless.engine.llm_engine import LLMEngine
from traceless.model.layers.fused_decode import FusedLayers
from traceless.model.layers.kernels import KernelUnavailable, NativeKernels
from traceless.runner.build import build_engine_parts

PROMPTS = [[17, 300, 42, 8, 99, 250, 3], [5, 6, 7], [120, 121, 9, 9, 200], [44] * 12]


class Tap:
    """Every logits matrix the model computes ([R, V] float32 copies) and how many steps the
    fused forward ran."""

    def __init__(self, model):
        self.logits: list[torch.Tensor] = []
        self.fused_steps = 0
        inner_logits, fused = model.logits, model.fused

        def logits(hidden):
            out = inner_logits(hidden)
            self.logits.append(out.clone())
            return out

        model.logits = logits
        if fused is not None:

            class Counting:
                runs = staticmethod(fused.runs)

                def __call__(_, *args):
                    self.fused_steps += 1
                    return fused(*args)

            model.fused = Counting()


def _engine(path, quantization: str, fused: bool = True, **options):
    config = EngineConfig(model=str(path), quantization=quantization, kv_cache_memory=16 * 2**20, **options)
    parts = build_engine_parts(config)
    model = parts.executor.model  # type: ignore[attr-defined]
    bound = isinstance(model.fused, FusedLayers)
    if not fused:
        model.fused = None
    return LLM.from_engine(LLMEngine(config, parts)), bound, Tap(model)


def _generate(llm, n: int = 8):
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    llm.engine.check_integrity()
    return [(o.outputs[0].token_ids, [sorted(d.items()) for d in o.outputs[0].logprobs]) for o in outs]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused")
    return {
        "llama": make_tiny_model(root / "llama", "llama", seed=3, intermediate_size=256),
        "qwen2": make_tiny_model(root / "qwen2", "qwen2", seed=4),  # QKV biases
        "mistral": make_tiny_model(root / "mistral", "mistral", seed=5, sliding_window=6),  # a window
    }


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("quantization", ["q8_0", "q4_0"])
@pytest.mark.parametrize("kv", ["float16", "float32"])  # auto: float16
def test_the_fused_forward_equals_the_per_call_path_to_the_bit(models, kind, quantization, kv):
    fused_llm, bound, fused_tap = _engine(models[kind], quantization, kv_cache_dtype=kv)
    plain_llm, _, plain_tap = _engine(models[kind], quantization, fused=False, kv_cache_dtype=kv)
    assert bound and fused_llm.engine.model.kv_cache_dtype == kv
    assert _generate(fused_llm) == _generate(plain_llm)
    assert fused_tap.fused_steps >= 7  # the decode steps went through forward.c
    assert plain_tap.fused_steps == 0
    assert len(fused_tap.logits) == len(plain_tap.logits)
    for a, b in zip(fused_tap.logits, plain_tap.logits):
        assert torch.equal(a, b)


def test_the_thread_count_does_not_change_a_bit(models):
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            llm, _, tap = _engine(models["llama"], "q4_0")
            runs.append((_generate(llm), tap.logits, tap.fused_steps))
    finally:
        torch.set_num_threads(before)
    for out, logits, steps in runs[1:]:
        assert steps > 0 and out == runs[0][0]
        assert all(torch.equal(a, b) for a, b in zip(logits, runs[0][1]))


def test_only_covered_models_bind(models):
    # float32 weights: the per-call path with torch's matmuls
    assert not _engine(models["llama"], "none")[1]
    assert _engine(models["llama"], "q8_0")[1]
    # a step with a long prefill chunk is not the fused forward's
    meta = type("Meta", (), {"long": object(), "short": object(), "paged": None, "groups": ()})()
    assert not FusedLayers.runs(meta)


def test_the_team_goes_single_threaded_only_while_the_cpus_are_oversubscribed():
    lib = NativeKernels.load()
    fn = lib._fn(
        "tl_team_decide", [ctypes.c_double, ctypes.c_int, ctypes.c_long, ctypes.c_long, ctypes.c_int], ctypes.c_int
    )
    hold = lib._fn("tl_team_hold", [ctypes.c_long, ctypes.c_long], ctypes.c_long)
    ms = 1_000_000

    def decide(share, single, held, hold_ns, over=1):
        return fn(share, single, held, hold_ns, over)

    assert decide(0.0, 0, 0, 500 * ms) == 0 and decide(0.1, 0, 0, 500 * ms) == 0  # quiet or nearly: the team
    assert decide(0.2, 0, 0, 500 * ms) == 1 and decide(0.9, 0, 0, 500 * ms) == 1  # a fifth waiting: one thread
    assert decide(0.9, 0, 0, 500 * ms, over=0) == 0  # one busy interval alone (a start-up burst) is not enough
    assert decide(0.0, 1, 100 * ms, 500 * ms) == 1  # holds a while before it tries the team again
    assert decide(0.01, 1, 600 * ms, 500 * ms) == 0 and decide(0.2, 1, 600 * ms, 500 * ms) == 1
    # a team that met the contention again at once: the next hold is twice as long, up to 8 s
    assert hold(60 * ms, 500 * ms) == 1000 * ms and hold(60 * ms, 6000 * ms) == 8000 * ms
    assert hold(5000 * ms, 8000 * ms) == 500 * ms  # a team that lasted: back to the short hold


def test_a_bad_team_setting_is_refused(monkeypatch):
    monkeypatch.setenv("TRACELESS_CPU_TEAM", "many")
    with pytest.raises(KernelUnavailable, match="TRACELESS_CPU_TEAM"):
        NativeKernels.load()
