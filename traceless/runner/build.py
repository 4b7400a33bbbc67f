"""Assemble the torch side of an engine from an EngineConfig: device, dtype, weights, KV cache,
attention backend, model runner, KV offload store; handed to the engine as `EngineParts`."""

from __future__ import annotations

import torch

from traceless.config import EngineConfig
from traceless.engine.step_io import EngineParts, ModelInfo
from traceless.errors import ModelLoadError
from traceless.model.config import LayerRope, ModelConfig
from traceless.model.layers.attention import AttentionLayer, PagedAttention
from traceless.model.layers.kernels import KernelUnavailable, NativeKernels
from traceless.model.layers.kv_cache import KVCache, block_bytes
from traceless.model.layers.ops import DecoderOps, NativeOps, TorchOps
from traceless.model.llama import LlamaModel
from traceless.model.loader import builtin_chat_template, is_gguf_model, load_model
from traceless.model.quantization import Quantization, resolve_quantization
from traceless.model.rope import Rope
from traceless.modes import AttentionBackend, DType, KVCacheDType, KVOffload, LoadFormat, QuantizationMode, SpecMode
from traceless.runner.kv_budget import KVSizing, check_blocks, kv_budget
from traceless.runner.model_runner import ModelRunner

_DTYPES = {DType.FLOAT32: torch.float32, DType.BFLOAT16: torch.bfloat16, DType.FLOAT16: torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was requested but CUDA is not available")
    return device


def cpu_runs_bf16() -> bool:
    """Whether this CPU computes bfloat16 matmuls in hardware (AVX-512 BW/VL/DQ, with or without the
    BF16 extension, or AMX): oneDNN's packed bfloat16 weights need it. On an AVX2-only CPU bfloat16 is
    emulated element by element, slower than float32, and the packed path refuses to run."""
    return bool(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())


def resolve_dtype(dtype: DType, device: torch.device) -> torch.dtype:
    """The dtype asked for, on `device`; what an engine computes in is compute_dtype's answer."""
    if dtype is DType.AUTO:
        # bfloat16 where the hardware runs it (every recent GPU, AVX-512/AMX CPUs); float32 elsewhere
        return torch.bfloat16 if device.type != "cpu" or cpu_runs_bf16() else torch.float32
    if dtype is DType.FLOAT16 and device.type == "cpu":
        raise ValueError("float16 is not supported on CPU; use bfloat16 or float32")
    return _DTYPES[dtype]


def compute_dtype(cfg: EngineConfig, device: torch.device | None = None) -> torch.dtype:
    """The dtype an engine of `cfg` computes activations in (on `device`,
    default cfg.device resolved). Weights quantized for the CPU's int8 kernels (a GGUF file's own
    blocks, which `auto` keeps on the CPU, or q8_0/q4_0) take and give float32 activations;
    otherwise cfg.dtype, whose `auto` is bfloat16 where the hardware runs it, else float32. Its
    KV cache holds cache_dtype's."""
    device = resolve_device(cfg.device) if device is None else device
    return torch.float32 if _quantization(cfg, device).cpu_blocks else resolve_dtype(cfg.dtype, device)


def cache_dtype(cfg: EngineConfig, device: torch.device | None = None) -> torch.dtype:
    """The dtype of the KV cache of an engine of `cfg` (on `device`, default cfg.device resolved):
    the activations' (compute_dtype), or float16 under float32 activations on the CPU. auto:
    float16 where the weights run on the CPU's int8 kernels and attention on the native kernel,
    else the activations' dtype. The engine sizes its cache by it, and so do the tools that size a
    cache for one."""
    device = resolve_device(cfg.device) if device is None else device
    dtype = compute_dtype(cfg, device)
    asked = cfg.kv_cache_dtype
    if asked is KVCacheDType.AUTO:
        native = device.type == "cpu" and _attention_backend(cfg, device, dtype) is AttentionBackend.NATIVE
        return torch.float16 if native and _quantization(cfg, device).cpu_blocks else dtype
    want = _DTYPES[DType(asked.value)]
    if want == dtype or (want == torch.float16 and device.type == "cpu" and dtype == torch.float32):
        return want
    name = str(dtype).removeprefix("torch.")
    raise ValueError(
        f"kv_cache_dtype={asked.value}: the cache holds the activations' dtype ({name} here), or "
        "float16 under float32 activations on the CPU"
    )


def _attention_backend(cfg: EngineConfig, device: torch.device, dtype: torch.dtype) -> AttentionBackend:
    """The backend that runs: NATIVE (CPU C kernel), TRITON (CUDA kernels) or TORCH (SDPA and torch ops)."""
    asked = cfg.attention_backend
    if device.type == "cpu":
        if asked is AttentionBackend.TRITON:
            raise ValueError("attention_backend='triton' runs on CUDA only")
        if asked is AttentionBackend.TORCH:
            return AttentionBackend.TORCH
        try:
            kernels = NativeKernels.load()
        except KernelUnavailable:
            if asked is AttentionBackend.NATIVE:
                raise
            return AttentionBackend.TORCH
        return AttentionBackend.NATIVE if kernels.supports(dtype) else AttentionBackend.TORCH
    if asked is AttentionBackend.NATIVE:
        raise ValueError("attention_backend='native' runs on CPU only")
    if asked in (AttentionBackend.TRITON, AttentionBackend.AUTO):
        try:
            import triton  # noqa: F401  (ships with torch's CUDA wheels)
        except ImportError:
            if asked is AttentionBackend.TRITON:
                raise ValueError("attention_backend='triton' needs the triton package") from None
            return AttentionBackend.TORCH
        return AttentionBackend.TRITON
    return AttentionBackend.TORCH


def _draft_layers(cfg: EngineConfig, mc: ModelConfig) -> int | None:
    """Self-speculation depth: the configured one, or a quarter of the model's layers."""
    if cfg.speculative is not SpecMode.DRAFT:
        return None
    n = cfg.draft_layers if cfg.draft_layers is not None else max(1, mc.num_layers // 4)
    if n >= mc.num_layers:
        raise ValueError(f"draft_layers={n} must be below the model's {mc.num_layers} layers")
    return n


def _layers(
    backend: AttentionBackend, cache: KVCache, ropes: list[Rope], mc: ModelConfig
) -> tuple[AttentionLayer, DecoderOps]:
    heads = (mc.num_heads, mc.num_kv_heads, mc.head_dim)
    if backend is AttentionBackend.TRITON:
        from traceless.model.layers.triton_ops import TritonAttention, TritonOps

        return (
            TritonAttention(cache, heads, mc.layer_windows, mc.attn_softcap),
            TritonOps(cache, ropes, heads, mc.rms_norm_eps),
        )
    if backend is AttentionBackend.NATIVE:
        kernels = NativeKernels.load()
        return (
            PagedAttention(cache, kernels, heads, mc.layer_windows, mc.attn_softcap),
            NativeOps(kernels, cache, ropes, heads, mc.rms_norm_eps),
        )
    return (
        PagedAttention(cache, None, heads, mc.layer_windows, mc.attn_softcap),
        TorchOps(cache, ropes, heads, mc.rms_norm_eps),
    )


def _ropes(
    mc: ModelConfig, max_model_len: int, dtype: torch.dtype, device: torch.device, freq_factors: torch.Tensor | None
) -> list[Rope]:
    """Each layer's Rope; layers of one kind (global, or Gemma 3's local ones) share theirs."""
    built: dict[LayerRope, Rope] = {}
    for i in range(mc.num_layers):
        kind = mc.layer_rope(i)
        if kind not in built:
            global_rope = kind == LayerRope(mc.rope_theta, mc.rope_scaling)
            built[kind] = Rope(mc, max_model_len, dtype, device, freq_factors if global_rope else None, kind)
    return [built[mc.layer_rope(i)] for i in range(mc.num_layers)]


def _max_model_len(cfg: EngineConfig, mc: ModelConfig) -> int:
    limit = mc.max_position_embeddings
    max_model_len = cfg.max_model_len or limit
    if max_model_len > limit:
        raise ValueError(f"max_model_len {max_model_len} exceeds the model's context of {limit} tokens")
    return max_model_len


def _quantization(cfg: EngineConfig, device: torch.device) -> Quantization:
    """The weights' format as asked and checked (model/quantization.py); an FP8 checkpoint under
    auto on CUDA becomes FP8 once its config is read (build_engine_parts)."""
    asked = cfg.quantization
    if asked is QuantizationMode.NONE or (asked is QuantizationMode.AUTO and device.type != "cpu"):
        return Quantization.NONE
    try:
        NativeKernels.load()
        kernels = True
    except KernelUnavailable:
        kernels = False
    is_gguf = cfg.load_format is LoadFormat.AUTO and is_gguf_model(cfg.model)
    return resolve_quantization(asked, cfg.dtype, device.type, is_gguf, cfg.load_format, kernels)


def _keep_fp8(cfg: EngineConfig, device: torch.device) -> bool:
    """Whether an FP8 checkpoint's FP8 Linears stay FP8 (CUDA's FP8 matmuls) rather than being
    dequantized at load (the CPU, or quantization none)."""
    return device.type == "cuda" and cfg.quantization in (QuantizationMode.AUTO, QuantizationMode.FP8)


def build_engine_parts(cfg: EngineConfig) -> EngineParts:
    device = resolve_device(cfg.device)
    quantization = _quantization(cfg, device)
    dtype = compute_dtype(cfg, device)
    keep_fp8 = _keep_fp8(cfg, device)
    loaded = load_model(cfg.model, dtype, cfg.load_format, device, quantization, keep_fp8)
    mc = loaded.config
    # what the decoder does with dense matrices: dummy weights of an FP8 checkpoint's config cost
    # what the checkpoint would, so they are quantized to FP8 at load
    fp8_checkpoint = keep_fp8 and mc.fp8 is not None
    decoder_quantization = Quantization.FP8 if fp8_checkpoint and cfg.load_format is LoadFormat.DUMMY else quantization
    draft_layers = _draft_layers(cfg, mc)
    max_model_len = _max_model_len(cfg, mc)
    backend = _attention_backend(cfg, device, dtype)
    profile = device.type == "cuda" and cfg.kv_cache_memory is None
    kv_dtype = cache_dtype(cfg, device)
    bb = block_bytes(mc, cfg.block_size, kv_dtype)
    # On CUDA the cache is sized after a profiling pass on a cache just big enough for it.
    groups = mc.kv_groups
    if profile:  # one step of max_num_batched_tokens tokens, in every group
        num_blocks = -(-cfg.max_num_batched_tokens // cfg.block_size) * groups.num_groups + 1
        sizing = KVSizing.PROFILED
    else:
        budget = kv_budget(cfg, max_model_len, bb, groups.windows)
        num_blocks, sizing = budget.num_blocks, budget.sizing
        check_blocks(num_blocks, max_model_len, cfg.block_size, groups.windows, cfg.max_num_batched_tokens)
    cache = KVCache(mc, num_blocks, cfg.block_size, kv_dtype, device)
    ropes = _ropes(mc, max_model_len, dtype, device, loaded.weights.get("rope_freqs"))
    attention, ops = _layers(backend, cache, ropes, mc)
    pack = device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available() and cpu_runs_bf16()
    try:
        model = LlamaModel(mc, loaded.weights, attention, ops, device, pack, decoder_quantization)
    except RuntimeError as exc:  # e.g. out of memory while moving weights
        raise ModelLoadError(f"cannot place the model on {device} ({type(exc).__name__})") from None
    runner = ModelRunner(
        model,
        cfg.block_size,
        device,
        backend is AttentionBackend.NATIVE,
        cfg.seed,
        draft_layers,
        paged=backend is AttentionBackend.TRITON,
    )
    if profile:
        from traceless.runner.gpu_memory import kv_blocks_after_profile

        num_blocks = kv_blocks_after_profile(runner, cache, cfg, bb)
        check_blocks(num_blocks, max_model_len, cfg.block_size, groups.windows, cfg.max_num_batched_tokens)
        cache.resize(num_blocks)
    capture_s, num_graphs = 0.0, 0
    if device.type == "cuda" and backend is AttentionBackend.TRITON and not cfg.enforce_eager:
        from traceless.runner.cuda_graphs import DecodeGraphs, capture_sizes

        graphs = DecodeGraphs(
            model,
            capture_sizes(cfg.max_num_seqs),
            cfg.block_size,
            max_model_len,
            device,
            mc.attention_scale,
            groups.num_groups,
        )
        capture_s, num_graphs = graphs.capture(), len(graphs.sizes)
        runner.graphs = graphs
    if device.type == "cuda":
        from traceless.runner.device_scrub import DeviceScrubber

        # The profiling pass and the capture leave gigabytes of cached free blocks (no user data
        # yet): back to the driver, so that the sweep does not zero them after every step that
        # ends a request (it zeroes every free block the allocator caches).
        torch.cuda.empty_cache()
        runner.scrubber = DeviceScrubber(cache, device)
        if runner.graphs is not None and runner.graphs.pool is not None:
            runner.scrubber.graph_pools.add(runner.graphs.pool)
    offload = None
    if cfg.kv_offload is not KVOffload.NONE:
        from traceless.runner.offload import KVOffloader

        offload = KVOffloader(cache, cfg.kv_offload, cfg.kv_offload_dir or _default_offload_dir())
    info = ModelInfo(
        name=loaded.name,
        path=str(loaded.path),
        vocab_size=mc.vocab_size,
        max_model_len=max_model_len,
        num_layers=mc.num_layers,
        device=device.type,
        dtype=str(dtype).removeprefix("torch."),
        attention=backend.value,
        load_format=cfg.load_format.value,
        cuda_graphs=num_graphs,
        capture_s=capture_s,
        kv_cache_bytes=num_blocks * bb,
        kv_cache_dtype=str(kv_dtype).removeprefix("torch."),
        kv_sizing=sizing.value,
        kv_windows=mc.kv_groups.windows,
        long_context_from=mc.long_context_from,
        quantization=Quantization.FP8.value if fp8_checkpoint else quantization.value,
        fused_forward=model.fused is not None,
    )
    template = cfg.chat_template
    if template is None and cfg.model is None and cfg.load_format is LoadFormat.AUTO:
        template = builtin_chat_template("smollm2-tools")
    if template is not None:
        loaded.tokenizer.set_chat_template(template)
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
