"""The device residue audit's search, and its CPU twin end to end (the CUDA run is in bench/gpu)."""

import random

import pytest
import torch

from traceless_tools.audit.gpu_residue import GpuResidueConfig, Needle, count_hits, run, search


def test_search_finds_planted_needles_at_aligned_offsets_only():
    rng = random.Random(5)
    pool = torch.zeros(3 * 2**20 + 123, dtype=torch.uint8)
    ids = Needle("token_ids", torch.tensor([70001, 2, 3, 40000], dtype=torch.int32).numpy().tobytes(), 4)
    row = Needle("k_row", torch.randn(64, dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes(), 2)
    for at in (0, 4 * 1000, 2**20 - 8):  # the last straddles the first 1 MiB slice edge
        pool[at : at + len(ids.data)] = torch.frombuffer(bytearray(ids.data), dtype=torch.uint8)
    for at in (2 * rng.randrange(10, 10**6), 2**21 + 2):
        pool[at : at + len(row.data)] = torch.frombuffer(bytearray(row.data), dtype=torch.uint8)
    pool[2**21 + 1001 : 2**21 + 1001 + len(ids.data)] = torch.frombuffer(bytearray(ids.data), dtype=torch.uint8)
    assert count_hits(pool, ids) == 3  # the odd offset is not 4-byte aligned
    assert search(pool, [ids, row], slice_bytes=2**20) == {"token_ids": 3, "k_row": 2}


GEMMA3 = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "head_dim": 16,
    "num_hidden_layers": 6,
    "sliding_window": 32,
    "query_pre_attn_scalar": 16,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
}


@pytest.fixture(params=["llama", "gemma3"])
def tiny_dummy_dir(tmp_path, request):
    """A Llama shape, and a Gemma 3 one (local layers with a 32-token window: their own KV groups,
    whose blocks behind the window are freed while a canary runs)."""
    import json

    config = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 48000,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
    }
    (tmp_path / "config.json").write_text(json.dumps(config | (GEMMA3 if request.param == "gemma3" else {})))
    return tmp_path


def test_cpu_twin_finds_no_canary_in_the_kv_pool_after_the_work(tiny_dummy_dir):
    cfg = GpuResidueConfig(
        str(tiny_dummy_dir),
        "dummy",
        "cpu",
        "float32",
        canaries=3,
        prompt_len=70,
        output_len=8,
        free_memory_limit=64 * 2**20,
    )
    report = run(cfg)
    assert report["needles"]["k_row"] > 0 and report["needles"]["v_row"] > 0
    assert report["kv_pool"] == {"nonzero_blocks": 0, "v_row_hits": 0}
    assert report["free_memory"]["bytes_searched"] >= 64 * 2**20
