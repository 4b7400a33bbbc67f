"""The decoder layers of a step in one native call (csrc/forward.c), for the models it covers.

LlamaModel.forward makes ~10 calls per layer: at one token a step, on a 2-core CPU, their Python
and ctypes overhead and one parallel region each were a third of a decode step. forward.c runs
every layer in one call and one OpenMP region, with the same kernel functions: a sequence's numbers
are the same whichever path ran its step, so a step goes here whenever it can (`runs`) and
through the per-call path otherwise.

Covered: the CPU, float32 activations, a float32 or float16 KV cache, every matmul on quantized weights (GGUF blocks
or --quantization q8_0/q4_0), the native ops and paged-attention kernel, SiLU-gated dense MLPs,
full RoPE, one KV group, no QK norms, sandwich norms, sinks or soft-capping (Llama, Qwen2, Mistral
and SmolLM2 as the built-in model ships). Steps: every sequence in the paged kernel's short batch
(decoding, speculative verification, short chunks); a long prefill chunk takes the per-call path.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import torch

from traceless.model.config import Activation
from traceless.model.layers.attention import AttentionMetadata, PagedAttention
from traceless.model.layers.linear import Linear, quant_kernels
from traceless.model.layers.ops import NativeOps
from traceless.model.layers.qkernels import _QShape, _shape
from traceless.model.layers.quant import QuantTensor

if TYPE_CHECKING:
    from traceless.model.llama import LlamaModel

_P, _L, _I, _F = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float
MAX_PARTS = 3


class _Matmul(ctypes.Structure):
    _fields_ = [
        ("n_parts", _I),
        ("shape", _QShape * MAX_PARTS),
        ("w", _P * MAX_PARTS),
        ("bias", _P * MAX_PARTS),
        ("col", _L * MAX_PARTS),
    ]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("attn_norm", _P),
        ("mlp_norm", _P),
        ("qkv", _Matmul),
        ("o", _Matmul),
        ("gate_up", _Matmul),
        ("down", _Matmul),
        ("cos", _P),
        ("sin", _P),
        ("kv_slot", _L),
        ("window", _I),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        ("num_layers", _I),
        ("hidden", _I),
        ("num_heads", _I),
        ("num_kv_heads", _I),
        ("head_dim", _I),
        ("inter", _I),
        ("isa", _I),
        ("eps", _F),
        ("final_norm", _P),
        ("layers", ctypes.POINTER(_Layer)),
    ]


class _Step(ctypes.Structure):
    _fields_ = [
        ("T", _L),
        ("num_layers", _I),
        *((name, _P) for name in ("x", "h", "qkv", "attn", "o", "gu", "act", "m")),
        ("positions", _P),
        ("blocks", _P),
        ("offsets", _P),
        ("k_cache", _P),
        ("v_cache", _P),
        ("slot_elems", _L),
        ("kv_f16", _I),
        ("block_size", _I),
        ("num_seqs", _I),
        ("max_blocks", _I),
        ("block_tables", _P),
        ("cu_q", _P),
        ("context_lens", _P),
        ("scale", _F),
    ]


def _matmul(linear) -> _Matmul | None:
    """A layer's Linear as forward.c's matmul: quantized parts only, at most MAX_PARTS."""
    quantized = linear.quantized() if isinstance(linear, Linear) else None
    if quantized is None:
        return None
    parts, bias = quantized
    if len(parts) > MAX_PARTS or not all(isinstance(p, QuantTensor) for p in parts):
        return None
    mm, col = _Matmul(n_parts=len(parts)), 0
    for i, p in enumerate(parts):
        mm.shape[i] = _shape(p)
        mm.w[i] = p.blocks.data_ptr()
        n = p.shape[0]
        mm.bias[i] = None if bias is None else bias[col : col + n].data_ptr()
        mm.col[i] = col
        col += n
    return mm


class FusedLayers:
    """The native whole-stack forward of one LlamaModel; `bind` says whether the model is covered."""

    def __init__(self, model: LlamaModel, ops: NativeOps, attention: PagedAttention, layers: list[_Layer]):
        c = model.config
        self._model_ref = model  # keeps every tensor whose address the structs hold alive
        self._ops, self._attention = ops, attention
        self._layers = (_Layer * len(layers))(*layers)
        kernels = ops.k
        self.struct = _Model(
            c.num_layers,
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.intermediate_size,
            int(quant_kernels().isa),
            c.rms_norm_eps,
            model.norm.data_ptr(),
            ctypes.cast(self._layers, ctypes.POINTER(_Layer)),
        )
        self._run = kernels._fn("tl_forward_layers", [ctypes.POINTER(_Model), ctypes.POINTER(_Step)], _I)
        if not kernels._fn("tl_forward_check", [ctypes.POINTER(_Model)], _I)(ctypes.byref(self.struct)):
            raise RuntimeError("the native forward refused the model's shapes")

    @classmethod
    def bind(cls, model: LlamaModel) -> FusedLayers | None:
        """The fused forward of `model`, or None when forward.c does not cover it."""
        c, ops, attention = model.config, model.ops, model.attention
        if model.device.type != "cpu" or model.dtype != torch.float32 or not isinstance(ops, NativeOps):
            return None
        if not isinstance(attention, PagedAttention) or attention.kernels is None or attention.softcap:
            return None
        if ops.cache.k.dtype not in (torch.float32, torch.float16) or any(model.kv_group):
            return None
        if c.activation is not Activation.SILU or c.qk_norm or c.sandwich_norms or c.attn_sinks:
            return None
        if any(c.sparse(i) for i in range(c.num_layers)) or not all(r.full for r in ops.ropes):
            return None
        layers = []
        for i, layer in enumerate(model.layers):
            mlp = (getattr(layer.mlp, "gate_up", None), getattr(layer.mlp, "down", None))
            mms = [_matmul(m) for m in (layer.qkv, layer.o, *mlp)]
            if any(m is None for m in mms):
                return None
            rope = ops.ropes[i]
            layers.append(
                _Layer(
                    layer.attn_norm.data_ptr(),
                    layer.mlp_norm.data_ptr(),
                    *mms,
                    rope.cos32.data_ptr(),
                    rope.sin32.data_ptr(),
                    ops.cache.groups.layer_slot[i],
                    attention.windows[i] if attention.windows else 0,
                )
            )
        return cls(model, ops, attention, layers)

    @staticmethod
    def runs(meta: AttentionMetadata) -> bool:
        """Whether a step with this metadata goes through the native forward (all its sequences
        in the paged kernel's batch)."""
        return meta.long is None and meta.short is not None and meta.paged is None and not meta.groups

    def __call__(
        self, x: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, num_layers: int
    ) -> torch.Tensor:
        """x: [T, H] float32 embedded tokens (the residual stream, updated in place) -> the final
        normed hidden states [T, H]."""
        c, short = self._model_ref.config, meta.short
        if short is None:
            raise ValueError("the native forward needs the paged kernel's batch")
        T, D = x.shape[0], c.head_dim
        cache = self._ops.cache
        buffers = {
            "h": torch.empty_like(x),
            "qkv": x.new_empty(T, (c.num_heads + 2 * c.num_kv_heads) * D),
            "attn": x.new_empty(T, c.num_heads * D),
            "o": torch.empty_like(x),
            "gu": x.new_empty(T, 2 * c.intermediate_size),
            "act": x.new_empty(T, c.intermediate_size),
            "m": torch.empty_like(x),
        }
        blocks, offsets = meta.slots
        step = _Step(
            T,
            num_layers,
            x.data_ptr(),
            *(buffers[k].data_ptr() for k in ("h", "qkv", "attn", "o", "gu", "act", "m")),
            positions.data_ptr(),
            blocks.data_ptr(),
            offsets.data_ptr(),
            cache.k.data_ptr(),
            cache.v.data_ptr(),
            cache.k.stride(0),
            int(cache.k.dtype == torch.float16),
            cache.block_size,
            short.block_tables.shape[0],
            short.block_tables.shape[1],
            short.block_tables.data_ptr(),
            short.cu_q.data_ptr(),
            short.context_lens.data_ptr(),
            meta.scale,
        )
        rc = self._run(ctypes.byref(self.struct), ctypes.byref(step))
        if rc == 1:
            raise MemoryError("the native forward could not allocate its scratch memory")
        if rc != 0:
            raise ValueError("the native forward refused the step")
        return buffers["h"]
