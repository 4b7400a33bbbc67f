"""The decoder of every supported family (Llama 2/3, SmolLM2, Mistral, Qwen2/3, Phi-3/4, Gemma 2/3)
over packed tokens and a paged cache. What differs between the families is data in ModelConfig
(model/config.py): norm weights' offset, q/k norms, post-attention/post-MLP norms, activation,
embedding scale, attention scale and soft-capping, per-layer sliding windows and RoPE.

Every step runs one forward over all scheduled tokens of all requests: [T] token ids in,
[T, hidden] out; there is no per-request loop inside the layers. Q/K/V and gate/up projections are
fused into one matmul each (Phi-3 checkpoints store them fused already).

One layer, with the residual add fused into the next norm (norm(x) = rms_norm(x) * w):

    h = attn_norm(x)
    a = o(attention(rope(qk_norm(qkv(h)))))          qk_norm: Qwen3, Gemma 3
    x += post_attn_norm(a)  (or a);  h = mlp_norm(x) post_attn_norm: Gemma 2/3
    m = mlp(h)                                        the MLP slot: GatedMLP (dense) or
                                                      ExpertsMLP (mixture of experts)
    x += post_mlp_norm(m)  (or m);   h = next layer's attn_norm(x), or the final norm
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from traceless.errors import ModelLoadError
from traceless.model.config import Activation, ModelConfig
from traceless.model.fp8.checkpoint import Fp8Weight, fuse_fp8_weights
from traceless.model.fp8.linear import Fp8Linear
from traceless.model.layers.attention import AttentionLayer, AttentionMetadata
from traceless.model.layers.fused_decode import FusedLayers
from traceless.model.layers.linear import Linear, QuantTensor, cat_rows, embedding
from traceless.model.layers.moe import GroupedMoE, MoEWeights
from traceless.model.layers.ops import DecoderOps
from traceless.model.lazy_weights import LazyWeights
from traceless.model.quantization import Quantization, quantize_matrix

if TYPE_CHECKING:
    from traceless.model.layers.moe_triton import TritonMoE


class GatedMLP:
    """The MLP slot of a layer: down(act(gate) * up), gate and up in one matmul."""

    __slots__ = ("gate_up", "down", "act")

    def __init__(self, gate_up: Linear | Fp8Linear, down: Linear | Fp8Linear, act):
        self.gate_up, self.down, self.act = gate_up, down, act

    def __call__(self, h: torch.Tensor, scratch: torch.Tensor | None) -> torch.Tensor:
        """h: [T, H] -> [T, H]; scratch: [T, F], the activation buffer shared by the dense layers."""
        if scratch is None:
            raise ValueError("GatedMLP needs the activation buffer")
        self.act(self.gate_up(h), scratch)
        return self.down(scratch)


class ExpertsMLP:
    """The MLP slot of a sparse layer: the experts block, GroupedMoE on the CPU (one matmul per
    active expert) or TritonMoE on CUDA (a grouped GEMM over the sorted token/expert pairs). Each
    expert's activation is its own buffer: the dense layers' scratch is theirs alone."""

    __slots__ = ("block",)

    def __init__(self, block: GroupedMoE | TritonMoE):
        self.block = block

    def __call__(self, h: torch.Tensor, scratch: torch.Tensor | None) -> torch.Tensor:
        """h: [T, H] -> [T, H]."""
        return self.block(h)


@dataclass(slots=True)
class Layer:
    attn_norm: torch.Tensor
    qkv: Linear | Fp8Linear
    o: Linear | Fp8Linear
    mlp_norm: torch.Tensor
    mlp: GatedMLP | ExpertsMLP
    q_norm: torch.Tensor | None = None  # [D], per head before RoPE
    k_norm: torch.Tensor | None = None
    post_attn_norm: torch.Tensor | None = None  # [H], on the attention output
    post_mlp_norm: torch.Tensor | None = None  # [H], on the MLP output
    sinks: torch.Tensor | None = None  # [heads] float32, a logit per head in each softmax (gpt-oss)


def _take(weights: Weights, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    w = weights.pop(name, None)
    if w is None:
        raise ModelLoadError(f"weights lack tensor {name!r}")
    if tuple(w.shape) != shape:
        raise ModelLoadError(f"tensor {name!r} has shape {tuple(w.shape)}, expected {shape}")
    return w


Weights = MutableMapping[str, torch.Tensor]  # a dict, or model/lazy_weights.py's LazyWeights


def _fused(weights: Weights, name: str, parts: list[tuple[str, int]], cols: int) -> torch.Tensor | QuantTensor | tuple:
    """The fused matrix `name` as stored (Phi-3), or its parts concatenated by rows."""
    rows = sum(n for _, n in parts)
    if name in weights:
        return _take(weights, name, (rows, cols))
    return cat_rows([_take(weights, p, (n, cols)) for p, n in parts])


def _fp8_parts(weights: Weights, name: str, parts: list[tuple[str, int]], cols: int) -> list[Fp8Weight] | None:
    """The FP8 weights of a matrix (stored whole as `name`, or as its parts), or None when the
    loader kept none of them in FP8."""
    if not isinstance(weights, LazyWeights):
        return None
    names = [(name, sum(rows for _, rows in parts))] if weights.has_fp8(name) else parts
    kept = [weights.has_fp8(n) for n, _ in names]
    if not any(kept):
        return None
    if not all(kept):
        raise ModelLoadError(f"the parts of {name!r} mix FP8 and unquantized weights")
    out = []
    for n, rows in names:
        w = weights.take_fp8(n)
        if tuple(w.weight.shape) != (rows, cols):
            raise ModelLoadError(f"tensor {n!r} has shape {tuple(w.weight.shape)}, expected {(rows, cols)}")
        out.append(w)
    return out


class LlamaModel:
    def __init__(
        self,
        config: ModelConfig,
        weights: Weights,
        attention: AttentionLayer,
        ops: DecoderOps,
        device: torch.device,
        pack: bool,
        quantization: Quantization = Quantization.NONE,
    ):
        """Consumes `weights` (the dict is emptied); raises ModelLoadError on missing/extra/mis-shaped tensors.
        `ops` is a DecoderOps implementation (native fused kernels or torch). quantization: FP8: the
        layers' dense matrices quantized to FP8 per output channel (`--quantization fp8`); Q8_0,
        Q4_0: the experts quantized per expert matrix (the loader quantized the other matrices)."""
        c = config
        self.config = c
        self.attention = attention
        self.ops = ops
        self.device, self.pack, self.quantization = device, pack, quantization
        H = c.hidden_size
        weights.pop("rope_freqs", None)  # consumed by Rope
        self.embed = self._dev(_take(weights, "embed", (c.vocab_size, H)))
        # Gemma: embeddings times sqrt(hidden), the factor rounded to the model's dtype as transformers does
        # (a quantized table's rows come out in float32, the activations' dtype then)
        self.dtype = self.embed.dtype if isinstance(self.embed, torch.Tensor) else torch.float32
        self.embed_scale = (
            None if c.embed_scale is None else torch.tensor(c.embed_scale, dtype=self.dtype, device=device)
        )
        self.act = ops.silu_mul if c.activation is Activation.SILU else ops.gelu_tanh_mul
        self.layers = [self._layer(weights, i) for i in range(c.num_layers)]
        self.kv_group = c.kv_groups.layer_group  # per layer: whose block tables it reads (model/kv_groups.py)
        self.dense_mlps = not all(c.sparse(i) for i in range(c.num_layers))
        self.norm = self._norm(_take(weights, "norm", (H,)))
        head = self.embed if c.tie_word_embeddings else self._dev(_take(weights, "lm_head", (c.vocab_size, H)))
        self.lm_head = Linear(head, None, pack)
        if weights:
            raise ModelLoadError(f"unused tensors in weights: {', '.join(sorted(weights)[:5])}")
        # every layer of a step in one native call where csrc/forward.c covers the model
        self.fused = FusedLayers.bind(self)

    def _dev(self, t):
        """A weight on the model's device: a tensor, a QuantTensor (CPU only), or a tuple of parts
        (a fused matrix whose parts came in different quantized formats)."""
        if isinstance(t, tuple):
            return tuple(self._dev(p) for p in t)
        return t.to(self.device).contiguous()

    def _norm(self, w: torch.Tensor) -> torch.Tensor:
        """A norm weight as applied: Gemma stores w and multiplies by (1 + w)."""
        return self._dev(w + self.config.norm_offset if self.config.norm_offset else w)

    def _layer(self, weights: Weights, i: int) -> Layer:
        c, p = self.config, f"layers.{i}."
        H, D, nh, nkv = c.hidden_size, c.head_dim, c.num_heads, c.num_kv_heads
        bias = None
        if c.qkv_bias:
            bias = self._dev(
                torch.cat(
                    [
                        _take(weights, p + "q_bias", (nh * D,)),
                        _take(weights, p + "k_bias", (nkv * D,)),
                        _take(weights, p + "v_bias", (nkv * D,)),
                    ]
                )
            )
        mlp = self._experts(weights, i) if c.sparse(i) else self._dense_mlp(weights, i)
        layer = Layer(
            attn_norm=self._norm(_take(weights, p + "attn_norm", (H,))),
            qkv=self._linear(weights, p + "qkv", [(p + "q", nh * D), (p + "k", nkv * D), (p + "v", nkv * D)], H, bias),
            o=self._linear(
                weights,
                p + "o",
                [(p + "o", H)],
                nh * D,
                self._dev(_take(weights, p + "o_bias", (H,))) if c.o_bias else None,
            ),
            mlp_norm=self._norm(_take(weights, p + "mlp_norm", (H,))),
            mlp=mlp,
        )
        if c.attn_sinks:
            layer.sinks = self._dev(_take(weights, p + "sinks", (nh,)).float())
        if c.qk_norm:
            layer.q_norm = self._norm(_take(weights, p + "q_norm", (D,)))
            layer.k_norm = self._norm(_take(weights, p + "k_norm", (D,)))
        if c.sandwich_norms:
            layer.post_attn_norm = self._norm(_take(weights, p + "post_attn_norm", (H,)))
            layer.post_mlp_norm = self._norm(_take(weights, p + "post_mlp_norm", (H,)))
        return layer

    def _dense_mlp(self, weights: Weights, i: int) -> GatedMLP:
        H, inter, p = self.config.hidden_size, self.config.intermediate_size, f"layers.{i}."
        return GatedMLP(
            self._linear(weights, p + "gate_up", [(p + "gate", inter), (p + "up", inter)], H),
            self._linear(weights, p + "down", [(p + "down", H)], inter),
            self.act,
        )

    def _linear(
        self, weights: Weights, name: str, parts: list[tuple[str, int]], cols: int, bias: torch.Tensor | None = None
    ) -> Linear | Fp8Linear:
        """One matmul of a layer: the matrix `name` as stored, or its parts (name, rows) stacked by
        rows. What an FP8 checkpoint keeps in FP8 (the loader's keep_fp8, on CUDA) runs as
        Fp8Linear; under Quantization.FP8 a dense matrix is quantized per output channel; every other
        one is a Linear."""
        fp8 = _fp8_parts(weights, name, parts, cols)
        if fp8 is not None:
            w = fuse_fp8_weights(fp8)
            input_scale = None if w.input_scale is None else self._dev(w.input_scale)
            return Fp8Linear(self._dev(w.weight), self._dev(w.scale), bias, input_scale, self.dtype)
        weight = self._dev(_fused(weights, name, parts, cols))
        if self.quantization is Quantization.FP8:
            return Fp8Linear.from_weight(weight, bias, weight.dtype)
        return Linear(weight, bias, self.pack)

    def _experts(self, weights: Weights, i: int) -> ExpertsMLP:
        """Layer i's router and stacked experts, each tensor moved to the device as it is taken."""
        spec = self.config.moe
        if spec is None:
            raise ModelLoadError("a sparse layer without an experts config")
        p = f"layers.{i}."
        t = {name: self._dev(_take(weights, p + name, shape)) for name, shape in spec.weight_shapes().items()}
        moe = MoEWeights(
            router=t["router"],
            router_bias=t.get("router_bias"),
            gate_up=t["experts.gate_up"],
            down=t["experts.down"],
            gate_up_bias=t.get("experts.gate_up_bias"),
            down_bias=t.get("experts.down_bias"),
        )
        if self.device.type == "cuda":
            from traceless.model.layers.moe_triton import TritonMoE

            return ExpertsMLP(TritonMoE(spec.config, moe))
        return ExpertsMLP(GroupedMoE(spec.config, moe, self._expert_linear))

    def _expert_linear(self, w: torch.Tensor, b: torch.Tensor | None) -> Linear:
        """One expert matrix [out, in] as a Linear: quantized under q8_0/q4_0 (as the loader
        quantizes the dense matrices), else dense (oneDNN-packed where the CPU runs bfloat16)."""
        if self.quantization in (Quantization.Q8_0, Quantization.Q4_0):
            return Linear(quantize_matrix(w, self.quantization, "an expert matrix"), b, self.pack)
        return Linear(w.contiguous(), b, self.pack)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, num_layers: int | None = None
    ) -> torch.Tensor:
        """input_ids, positions: [T] -> final normed hidden states [T, hidden]. `positions` index
        the RoPE tables (the sequence's position plus its Rope.shift).

        Per layer: 4 matmuls and 4 fused elementwise calls (2 more with post norms). The residual
        add is fused with the next norm, so the final norm rides on the last layer's add.
        `num_layers` runs only the first layers (then the final norm): the self-speculation draft.
        Their K/V go to the cache as usual.
        """
        c, ops = self.config, self.ops
        layers = self.layers if num_layers is None else self.layers[:num_layers]
        x = embedding(self.embed, input_ids)  # [T, H] residual stream
        if self.embed_scale is not None:
            x.mul_(self.embed_scale)
        if self.fused is not None and self.fused.runs(meta):
            return self.fused(x, positions, meta, len(layers))
        h = torch.empty_like(x)  # normed input of the next matmul
        post = torch.empty_like(x) if c.sandwich_norms else None  # a normed attention/MLP output
        ops.add_rms_norm(x, None, layers[0].attn_norm, h)
        act = x.new_empty(x.shape[0], c.intermediate_size) if self.dense_mlps else None
        for i, layer in enumerate(layers):
            qkv = layer.qkv(h)  # [T, (nh + 2 nkv) D]
            if layer.q_norm is not None:
                self._qk_norm(qkv, layer)
            m_i = meta.group(self.kv_group[i])
            ops.rope_cache(i, qkv, positions, m_i.slots)
            a = layer.o(self.attention(i, qkv, m_i, layer.sinks).view(x.shape[0], -1))  # [T, H]
            if post is not None and layer.post_attn_norm is not None:
                ops.add_rms_norm(a, None, layer.post_attn_norm, post)
                a = post
            ops.add_rms_norm(x, a, layer.mlp_norm, h)
            m = layer.mlp(h, act)  # [T, H]
            if post is not None and layer.post_mlp_norm is not None:
                ops.add_rms_norm(m, None, layer.post_mlp_norm, post)
                m = post
            nxt = layers[i + 1].attn_norm if i + 1 < len(layers) else self.norm
            ops.add_rms_norm(x, m, nxt, h)
        return h

    def _qk_norm(self, qkv: torch.Tensor, layer: Layer) -> None:
        """RMSNorm over each q and k head of qkv [T, (nh + 2 nkv) D], in place."""
        c = self.config
        T, D, nh, nkv = qkv.shape[0], c.head_dim, c.num_heads, c.num_kv_heads
        q = qkv[:, : nh * D].view(T, nh, D)
        k = qkv[:, nh * D : (nh + nkv) * D].view(T, nkv, D)
        q.copy_(F.rms_norm(q, (D,), layer.q_norm, c.rms_norm_eps))
        k.copy_(F.rms_norm(k, (D,), layer.k_norm, c.rms_norm_eps))

    def rope_shift(self, long_context: bool) -> int:
        """Offset of a sequence's positions into the RoPE tables (LongRoPE, which config.py allows
        only where every layer shares one rope; else 0)."""
        return self.ops.ropes[0].shift(long_context)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[S, hidden] -> [S, vocab] float32 (Gemma 2: soft-capped, cap * tanh(logits / cap))."""
        logits = self.lm_head(hidden).float()
        cap = self.config.final_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits
