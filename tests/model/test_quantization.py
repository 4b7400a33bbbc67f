"""Weights kept quantized on the CPU: the rule that picks the format, the refusals, and models that
run on quantized weights (a GGUF file's blocks, a Hugging Face checkpoint quantized at load)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_tiny_model
from traceless import LLM, SamplingParams
from traceless.config import EngineConfig
from traceless.model.layers.quant import QuantTensor
from traceless.model.quantization import Quantization, resolve_quantization
from traceless.modes import DType, LoadFormat, QuantizationMode
from traceless.runner.build import build_engine_parts


def _rule(requested, dtype="auto", device="cpu", gguf=True, load_format="auto", kernels=True):
    return resolve_quantization(
        QuantizationMode(requested), DType(dtype), device, gguf, LoadFormat(load_format), kernels
    )


def test_auto_keeps_a_gguf_files_blocks_unless_a_dtype_is_given():
    assert _rule("auto") is Quantization.GGUF
    assert _rule("auto", dtype="float32") is Quantization.NONE
    assert _rule("auto", dtype="bfloat16") is Quantization.NONE
    assert _rule("auto", gguf=False) is Quantization.NONE
    assert _rule("auto", device="cuda") is Quantization.NONE
    assert _rule("auto", kernels=False) is Quantization.NONE
    assert _rule("q8_0", gguf=False, dtype="float32") is Quantization.Q8_0
    assert _rule("gguf", dtype="float32") is Quantization.GGUF
    assert _rule("none") is Quantization.NONE
    assert _rule("fp8", gguf=False, device="cuda") is Quantization.FP8
    assert _rule("fp8", gguf=False, device="cuda", load_format="dummy", dtype="bfloat16") is Quantization.FP8


@pytest.mark.parametrize(
    "kwargs,words",
    [
        (dict(requested="gguf", gguf=False), ["Hugging Face", "q8_0"]),
        (dict(requested="q4_0", gguf=True), ["quantized already", "gguf"]),
        (dict(requested="q8_0", gguf=False, device="cuda"), ["CPU"]),
        (dict(requested="gguf", dtype="bfloat16"), ["float32", "bfloat16"]),
        (dict(requested="q8_0", gguf=False, load_format="dummy"), ["dummy"]),
        (dict(requested="gguf", kernels=False), ["native kernels"]),
        (dict(requested="fp8", gguf=True, device="cuda"), ["GGUF", "gguf"]),
        (dict(requested="fp8", gguf=False, device="cpu"), ["CUDA", "q8_0"]),
    ],
)
def test_contradictory_combinations_are_refused(kwargs, words):
    with pytest.raises(ValueError) as info:
        _rule(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_unknown_quantization_is_refused():
    with pytest.raises(ValueError, match="quantization must be one of"):
        EngineConfig(quantization="q5_1")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("hf"), "llama", seed=11, hidden_size=64, intermediate_size=128)


def test_hf_checkpoint_quantized_at_load_is_refused_for_gguf_words(tiny_dir):
    with pytest.raises(ValueError, match="gguf"):
        LLM(str(tiny_dir), quantization="gguf", kv_cache_memory=2**20)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_hf_checkpoint_quantized_at_load_runs_on_quantized_weights(tiny_dir, fmt):
    torch.set_num_threads(1)
    parts = build_engine_parts(EngineConfig(model=str(tiny_dir), quantization=fmt, kv_cache_memory=2**20))
    model = parts.executor.model  # type: ignore[attr-defined]
    assert parts.model.quantization == fmt and parts.model.dtype == "float32"
    assert isinstance(model.embed, QuantTensor) and model.embed.fmt.name.removesuffix("_ROWS") == fmt.upper()
    assert all(
        isinstance(linear.impl.parts[0], QuantTensor)
        for layer in model.layers
        for linear in (layer.qkv, layer.o, layer.mlp.gate_up, layer.mlp.down)
    )
    # first-step log-probabilities near the dense float32 model's (a random model's are near-flat, so
    # compare values, not argmax choices): q8_0 within 0.05 nats, q4_0 within 0.5
    prompts = [[5, 9, 200, 17], [17, 300, 42, 8, 99, 250, 3]]
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=5)
    dense = LLM(str(tiny_dir), dtype="float32", kv_cache_memory=2**20)
    quant = LLM(str(tiny_dir), quantization=fmt, kv_cache_memory=2**20)
    tol = 0.05 if fmt == "q8_0" else 0.5
    for p in prompts:
        want = dense.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0].outputs[0].logprobs[0]
        got = quant.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0].outputs[0].logprobs[0]
        common = set(want) & set(got)
        assert common and all(abs(want[t].logprob - got[t].logprob) < tol for t in common)
    quant.engine.check_integrity()


def test_a_mixtures_experts_are_quantized_one_matrix_at_a_time(tmp_path):
    """q8_0 on a Mixtral checkpoint: every expert matrix runs on blocks (the routers stay dense, so
    routing is the dense model's); first-step log-probabilities within 0.3 nats of float32's (this
    model's logits are ~+-20, 8x make_tiny_model's: measured up to 0.17; wrong blocks move them by
    nats)."""
    from tests.support.families import make_family_model
    from traceless.model.layers.linear import _Quant

    torch.set_num_threads(1)
    path = make_family_model(tmp_path, "mixtral", seed=4)
    quant = LLM(str(path), quantization="q8_0", kv_cache_memory=2**20)
    dense = LLM(str(path), dtype="float32", kv_cache_memory=2**20)
    for layer in quant.engine._executor.model.layers:
        block = layer.mlp.block
        assert block.router.dtype == torch.float32
        assert all(
            isinstance(lin.impl, _Quant) and isinstance(lin.impl.parts[0], QuantTensor)
            for lin in block.gate_up + block.down
        )
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=5)
    for p in ([5, 9, 200, 17], [17, 300, 42, 8, 99, 250, 3]):
        want = dense.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0].outputs[0].logprobs[0]
        got = quant.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0].outputs[0].logprobs[0]
        common = set(want) & set(got)
        assert common and all(abs(want[t].logprob - got[t].logprob) < 0.3 for t in common)
    quant.engine.check_integrity()
