"""Asynchronous scheduling (EngineConfig.async_scheduling) on the CPU path: each step is launched
before the last one's tokens are read, and the output must be what synchronous stepping gives,
token for token (greedy and seeded sampling), with stops, aborts, preemption, prefix caching and
requests that need their tokens on the host (which run synchronously; structured outputs:
tests/structured/test_engine_structured.py)."""

from __future__ import annotations

import random

import pytest

from tests.conftest import ExecutorSpy, llm_with_executor
from traceless import SamplingParams
from traceless.config import EngineConfig


class Counting(ExecutorSpy):
    launches = executes = 0
    events: list[tuple[str, int]] = []  # ("launch" | "read", plan step) in order

    def launch(self, plan):
        Counting.launches += 1
        Counting.events.append(("launch", plan.step))
        pending = super().launch(plan)

        class Read:
            def result(self):
                Counting.events.append(("read", plan.step))
                return pending.result()

        return Read()

    def execute(self, plan):
        Counting.executes += 1
        return super().execute(plan)


def _llm(path, async_scheduling: bool, **kw):
    Counting.launches = Counting.executes = 0
    Counting.events = []
    cfg = EngineConfig(
        model=str(path), dtype="float32", async_scheduling=async_scheduling, **({"kv_cache_memory": 2**20} | kw)
    )
    return llm_with_executor(cfg, Counting)


def _prompts(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 384) for _ in range(rng.randrange(1, 40))] for _ in range(n)]


def _run(llm, prompts, params):
    """Every request's (tokens, text, finish reason, stop reason)."""
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [
        (o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason, o.outputs[0].stop_reason) for o in outs
    ]


def _params(rng: random.Random, i: int) -> SamplingParams:
    """Varied lengths and stops: max_tokens, EOS, stop token ids, stop strings; greedy or seeded."""
    kw = {"max_tokens": rng.randrange(1, 14)}
    if i % 3 == 0:
        kw["stop_token_ids"] = [rng.randrange(3, 384) for _ in range(40)]
    if i % 4 == 1:
        kw["stop"] = [f"w{rng.randrange(3, 384)}" for _ in range(16)]
    if i % 2:
        kw |= {"temperature": 0.9, "top_p": 0.95, "seed": 100 + i}
    else:
        kw["temperature"] = 0.0
    return SamplingParams(**kw)


def test_running_ahead_gives_the_synchronous_output(tiny_llama_dir):
    rng = random.Random(1)
    prompts = _prompts(2, 24)
    params = [_params(rng, i) for i in range(len(prompts))]
    want = _run(_llm(tiny_llama_dir, False), prompts, params)
    llm = _llm(tiny_llama_dir, True, max_num_batched_tokens=64)  # chunked prefill mixed with decodes
    got = _run(llm, prompts, params)
    assert got == want
    assert any(w[2] == "stop" for w in want) and any(w[2] == "length" for w in want)
    assert Counting.launches > 10 and Counting.executes == 0  # every step ran ahead
    # and its tokens were read only after the next step was launched (but for the last ones)
    late = sum(
        1
        for i, (what, step) in enumerate(Counting.events)
        if what == "read" and any(w == "launch" and s > step for w, s in Counting.events[:i])
    )
    assert late >= Counting.launches - 3
    llm.engine.check_integrity()


def test_preemption_and_the_prefix_cache_stay_exact(tiny_llama_dir):
    rng = random.Random(3)
    shared = [rng.randrange(3, 384) for _ in range(24)]
    prompts = [shared + p for p in _prompts(4, 10)]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    kw = {"kv_cache_memory": 64 * 1024, "max_model_len": 96, "prefix_cache": "global", "block_size": 4}
    sync = _llm(tiny_llama_dir, False, **kw)
    want = _run(sync, prompts, params)
    assert sync.engine.kv_stats().preemptions > 0  # the cache is small enough to preempt
    llm = _llm(tiny_llama_dir, True, **kw)
    assert _run(llm, prompts, params) == want
    assert llm.engine.kv_stats().preemptions > 0 and Counting.launches > 0
    assert llm.engine.drop_prefix_cache() > 0
    llm.engine.check_integrity()


def test_requests_that_need_host_tokens_run_synchronously(tiny_llama_dir):
    prompts = _prompts(5, 6)
    params = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True) for _ in prompts]
    params[2] = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2)
    params[4] = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, repetition_penalty=1.3)
    want = _run(_llm(tiny_llama_dir, False), prompts, params)
    llm = _llm(tiny_llama_dir, True)
    assert _run(llm, prompts, params) == want
    assert Counting.executes > 0
    llm.engine.check_integrity()


def test_an_abort_while_a_step_is_in_flight(tiny_llama_dir):
    llm = _llm(tiny_llama_dir, True)
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    for i, p in enumerate(_prompts(6, 3)):
        engine.add_request(f"r{i}", p, params)
    seen: dict[str, list[int]] = {}
    for _ in range(6):
        for out in engine.step():
            seen.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert engine.abort("r1")
    while engine.has_unfinished():
        for out in engine.step():
            assert out.request_id != "r1"
            seen.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert len(seen["r0"]) == len(seen["r2"]) == 30 and len(seen["r1"]) < 30
    engine.check_integrity()
    assert engine.abort("r0") is False


def test_async_scheduling_refuses_speculative_decoding(tiny_llama_dir):
    with pytest.raises(ValueError, match="speculative"):
        EngineConfig(model=str(tiny_llama_dir), async_scheduling=True, speculative="ngram")
