"""Load a GGUF file: metadata, tokenizer source and weights (dequantized at load: layers/ggml_blocks.py).

Tensor types: F32, F16, BF16, Q8_0, Q4_0, Q4_1 and the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
llama.cpp's converter permutes the rows of the Q and K projections of `llama` models (to suit its
interleaved RoPE); we undo that so GGUF and Hugging Face weights share one model implementation
(rotate-half RoPE).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from traceless.errors import ModelLoadError, UnsupportedModelError
from traceless.model.config import ModelConfig
from traceless.model.gguf_config import from_gguf_metadata
from traceless.model.layers.ggml_blocks import FORMATS, dequantize
from traceless.model.layers.quant import QFormat, QuantTensor, to_kernel_layout

SUPPORTED_TYPES = ("F32", "F16", "BF16") + tuple(FORMATS)

_LAYER_NAMES = {
    "attn_norm.weight": "attn_norm",
    "attn_q.weight": "q",
    "attn_k.weight": "k",
    "attn_v.weight": "v",
    "attn_q.bias": "q_bias",
    "attn_k.bias": "k_bias",
    "attn_v.bias": "v_bias",
    "attn_output.weight": "o",
    "ffn_norm.weight": "mlp_norm",
    "ffn_gate.weight": "gate",
    "ffn_up.weight": "up",
    "ffn_down.weight": "down",
    "attn_q_norm.weight": "q_norm",
    "attn_k_norm.weight": "k_norm",  # qwen3, gemma3
    "post_attention_norm.weight": "post_attn_norm",
    "post_ffw_norm.weight": "post_mlp_norm",  # gemma3
    "attn_qkv.weight": "qkv",  # phi3: fused, rows [q | k | v]
}
# phi3 keeps gate and up fused in ffn_up (rows [gate | up])
_ARCH_LAYER_NAMES = {"phi3": _LAYER_NAMES | {"ffn_up.weight": "gate_up"}}
_ROPE_FACTORS = ("rope_factors_short.weight", "rope_factors_long.weight")  # phi3 LongRoPE: read into the config
_GLOBAL_NAMES = {
    "token_embd.weight": "embed",
    "output_norm.weight": "norm",
    "output.weight": "lm_head",
    "rope_freqs.weight": "rope_freqs",
}


def _reader(path: Path):
    import gguf

    class Reader(gguf.GGUFReader):
        """GGUFReader over a plain ndarray view of the same memory map (no copy). The stock reader
        slices a np.memmap ~1.2 million times while parsing the vocabulary, and memmap slicing
        costs a Python call each: 2-3 s of a 135M model's load, 0.7 s this way."""

        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, value):
            self._data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    try:
        return Reader(str(path))
    except Exception as exc:  # the gguf package raises ValueError, struct/numpy errors, ...
        raise ModelLoadError(f"{path.name} is not a readable GGUF file ({type(exc).__name__})") from None


def read_metadata(reader) -> dict:
    meta = {}
    for name, field in reader.fields.items():
        try:
            meta[name] = field.contents()
        except Exception:
            raise ModelLoadError(f"GGUF metadata field {name!r} is corrupt") from None
    return meta


def canonical_name(gguf_name: str, architecture: str = "llama") -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    names = _ARCH_LAYER_NAMES.get(architecture, _LAYER_NAMES)
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in names:
        return f"layers.{parts[1]}.{names[parts[2]]}"
    return None


def unpermute_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of llama.cpp's `permute`: rows (head, pair, half) -> (head, half, pair)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _dequantize(tensor) -> np.ndarray | torch.Tensor:
    from gguf import quants

    kind = tensor.tensor_type.name
    if kind not in SUPPORTED_TYPES:
        raise UnsupportedModelError(
            f"tensor {tensor.name} has GGUF type {kind}; supported: {', '.join(SUPPORTED_TYPES)}"
        )
    try:
        if kind in FORMATS:
            rows, cols = int(np.prod(tensor.shape[1:])), int(tensor.shape[0])  # GGUF lists dims innermost first
            raw = torch.from_numpy(np.array(tensor.data, dtype=np.uint8, copy=True))
            return dequantize(raw, kind, (rows, cols)).reshape(tuple(int(d) for d in reversed(tensor.shape)))
        out = np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    except Exception:
        raise ModelLoadError(f"tensor {tensor.name} is corrupt or truncated") from None
    # float32 tensors come back as read-only views of the memory-mapped file; torch wants to own them
    return out if out.flags.writeable else out.copy()


def read_gguf_config(path: Path) -> ModelConfig:
    """The config of a GGUF model file, its tensors left unread."""
    reader = _reader(path)
    names = {t.name for t in reader.tensors}
    return from_gguf_metadata(read_metadata(reader), "output.weight" in names, "blk.0.attn_q.bias" in names)


def _kept(tensor, name: str, config: ModelConfig) -> QuantTensor | None:
    """The tensor's own blocks when the kernels multiply its format (2-D weights only), rows
    un-permuted like the dense path (a row of blocks moves as a whole)."""
    kind = tensor.tensor_type.name
    if kind not in QFormat.__members__ or len(tensor.shape) != 2:
        return None
    rows, cols = int(tensor.shape[1]), int(tensor.shape[0])
    blocks = torch.from_numpy(np.array(tensor.data, dtype=np.uint8, copy=True)).reshape(rows, -1)
    short = name.rsplit(".", 1)[-1]
    if config.architecture == "llama" and short in ("q", "k"):
        blocks = unpermute_rows(blocks, config.num_heads if short == "q" else config.num_kv_heads).contiguous()
    try:
        return to_kernel_layout(QuantTensor(QFormat[kind], (rows, cols), blocks))
    except ValueError:
        raise ModelLoadError(f"tensor {tensor.name} is corrupt or truncated") from None


def load_gguf(path: Path, dtype: torch.dtype, keep_quantized: bool = False) -> tuple[ModelConfig, dict, dict]:
    """(config, canonical weights, metadata) of a GGUF model file: dense tensors in `dtype`, or with
    `keep_quantized` the file's own blocks (QuantTensor) for every matrix in a format the CPU
    kernels multiply (the rest dense in `dtype`)."""
    reader = _reader(path)
    meta = read_metadata(reader)
    names = {t.name for t in reader.tensors}
    factors = {
        t.name.removesuffix(".weight"): np.asarray(_dequantize(t), dtype=np.float32)
        for t in reader.tensors
        if t.name in _ROPE_FACTORS
    }
    config = from_gguf_metadata(meta, "output.weight" in names, "blk.0.attn_q.bias" in names, factors)
    weights: dict = {}
    for tensor in reader.tensors:
        if tensor.name in _ROPE_FACTORS:
            continue
        name = canonical_name(tensor.name, config.architecture)
        if name is None:
            raise UnsupportedModelError(f"unexpected tensor {tensor.name!r} in GGUF file")
        kept = _kept(tensor, name, config) if keep_quantized else None
        if kept is not None:
            weights[name] = kept
            continue
        values = _dequantize(tensor)
        w = values if isinstance(values, torch.Tensor) else torch.from_numpy(values)
        if config.architecture == "llama" and name.rsplit(".", 1)[-1] in ("q", "q_bias"):
            w = unpermute_rows(w, config.num_heads)
        elif config.architecture == "llama" and name.rsplit(".", 1)[-1] in ("k", "k_bias"):
            w = unpermute_rows(w, config.num_kv_heads)
        weights[name] = w if name == "rope_freqs" else w.to(dtype)
    return config, weights, meta
