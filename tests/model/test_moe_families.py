"""Mixtral and Qwen3-MoE through the loader and the decoder: greedy float32 parity with
transformers (batch and single, chunked prefill, the native kernel and the torch path, preemption),
dense layers beside sparse ones (Qwen3-MoE's mlp_only_layers and decoder_sparse_step), and the
routing's batch invariance: a request gives the same tokens alone and among strangers."""

from __future__ import annotations

import json

import pytest

from tests.support.families import LENGTHS, make_family_model
from tests.support.family_parity import (
    assert_greedy_parity,
    assert_preemption_parity,
    assert_same_alone_and_among_strangers,
    random_prompts,
    transformers_greedy,
)
from traceless import LLM

FAMILIES = {
    "mixtral": ("mixtral", {}),  # 4 experts, top 2, every layer sparse
    "mixtral-window": ("mixtral", {"sliding_window": 12, "num_local_experts": 8, "num_experts_per_tok": 2}),
    # layers 0 and 2 sparse, layer 1 dense (mlp_only_layers); 8 experts, top 2, renormalized
    "qwen3_moe": ("qwen3_moe", {"num_hidden_layers": 3, "mlp_only_layers": [1]}),
    # decoder_sparse_step 2: only layer 1 sparse; weights not renormalized
    "qwen3_moe-step": ("qwen3_moe", {"num_hidden_layers": 3, "decoder_sparse_step": 2, "norm_topk_prob": False}),
}


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory):
    return {
        name: make_family_model(tmp_path_factory.mktemp(name), kind, seed=11 + i, **overrides)
        for i, (name, (kind, overrides)) in enumerate(FAMILIES.items())
    }


def test_the_configs_say_which_layers_are_sparse(moe_dirs):
    from traceless.model.dummy import read_dummy_config

    sparse = {
        name: [read_dummy_config(moe_dirs[name]).sparse(i) for i in range(n)]
        for name, n in (("mixtral", 2), ("qwen3_moe", 3), ("qwen3_moe-step", 3))
    }
    assert sparse == {"mixtral": [True, True], "qwen3_moe": [True, False, True], "qwen3_moe-step": [False, True, False]}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_moe_family_matches_transformers(name, moe_dirs):
    prompts = random_prompts(name, LENGTHS)
    assert_greedy_parity(moe_dirs[name], prompts, transformers_greedy(moe_dirs[name], prompts, 16), 16)


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_moe_preemption_and_prefix_hits_match_transformers(name, moe_dirs):
    """A KV cache too small for all the prompts at once: requests are preempted and recomputed;
    the prompts share a prefix (global cache: hits between requests)."""
    assert_preemption_parity(moe_dirs[name], name)


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_a_request_gives_the_same_tokens_alone_and_among_strangers(name, moe_dirs):
    """Dropless, batch-invariant routing: no capacity, so strangers crowding the request's own
    experts (prompts made of its own tokens) or any others change nothing in its answer."""
    assert_same_alone_and_among_strangers(moe_dirs[name], name, rounds=3)


def test_an_expert_the_config_does_not_count_is_refused(moe_dirs, tmp_path):
    """A checkpoint with more experts than num_local_experts says: the extra tensors are unused."""
    from traceless.errors import ModelLoadError

    src = moe_dirs["mixtral"]
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    config = json.loads((src / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"num_local_experts": 3}))
    with pytest.raises(ModelLoadError, match="shape|unused"):
        LLM(str(tmp_path), dtype="float32", kv_cache_memory=4 * 2**20)
