"""Prefix-cache hits give exactly the outputs of a cold run (tiny model, float32)."""

import random

import pytest

from traceless import LLM, SamplingParams

SALT = "s" * 24


@pytest.mark.parametrize("mode", ["isolated", "global"])
def test_cached_prefixes_give_identical_outputs(tiny_llama_dir, mode):
    rng = random.Random(3)
    system = [rng.randrange(3, 384) for _ in range(40)]
    prompts = [system + [rng.randrange(3, 384) for _ in range(n)] for n in (3, 17, 30)]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    cold = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, prefix_cache="off")
    want = [
        o.outputs[0].token_ids
        for o in cold.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
    ]
    warm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, prefix_cache=mode, block_size=8)
    salted = [{"prompt_token_ids": p, "cache_salt": SALT} for p in prompts]
    for p, w in zip(salted, want):  # one at a time: each later prompt hits the system prefix
        assert warm.generate(p, greedy, use_tqdm=False)[0].outputs[0].token_ids == w
    assert warm.engine.kv_stats().cached_blocks > 0
    # multi-turn: the second turn extends the first turn's prompt and output
    turn1 = prompts[0] + list(want[0])
    assert hit_tokens(warm, turn1 + [9, 9, 9]) >= 40  # the prompt and the generated tokens are cached
    assert warm.engine.drop_prefix_cache() > 0
    warm.engine.check_integrity()


def hit_tokens(llm, tokens) -> int:
    """How many leading tokens a salted request would take from the cache."""
    return llm.engine.cached_prefix_len(tokens, SALT)


def test_unsalted_requests_do_not_cache_in_isolated_mode(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20)
    llm.generate({"prompt_token_ids": list(range(5, 60))}, SamplingParams(max_tokens=2), use_tqdm=False)
    assert llm.engine.kv_stats().cached_blocks == 0
    llm.engine.check_integrity()
