"""gpt-oss (GptOssForCausalLM) through the loader and the decoder: greedy float32 parity with
transformers on tiny random models: attention sinks, alternating sliding-window and full layers,
YaRN rope scaling, biased projections, clamped SwiGLU experts (top 2 of 8) with biases, experts
published in MXFP4 and dequantized at load; batch and single, chunked prefill, the native kernel
and the torch path, preemption, and the same tokens for a request alone and among strangers."""

from __future__ import annotations

import pytest
import torch

from tests.support.families import LENGTHS, make_family_model, ours
from tests.support.family_parity import (
    assert_greedy_parity,
    assert_preemption_parity,
    assert_same_alone_and_among_strangers,
    random_prompts,
    transformers_greedy,
)
from tests.support.mxfp4_checkpoint import encode_mxfp4, write_mxfp4_checkpoint
from traceless import LLM
from traceless.model.mxfp4 import dequantize_mxfp4

# LENGTHS: windows of 8, so most prompts reach past them


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory):
    return make_family_model(tmp_path_factory.mktemp("gpt_oss"), "gpt_oss", seed=3)


def test_gpt_oss_matches_transformers(gpt_oss_dir):
    prompts = random_prompts("gpt-oss", LENGTHS)
    want = transformers_greedy(gpt_oss_dir, prompts, 16)
    assert len({t for w in want for t in w}) > 20  # the model says varied things: a test that can fail
    assert_greedy_parity(gpt_oss_dir, prompts, want, 16)
    llm = LLM(
        str(gpt_oss_dir),
        dtype="float32",
        kv_cache_memory=8 * 2**20,
        max_num_batched_tokens=24,
        attention_backend="native",
        block_size=4,
    )
    for layer in llm.engine._executor.model.layers:  # without the sinks it differs
        layer.sinks = None
    assert ours(llm, prompts, 16, batched=True) != want


def test_mxfp4_experts_are_dequantized_at_load(gpt_oss_dir, tmp_path):
    quantized, reference = write_mxfp4_checkpoint(gpt_oss_dir, tmp_path)
    prompts = random_prompts("mxfp4", (3, 17, 30))
    want = transformers_greedy(reference, prompts, 12)
    llm = LLM(str(quantized), dtype="float32", kv_cache_memory=8 * 2**20)
    assert ours(llm, prompts, 12, batched=True) == want
    llm.engine.check_integrity()


def test_the_mxfp4_writer_round_trips():
    w = torch.randn(2, 8, 64)
    blocks, scales, values = encode_mxfp4(w)
    assert torch.equal(dequantize_mxfp4(blocks, scales, torch.float32), values)
    assert (values - w).abs().max() <= w.abs().max() / 4  # e2m1: within a quarter of the block's largest


def test_gpt_oss_preemption_and_prefix_hits_match_transformers(gpt_oss_dir):
    # windowed and full layers alternate: a block holds one layer of each group (two groups of
    # two); 60 blocks are too few for the five requests' full-attention tables alone
    assert_preemption_parity(gpt_oss_dir, "gpt-oss", blocks=60)


def test_a_request_gives_the_same_tokens_alone_and_among_strangers(gpt_oss_dir):
    assert_same_alone_and_among_strangers(gpt_oss_dir, "gpt-oss", rounds=2)


def test_config_reads_sinks_bias_and_windows(gpt_oss_dir):
    """(The Triton attention's sinks: tests/model/layers/test_triton_kernels.py; on a GPU,
    tests/runner/test_cuda.py runs this family through it.)"""
    from traceless.model.config import ModelConfig
    from traceless.model.dummy import read_dummy_config

    mc: ModelConfig = read_dummy_config(gpt_oss_dir)
    assert mc.attn_sinks and mc.o_bias and mc.layer_windows == (8, 0, 8, 0)
