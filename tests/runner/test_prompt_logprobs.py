"""Prompt logprobs equal transformers' float32 log-softmax, through chunked prefill, prefix-cache
hits (bypassed) and preemption; the engine holds nothing afterwards."""

from __future__ import annotations

import random

import pytest
import torch

from tests.support.logprobs import assert_rank, assert_top
from traceless import LLM, SamplingParams


@pytest.fixture(scope="module")
def hf(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


def hf_prompt_logprobs(model, ids: list[int]) -> torch.Tensor:
    """[P - 1, V]: log-softmax at positions 0 .. P-2 (position k scores token k + 1)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[:-1]


def check(out, ids: list[int], want: torch.Tensor, top_n: int) -> None:
    """Values within 1e-4 of the reference's, ranks within its tie band (support/logprobs.py): the
    last bits of a matmul differ between our kernels and transformers, and between CPU kinds."""
    got = out.prompt_logprobs
    assert got is not None and len(got) == len(ids) and got[0] is None
    for k, (entry, token) in enumerate(zip(got[1:], ids[1:])):
        assert entry is not None
        row = want[k]
        assert abs(entry[token].logprob - float(row[token])) < 1e-4
        assert_rank(entry[token].rank, row, token)
        top = sorted((t for t in entry if entry[t].rank <= top_n), key=lambda t: entry[t].rank)
        assert [entry[t].rank for t in top] == list(range(1, top_n + 1))
        assert_top(top, [entry[t].logprob for t in top], row)
        assert set(entry) == set(top) | {token}


def prompts(seed: str) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 384) for _ in range(n)] for n in (1, 2, 7, 16, 33, 70)]


@pytest.mark.parametrize("top_n", [0, 3])
def test_prompt_logprobs_match_transformers_with_chunked_prefill(tiny_llama_dir, hf, top_n):
    # a small budget splits the longer prompts into chunks mixed with other requests' decodes
    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=8 * 2**20, max_num_batched_tokens=24)
    ps = prompts("chunked")
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=top_n)
    outs = llm.generate([{"prompt_token_ids": p} for p in ps], params, use_tqdm=False)
    for out, ids in zip(outs, ps):
        check(out, ids, hf_prompt_logprobs(hf, ids), top_n)
    llm.engine.drop_prefix_cache()
    llm.engine.check_integrity()


def test_prefix_cache_hit_is_bypassed_for_prompt_logprobs(tiny_llama_dir, hf):
    """A second request with the same prompt (same domain) would hit the cache; it computes every
    position anyway, and its logprobs equal the reference."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=8 * 2**20, prefix_cache="global")
    ids = prompts("cache")[-1]
    plain = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    llm.generate({"prompt_token_ids": ids}, plain, use_tqdm=False)
    assert llm.engine.cached_prefix_len(ids) > 0
    out = llm.generate(
        {"prompt_token_ids": ids},
        SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, prompt_logprobs=1),
        use_tqdm=False,
    )[0]
    check(out, ids, hf_prompt_logprobs(hf, ids), 1)
    assert llm.generate({"prompt_token_ids": ids}, plain, use_tqdm=False)[0].prompt_logprobs is None
    llm.engine.drop_prefix_cache()
    llm.engine.check_integrity()


def test_prompt_logprobs_survive_preemption_by_recompute(tiny_llama_dir, hf):
    """A KV cache too small for all requests at once: some are preempted mid-prompt or after it and
    recomputed; each prompt position is scored exactly once, with the reference's value."""
    from tests.conftest import ExecutorSpy, llm_with_executor
    from traceless.config import EngineConfig

    preempted = []
    config = EngineConfig(
        model=str(tiny_llama_dir),
        dtype="float32",
        kv_cache_memory=9 * 8192,
        max_model_len=96,
        max_num_batched_tokens=32,
        prefix_cache="off",
    )
    llm = llm_with_executor(
        config, lambda real: ExecutorSpy(real, lambda plan, _: preempted.append(plan.num_preempted))
    )
    ps = prompts("preempt")[2:]
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in ps],
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, prompt_logprobs=2),
        use_tqdm=False,
    )
    assert sum(preempted) > 0
    for out, ids in zip(outs, ps):
        check(out, ids, hf_prompt_logprobs(hf, ids), 2)
    llm.engine.check_integrity()
