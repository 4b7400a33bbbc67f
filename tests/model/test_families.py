"""Greedy float32 parity with transformers for Qwen3, Phi-3 (LongRoPE, partial rotary), Gemma 2/3
and a windowed Mistral: prompts shorter and longer than the sliding window and than LongRoPE's
original context, in one batch and one at a time, with chunked prefill, on the native kernel and
the torch path; then prefix hits and preemption."""

from __future__ import annotations

import pytest

from tests.support.families import (
    FAMILIES,
    LENGTHS,
    as_multimodal_gemma3,
    hf_greedy,
    hf_model,
    make_family_model,
    ours,
)
from tests.support.family_parity import (
    assert_greedy_parity,
    random_prompts,
    shared_prefix_prompts,
    small_cache_llm,
    transformers_greedy,
)
from traceless import LLM


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    return {
        name: make_family_model(tmp_path_factory.mktemp(name), kind, seed=7 + i, **overrides)
        for i, (name, (kind, overrides)) in enumerate(FAMILIES.items())
    }


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_matches_transformers(name, family_dirs):
    prompts = random_prompts(name, LENGTHS)
    assert_greedy_parity(family_dirs[name], prompts, transformers_greedy(family_dirs[name], prompts, 20), 20)


@pytest.mark.parametrize("name", ["phi3-longrope", "gemma3", "mistral-window"])
def test_prefix_hits_and_preemption_match_transformers(name, family_dirs):
    """Prompts share leading blocks (a global cache: hits between requests), and the KV cache is
    too small for all of them at once (preemption by recompute). For Phi-3 the shared prefix
    first runs in a short prompt (short factors) and then in prompts past the original context,
    which must not take those blocks."""
    windowed = name == "mistral-window"
    path = family_dirs[name]
    hf = hf_model(path)
    base, prompts = shared_prefix_prompts(name)
    want_base = hf_greedy(hf, base, 16)
    want = [hf_greedy(hf, p, 16) for p in prompts]
    # too few blocks for the five at once, except with the window's freeing. Gemma 3's blocks hold
    # one layer each (a block table per layer group): 60 of them, too few for the five global tables
    llm = small_cache_llm(path, 60 if name == "gemma3" else 40)
    assert ours(llm, [base], 16, batched=False) == [want_base]
    assert llm.engine.cached_prefix_len(prompts[0]) > 0
    assert ours(llm, prompts, 16, batched=True) == want
    # the windowed model frees its blocks as it goes and fits (tests/engine/test_kv_window.py
    # covers its preemption by swapping); the others must have been preempted
    assert (llm.engine.kv_stats().preemptions > 0) != windowed
    llm.engine.drop_prefix_cache()
    llm.engine.check_integrity()


def test_gemma3_multimodal_checkpoint_runs_its_text_model(family_dirs, tmp_path):
    """A Gemma3ForConditionalGeneration directory (sharded, with an index, tensors under
    model.language_model., a vision tensor) gives the text model's tokens."""
    text = family_dirs["gemma3"]
    hf = hf_model(text)
    prompts = random_prompts("gemma3-mm", (7, 20))
    want = [hf_greedy(hf, p, 12) for p in prompts]
    llm = LLM(str(as_multimodal_gemma3(text, tmp_path / "mm")), dtype="float32", kv_cache_memory=4 * 2**20)
    assert ours(llm, prompts, 12, batched=True) == want


def test_a_missing_shard_is_refused(family_dirs, tmp_path):
    from traceless.errors import ModelLoadError

    mm = as_multimodal_gemma3(family_dirs["gemma3"], tmp_path / "mm")
    (mm / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="shard"):
        LLM(str(mm), dtype="float32", kv_cache_memory=4 * 2**20)
