"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2) over packed tokens and a paged cache.

Every step runs one forward over all scheduled tokens of all requests: [T] token ids in,
[T, hidden] out; there is no per-request loop inside the layers. Q/K/V and gate/up projections are
fused into one matmul each.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from traceless.errors import ModelLoadError
from traceless.model.config import ModelConfig
from traceless.model.layers.attention import AttentionLayer, AttentionMetadata
from traceless.model.layers.linear import Linear, cat_rows, embedding
from traceless.model.layers.ops import DecoderOps


@dataclass(slots=True)
class Layer:
    attn_norm: torch.Tensor
    qkv: Linear
    o: Linear
    mlp_norm: torch.Tensor
    gate_up: Linear
    down: Linear


def _take(weights: dict[str, torch.Tensor], name: str, shape: tuple[int, ...]) -> torch.Tensor:
    w = weights.pop(name, None)
    if w is None:
        raise ModelLoadError(f"weights lack tensor {name!r}")
    if tuple(w.shape) != shape:
        raise ModelLoadError(f"tensor {name!r} has shape {tuple(w.shape)}, expected {shape}")
    return w


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], attention: AttentionLayer,
                 ops: DecoderOps, device: torch.device, pack: bool):
        """Consumes `weights` (the dict is emptied); raises ModelLoadError on missing/extra/mis-shaped tensors.
        `ops` is a DecoderOps implementation (native fused kernels or torch)."""
        c = config
        self.config = c
        self.attention = attention
        self.ops = ops
        H, D, nh, nkv, inter = c.hidden_size, c.head_dim, c.num_heads, c.num_kv_heads, c.intermediate_size
        weights.pop("rope_freqs", None)  # consumed by Rope

        def dev(t):
            return t.to(device).contiguous()

        self.embed = dev(_take(weights, "embed", (c.vocab_size, H)))
        self.layers = []
        for i in range(c.num_layers):
            p = f"layers.{i}."
            qkv = cat_rows([_take(weights, p + "q", (nh * D, H)), _take(weights, p + "k", (nkv * D, H)),
                            _take(weights, p + "v", (nkv * D, H))])
            bias = None
            if c.qkv_bias:
                bias = dev(torch.cat([_take(weights, p + "q_bias", (nh * D,)), _take(weights, p + "k_bias", (nkv * D,)),
                                      _take(weights, p + "v_bias", (nkv * D,))]))
            gate_up = cat_rows([_take(weights, p + "gate", (inter, H)), _take(weights, p + "up", (inter, H))])
            self.layers.append(Layer(
                attn_norm=dev(_take(weights, p + "attn_norm", (H,))),
                qkv=Linear(dev(qkv), bias, pack),
                o=Linear(dev(_take(weights, p + "o", (H, nh * D))), None, pack),
                mlp_norm=dev(_take(weights, p + "mlp_norm", (H,))),
                gate_up=Linear(dev(gate_up), None, pack),
                down=Linear(dev(_take(weights, p + "down", (H, inter))), None, pack),
            ))
        self.norm = dev(_take(weights, "norm", (H,)))
        head = self.embed if c.tie_word_embeddings else dev(_take(weights, "lm_head", (c.vocab_size, H)))
        self.lm_head = Linear(head, None, pack)
        if weights:
            raise ModelLoadError(f"unused tensors in weights: {', '.join(sorted(weights)[:5])}")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                num_layers: int | None = None) -> torch.Tensor:
        """input_ids, positions: [T] -> final normed hidden states [T, hidden].

        Per layer: 4 matmuls and 4 fused elementwise calls. The residual add is fused with the next
        norm, so the final norm rides on the last layer's add. `num_layers` runs only the first
        layers (then the final norm): the self-speculation draft. Their K/V go to the cache as usual.
        """
        c, ops = self.config, self.ops
        layers = self.layers if num_layers is None else self.layers[:num_layers]
        x = embedding(self.embed, input_ids)  # [T, H] residual stream
        h = torch.empty_like(x)  # normed input of the next matmul
        ops.add_rms_norm(x, None, layers[0].attn_norm, h)
        act = x.new_empty(x.shape[0], c.intermediate_size)
        for i, layer in enumerate(layers):
            qkv = layer.qkv(h)  # [T, (nh + 2 nkv) D]
            ops.rope_cache(i, qkv, positions, meta.slots)
            a = self.attention(i, qkv, meta)  # [T, nh, D]
            ops.add_rms_norm(x, layer.o(a.view(x.shape[0], -1)), layer.mlp_norm, h)
            ops.silu_mul(layer.gate_up(h), act)
            nxt = layers[i + 1].attn_norm if i + 1 < len(layers) else self.norm
            ops.add_rms_norm(x, layer.down(act), nxt, h)
        return h

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[S, hidden] -> [S, vocab] float32."""
        return self.lm_head(hidden).float()
