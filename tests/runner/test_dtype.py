"""`--dtype auto` and the packed bfloat16 weights follow what the CPU runs in hardware: an AVX2-only
CPU gets float32 by default, and an explicit bfloat16 there builds without oneDNN's packed weights."""

import pytest
import torch

import traceless.runner.build as build
from traceless.config import EngineConfig
from traceless.entrypoints.llm import LLM
from traceless.errors import ConfigError
from traceless.modes import DType
from traceless.sampling_params import SamplingParams


def test_auto_is_bfloat16_on_gpus_and_on_cpus_that_run_it(monkeypatch):
    monkeypatch.setattr(build, "cpu_runs_bf16", lambda: True)
    assert build.resolve_dtype(DType.AUTO, torch.device("cpu")) == torch.bfloat16
    monkeypatch.setattr(build, "cpu_runs_bf16", lambda: False)
    assert build.resolve_dtype(DType.AUTO, torch.device("cpu")) == torch.float32
    assert build.resolve_dtype(DType.AUTO, torch.device("cuda")) == torch.bfloat16
    assert build.resolve_dtype(DType.BFLOAT16, torch.device("cpu")) == torch.bfloat16


def test_explicit_bfloat16_builds_and_runs_without_avx512(monkeypatch, tiny_llama_dir):
    monkeypatch.setattr(build, "cpu_runs_bf16", lambda: False)
    parts = build.build_engine_parts(
        EngineConfig(model=str(tiny_llama_dir), dtype="bfloat16", kv_cache_memory=2**22, max_model_len=64)
    )
    assert parts.model.dtype == "bfloat16"
    llm = LLM(model=str(tiny_llama_dir), dtype="bfloat16", kv_cache_memory=2**22, max_model_len=64)
    out = llm.generate(["hello"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def test_compute_dtype_is_float32_for_weights_quantized_for_the_cpu(monkeypatch, tiny_llama_dir):
    """One rule for what an engine computes in: the built-in GGUF model keeps its blocks under
    auto and computes in float32 even where the CPU runs bfloat16; a dtype given dequantizes it;
    q8_0 at load computes in float32; a dense checkpoint takes dtype auto's answer."""
    monkeypatch.setattr(build, "cpu_runs_bf16", lambda: True)
    cpu = {"device": "cpu"}
    assert build.compute_dtype(EngineConfig(**cpu)) == torch.float32
    assert build.compute_dtype(EngineConfig(dtype="bfloat16", **cpu)) == torch.bfloat16
    hf = str(tiny_llama_dir)
    assert build.compute_dtype(EngineConfig(model=hf, **cpu)) == torch.bfloat16
    assert build.compute_dtype(EngineConfig(model=hf, quantization="q8_0", **cpu)) == torch.float32
    monkeypatch.setattr(build, "cpu_runs_bf16", lambda: False)
    assert build.compute_dtype(EngineConfig(model=hf, **cpu)) == torch.float32


def test_the_engine_computes_in_compute_dtype(monkeypatch, tiny_llama_dir):
    monkeypatch.setattr(build, "cpu_runs_bf16", lambda: True)
    for quantization in ("auto", "q8_0"):
        cfg = EngineConfig(
            model=str(tiny_llama_dir), device="cpu", quantization=quantization, kv_cache_memory=2**22, max_model_len=64
        )
        parts = build.build_engine_parts(cfg)
        assert parts.model.dtype == str(build.compute_dtype(cfg)).removeprefix("torch.")
        assert parts.kv_memory.k.dtype == parts.kv_memory.v.dtype == build.cache_dtype(cfg)


def test_the_cache_dtype_rule(monkeypatch, tiny_llama_dir):
    """auto: float16 under the CPU's int8 kernels and the native attention kernel (the built-in
    model's case), else the activations' dtype; float16 asked for under float32 activations on the
    CPU; any other dtype than the activations' refused with a message that says what is allowed."""
    monkeypatch.setattr(build, "cpu_runs_bf16", lambda: True)
    hf, cpu = str(tiny_llama_dir), {"device": "cpu"}
    assert build.cache_dtype(EngineConfig(**cpu)) == torch.float16
    assert build.cache_dtype(EngineConfig(model=hf, quantization="q8_0", **cpu)) == torch.float16
    assert build.cache_dtype(EngineConfig(model=hf, **cpu)) == torch.bfloat16  # dense: the activations'
    torch_backend = {"attention_backend": "torch", **cpu}
    assert build.cache_dtype(EngineConfig(model=hf, quantization="q8_0", **torch_backend)) == torch.float32
    asked = {"kv_cache_dtype": "float16", **torch_backend}
    assert build.cache_dtype(EngineConfig(model=hf, quantization="q8_0", **asked)) == torch.float16
    assert build.cache_dtype(EngineConfig(kv_cache_dtype="float32", **cpu)) == torch.float32
    with pytest.raises(ValueError, match="float16 under float32 activations"):
        build.cache_dtype(EngineConfig(model=hf, kv_cache_dtype="float16", **cpu))  # bfloat16 activations
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="fp8")
