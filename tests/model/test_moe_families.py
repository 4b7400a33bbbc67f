"""Mixtral and Qwen3-MoE through the loader and the decoder: greedy float32 parity with
transformers (batch and single, chunked prefill, the native kernel and the torch path, preemption),
dense layers beside sparse ones (Qwen3-MoE's mlp_only_layers and decoder_sparse_step), and the
routing's batch invariance: a request gives the same tokens alone and among strangers."""
from __future__ import annotations

import json
import random

import pytest
import torch

from tests.support.families import hf_greedy, make_family_model, ours
from traceless import LLM

FAMILIES = {
    "mixtral": ("mixtral", {}),  # 4 experts, top 2, every layer sparse
    "mixtral-window": ("mixtral", {"sliding_window": 12, "num_local_experts": 8, "num_experts_per_tok": 2}),
    # layers 0 and 2 sparse, layer 1 dense (mlp_only_layers); 8 experts, top 2, renormalized
    "qwen3_moe": ("qwen3_moe", {"num_hidden_layers": 3, "mlp_only_layers": [1]}),
    # decoder_sparse_step 2: only layer 1 sparse; weights not renormalized
    "qwen3_moe-step": ("qwen3_moe", {"num_hidden_layers": 3, "decoder_sparse_step": 2, "norm_topk_prob": False}),
}
LENGTHS = (1, 5, 12, 13, 30, 45)


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory):
    return {name: make_family_model(tmp_path_factory.mktemp(name), kind, seed=11 + i, **overrides)
            for i, (name, (kind, overrides)) in enumerate(FAMILIES.items())}


def _prompts(seed: str, lengths=LENGTHS) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 384) for _ in range(n)] for n in lengths]


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_the_configs_say_which_layers_are_sparse(moe_dirs):
    from traceless.model.dummy import read_dummy_config

    sparse = {name: [read_dummy_config(moe_dirs[name]).sparse(i) for i in range(n)]
              for name, n in (("mixtral", 2), ("qwen3_moe", 3), ("qwen3_moe-step", 3))}
    assert sparse == {"mixtral": [True, True], "qwen3_moe": [True, False, True],
                      "qwen3_moe-step": [False, True, False]}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_moe_family_matches_transformers(name, moe_dirs):
    path = moe_dirs[name]
    hf = _hf(path)
    prompts = _prompts(name)
    want = [hf_greedy(hf, p, 16) for p in prompts]
    for backend, block_size in (("native", 4), ("torch", 16)):
        # a small token budget: chunked prefill mixed with decodes in one step
        llm = LLM(str(path), dtype="float32", kv_cache_memory=8 * 2**20, max_num_batched_tokens=24,
                  attention_backend=backend, block_size=block_size)
        assert ours(llm, prompts, 16, batched=True) == want, backend
        if backend == "native":
            assert ours(llm, prompts[2:5], 16, batched=False) == want[2:5]
        llm.engine.check_integrity()


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_moe_preemption_and_prefix_hits_match_transformers(name, moe_dirs):
    """A KV cache too small for all the prompts at once: requests are preempted and recomputed;
    the prompts share a prefix (global cache: hits between requests)."""
    path = moe_dirs[name]
    hf = _hf(path)
    base = _prompts(name + "-base", (24,))[0]
    prompts = [base + t for t in _prompts(name + "-tails", (3, 20, 28, 9, 30))]
    want = [hf_greedy(hf, p, 16) for p in prompts]
    config = json.loads((path / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    block_bytes = 2 * 4 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4
    llm = LLM(str(path), dtype="float32", block_size=4, kv_cache_memory=40 * block_bytes,
              max_num_batched_tokens=32, prefix_cache="global", max_model_len=100)
    assert ours(llm, prompts, 16, batched=True) == want
    assert llm.engine.kv_stats().preemptions > 0
    llm.engine.drop_prefix_cache()
    llm.engine.check_integrity()


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_a_request_gives_the_same_tokens_alone_and_among_strangers(name, moe_dirs):
    """Dropless, batch-invariant routing: no capacity, so strangers crowding the request's own
    experts (prompts made of its own tokens) or any others change nothing in its answer."""
    path = moe_dirs[name]
    llm = LLM(str(path), dtype="float32", kv_cache_memory=16 * 2**20, max_num_batched_tokens=64)
    victim = _prompts(name + "-victim", (17,))[0]
    alone = ours(llm, [victim], 24, batched=False)[0]
    rng = random.Random(name)
    for round_ in range(3):
        crowd = [[rng.choice(victim) for _ in range(rng.randrange(20, 60))] for _ in range(3)]
        strangers = crowd + _prompts(f"{name}-strangers-{round_}", [rng.randrange(1, 50) for _ in range(4)])
        rng.shuffle(strangers)
        at = rng.randrange(len(strangers) + 1)
        batch = strangers[:at] + [victim] + strangers[at:]
        assert ours(llm, batch, 24, batched=True)[at] == alone, round_
    llm.engine.check_integrity()


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
