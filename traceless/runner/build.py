"""Assemble the torch side of an engine from an EngineConfig: device, dtype, weights, KV cache,
attention backend, model runner, KV offload store; handed to the engine as `EngineParts`."""
from __future__ import annotations

import torch

from traceless.config import DEFAULT_CPU_KV_BYTES, EngineConfig
from traceless.engine.step_io import EngineParts, ModelInfo
from traceless.errors import ModelLoadError
from traceless.model.config import ModelConfig
from traceless.model.layers.attention import PagedAttention
from traceless.model.layers.kernels import KernelUnavailable, NativeKernels
from traceless.model.layers.kv_cache import KVCache, block_bytes
from traceless.model.layers.ops import NativeOps, TorchOps
from traceless.model.llama import LlamaModel
from traceless.model.loader import load_model
from traceless.model.rope import Rope
from traceless.runner.model_runner import ModelRunner

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was requested but CUDA is not available")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16  # CPUs with AVX-512 BF16/AMX and every recent GPU run it natively
    if name == "float16" and device.type == "cpu":
        raise ValueError("float16 is not supported on CPU; use bfloat16 or float32")
    return _DTYPES[name]


def _kv_budget(cfg: EngineConfig, device: torch.device, weight_bytes: int) -> int:
    if cfg.kv_cache_memory is not None:
        return cfg.kv_cache_memory
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        util = cfg.gpu_memory_utilization or 0.9
        # Leave room for activations: a quarter of what is left after the weights, at least 1 GiB.
        spare = total * util - weight_bytes
        return int(min(free, spare - max(spare / 4, 2**30)))
    if cfg.gpu_memory_utilization is not None:
        import os

        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * cfg.gpu_memory_utilization)
    return DEFAULT_CPU_KV_BYTES


def _attention_backend(cfg: EngineConfig, device: torch.device, dtype: torch.dtype) -> NativeKernels | None:
    if cfg.attention_backend == "torch" or (cfg.attention_backend == "auto" and device.type != "cpu"):
        return None
    if device.type != "cpu":
        raise ValueError("attention_backend='native' runs on CPU only")
    try:
        kernels = NativeKernels.load()
    except KernelUnavailable:
        if cfg.attention_backend == "native":
            raise
        return None
    return kernels if kernels.supports(dtype) else None


def _draft_layers(cfg: EngineConfig, mc: ModelConfig) -> int | None:
    """Self-speculation depth: the configured one, or a quarter of the model's layers."""
    if cfg.speculative != "draft":
        return None
    n = cfg.draft_layers if cfg.draft_layers is not None else max(1, mc.num_layers // 4)
    if n >= mc.num_layers:
        raise ValueError(f"draft_layers={n} must be below the model's {mc.num_layers} layers")
    return n


def build_engine_parts(cfg: EngineConfig) -> EngineParts:
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    loaded = load_model(cfg.model, dtype)
    mc = loaded.config
    draft_layers = _draft_layers(cfg, mc)
    limit = (mc.max_position_embeddings if mc.sliding_window is None
             else min(mc.max_position_embeddings, mc.sliding_window))
    max_model_len = cfg.max_model_len or limit
    if max_model_len > limit:
        raise ValueError(f"max_model_len {max_model_len} exceeds the model's context of {limit} tokens")
    weight_bytes = sum(t.numel() * t.element_size() for t in loaded.weights.values())
    num_blocks = _kv_budget(cfg, device, weight_bytes) // block_bytes(mc, cfg.block_size, dtype)
    need = -(-max_model_len // cfg.block_size) + 1  # + the null block
    if num_blocks < need:
        raise ValueError(
            f"the KV cache budget holds {max(num_blocks - 1, 0) * cfg.block_size} tokens, fewer than "
            f"max_model_len={max_model_len}; raise kv_cache_memory or lower max_model_len"
        )
    kernels = _attention_backend(cfg, device, dtype)
    cache = KVCache(mc, num_blocks, cfg.block_size, dtype, device)
    rope = Rope(mc, max_model_len, dtype, device, loaded.weights.get("rope_freqs"))
    heads = (mc.num_heads, mc.num_kv_heads, mc.head_dim)
    ops = (NativeOps(kernels, cache, rope, heads, mc.rms_norm_eps) if kernels is not None
           else TorchOps(cache, rope, heads, mc.rms_norm_eps))
    pack = device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
    try:
        model = LlamaModel(mc, loaded.weights, PagedAttention(cache, kernels, heads), ops, device, pack)
    except RuntimeError as exc:  # e.g. out of memory while moving weights
        raise ModelLoadError(f"cannot place the model on {device} ({type(exc).__name__})") from None
    runner = ModelRunner(model, cfg.block_size, device, kernels is not None, cfg.seed, draft_layers)
    offload = None
    if cfg.kv_offload != "none":
        from traceless.runner.offload import KVOffloader

        offload = KVOffloader(cache, cfg.kv_offload, cfg.kv_offload_dir or _default_offload_dir())
    info = ModelInfo(name=loaded.name, path=str(loaded.path), vocab_size=mc.vocab_size, max_model_len=max_model_len,
                     num_layers=mc.num_layers, device=device.type, dtype=str(dtype).removeprefix("torch."),
                     attention="native" if kernels is not None else "torch")
    return EngineParts(runner, cache, loaded.tokenizer, info, offload)


def _default_offload_dir() -> str:
    """A private spill directory for this process, removed at exit (it is empty by then: every
    spill file is unlinked when its request resumes or ends)."""
    import atexit
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="traceless-kv-")
    atexit.register(shutil.rmtree, path, True)
    return path
