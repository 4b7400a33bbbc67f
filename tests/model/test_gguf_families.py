"""GGUF qwen3, gemma3 and phi3 files, written here with the `gguf` package the way llama.cpp's
converter writes them (names, metadata, gemma's 1 + w norms, phi3's fused tensors and LongRoPE
factor tensors; F32 tensors), load and generate transformers' tokens."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from tests.model.gguf_helpers import add_vocab, byte_level_vocab
from tests.support.families import hf_greedy, longrope_scaling, make_family_model, ours
from traceless import LLM

# HF name after "model.layers.N." -> llama.cpp name after "blk.N."
LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",  # phi3
}
GEMMA = LAYER | {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
MODELS = {
    "qwen3": {},
    "gemma3": {
        "sliding_window": 12,
        "num_hidden_layers": 3,
        "query_pre_attn_scalar": 16,
        "tie_word_embeddings": True,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    },
    "phi3": {"rope_scaling": longrope_scaling(16, 32), "original_max_position_embeddings": 32},
}


def _metadata(writer, arch: str, cfg: dict) -> None:
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    rope = cfg.get("rope_parameters") or {}
    if arch == "gemma3":
        writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
        writer.add_sliding_window(cfg["sliding_window"])
        writer.add_uint32("gemma3.attention.sliding_window_pattern", 3)  # layers 3, 6, ... are global
        writer.add_float32("gemma3.rope.freq_base_swa", rope["sliding_attention"]["rope_theta"])
        writer.add_rope_scaling_type(__import__("gguf").RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["full_attention"]["factor"])
    else:
        writer.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    if arch == "phi3":
        writer.add_rope_dimension_count(head_dim)
        writer.add_rope_scaling_orig_ctx_len(cfg["original_max_position_embeddings"])
        writer.add_sliding_window(0)


def write_gguf(hf_dir, arch: str, path) -> None:
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    writer = gguf.GGUFWriter(str(path), arch)
    _metadata(writer, arch, cfg)
    add_vocab(writer, byte_level_vocab(cfg["vocab_size"]))
    names = GEMMA if arch == "gemma3" else LAYER
    for name, w in load_file(str(hf_dir / "model.safetensors")).items():
        if name in GLOBAL:
            out = GLOBAL[name]
        else:
            _, _, layer, rest = name.split(".", 3)
            out = f"blk.{layer}.{names[rest]}"
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = w + 1.0  # llama.cpp's converter stores Gemma's norms as 1 + w
        writer.add_tensor(out, np.ascontiguousarray(w, dtype=np.float32))
    if arch == "phi3":
        rope = cfg["rope_parameters"]
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("arch", list(MODELS))
def test_gguf_family_matches_transformers(arch, tmp_path):
    from transformers import AutoModelForCausalLM

    hf_dir = make_family_model(tmp_path / "hf", arch, seed=21, **MODELS[arch])
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    path = tmp_path / f"{arch}.gguf"
    write_gguf(hf_dir, arch, path)
    rng = random.Random(arch)
    prompts = [[rng.randrange(3, 384) for _ in range(n)] for n in (4, 20, 40)]  # around window 12, context 32
    llm = LLM(str(path), dtype="float32", kv_cache_memory=4 * 2**20, max_num_batched_tokens=24)
    assert llm.engine.model.name == arch
    assert ours(llm, prompts, 16, batched=True) == [hf_greedy(hf, p, 16) for p in prompts]


def test_gguf_partial_rotary_is_refused_outside_phi3(tmp_path):
    from traceless.errors import UnsupportedModelError
    from traceless.model.gguf_config import from_gguf_metadata

    meta = {
        "general.architecture": "qwen3",
        "qwen3.embedding_length": 64,
        "qwen3.attention.head_count": 4,
        "qwen3.feed_forward_length": 128,
        "qwen3.block_count": 2,
        "qwen3.context_length": 64,
        "qwen3.attention.layer_norm_rms_epsilon": 1e-5,
        "qwen3.vocab_size": 384,
        "qwen3.rope.dimension_count": 8,
    }
    with pytest.raises(UnsupportedModelError, match="rope.dimension_count"):
        from_gguf_metadata(meta, True, False)
