"""Mixture-of-experts layers of Hugging Face checkpoints: the hyper-parameters in config.json and
the expert tensors in the safetensors files, as the MoE block (layers/moe.py) takes them.

    spec = moe_spec(raw)                           config.json dict -> MoESpec, or None (a dense model)
    spec.sparse(i)                                 whether layer i's feed-forward is the MoE block
    weights = read_moe_weights(take, prefix, spec, dtype)
        take(name) -> the checkpoint tensor of that full name (consumed), or None when absent
        prefix: the layer's prefix, "model.layers.{i}."

Checkpoint names under the prefix (E experts, H hidden, I per expert):
    Mixtral    block_sparse_moe.gate.weight [E, H];
               block_sparse_moe.experts.{e}.w1 (gate), w3 (up) [I, H], w2 (down) [H, I]
    Qwen3-MoE  mlp.gate.weight [E, H]; mlp.experts.{e}.gate_proj, up_proj [I, H], down_proj [H, I]
    gpt-oss    mlp.router.weight [E, H], mlp.router.bias [E];
               mlp.experts.gate_up_proj [E, H, 2I] (x @ W, gate and up interleaved), down_proj [E, I, H],
               or in MXFP4 <proj>_blocks [E, rows, cols / 32, 16] + <proj>_scales [E, rows, cols / 32];
               mlp.experts.gate_up_proj_bias [E, 2I], down_proj_bias [E, H]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from traceless.errors import ModelLoadError, UnsupportedModelError
from traceless.model.layers.moe import ClampedSwiGLU, MoEConfig, MoEWeights, deinterleave_gate_up, stack_experts
from traceless.model.layers.moe_routing import RouterConfig, RoutingMode
from traceless.model.mxfp4 import dequantize_mxfp4

Take = Callable[[str], torch.Tensor | None]


class MoEFamily(Enum):
    MIXTRAL = "MixtralForCausalLM"
    QWEN3_MOE = "Qwen3MoeForCausalLM"
    GPT_OSS = "GptOssForCausalLM"


@dataclass(frozen=True, slots=True)
class MoESpec:
    family: MoEFamily
    config: MoEConfig
    dense_layers: frozenset[int] = frozenset()  # layers whose feed-forward stays a dense MLP

    def sparse(self, layer: int) -> bool:
        return layer not in self.dense_layers

    @property
    def checkpoint_prefix(self) -> str:
        """Where a sparse layer's router and experts sit under "model.layers.{i}."."""
        return "block_sparse_moe." if self.family is MoEFamily.MIXTRAL else "mlp."

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """One sparse layer's tensors as the decoder takes them (names after "layers.{i}.", the
        fields of MoEWeights by MOE_FIELDS) and their shapes."""
        c = self.config
        E, H, inter = c.router.num_experts, c.hidden_size, c.intermediate_size
        shapes = {"router": (E, H), "experts.gate_up": (E, 2 * inter, H), "experts.down": (E, H, inter)}
        if self.family is MoEFamily.GPT_OSS:
            shapes |= {"router_bias": (E,), "experts.gate_up_bias": (E, 2 * inter), "experts.down_bias": (E, H)}
        return shapes


def _field(raw: dict[str, Any], key: str, kind: type = int) -> Any:
    value = raw.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ModelLoadError(f"config.json field {key!r} is {value!r}, expected {kind.__name__}")
    return value


def _number(raw: dict[str, Any], key: str, default: float | None) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ModelLoadError(f"config.json field {key!r} is {value!r}, expected a number")
    return float(value)


def moe_spec(raw: dict[str, Any]) -> MoESpec | None:
    """The MoE layers of a config.json, None for an architecture without experts."""
    archs = raw.get("architectures") or []
    family = next((f for f in MoEFamily if f.value in archs), None)
    if family is None:
        return None
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"config.json field 'hidden_act' {act!r} is not supported (silu)")
    H, k = _field(raw, "hidden_size"), _field(raw, "num_experts_per_tok")
    if family is MoEFamily.MIXTRAL:
        router = RouterConfig(_field(raw, "num_local_experts"), k, RoutingMode.SOFTMAX_TOPK, renormalize=True)
        return MoESpec(family, MoEConfig(router, H, _field(raw, "intermediate_size")))
    if family is MoEFamily.QWEN3_MOE:
        # published configs say num_experts; transformers 5 saves it as num_local_experts
        E = _field(raw, "num_experts" if "num_experts" in raw else "num_local_experts")
        router = RouterConfig(E, k, RoutingMode.SOFTMAX_TOPK, renormalize=_field(raw, "norm_topk_prob", bool))
        return MoESpec(family, MoEConfig(router, H, _field(raw, "moe_intermediate_size")), _qwen3_dense_layers(raw))
    if raw.get("experts_per_token", k) != k:
        raise ModelLoadError(
            f"config.json fields 'experts_per_token' ({raw['experts_per_token']!r}) and "
            f"'num_experts_per_tok' ({k}) disagree"
        )
    act_fn = ClampedSwiGLU(alpha=_number(raw, "swiglu_alpha", 1.702), limit=_number(raw, "swiglu_limit", None))
    router = RouterConfig(_field(raw, "num_local_experts"), k, RoutingMode.TOPK_SOFTMAX)
    config = MoEConfig(router, H, _field(raw, "intermediate_size"), activation=act_fn, expert_bias=True)
    return MoESpec(family, config)


# the decoder's names of a sparse layer's tensors -> MoEWeights' fields
MOE_FIELDS = {
    "router": "router",
    "router_bias": "router_bias",
    "experts.gate_up": "gate_up",
    "experts.down": "down",
    "experts.gate_up_bias": "gate_up_bias",
    "experts.down_bias": "down_bias",
}


def _qwen3_dense_layers(raw: dict[str, Any]) -> frozenset[int]:
    """Qwen3-MoE: layer i has experts unless i is in mlp_only_layers or (i + 1) is not a multiple of
    decoder_sparse_step."""
    layers, step = _field(raw, "num_hidden_layers"), raw.get("decoder_sparse_step", 1)
    only = raw.get("mlp_only_layers") or []
    if not isinstance(step, int) or step < 1 or not all(isinstance(i, int) for i in only):
        raise ModelLoadError("config.json fields 'decoder_sparse_step'/'mlp_only_layers' are malformed")
    return frozenset(i for i in range(layers) if i in only or (i + 1) % step)


def _need(take: Take, name: str) -> torch.Tensor:
    t = take(name)
    if t is None:
        raise ModelLoadError(f"weights lack tensor {name!r}")
    return t


def read_moe_weights(take: Take, prefix: str, spec: MoESpec, dtype: torch.dtype) -> MoEWeights:
    """One MoE layer's tensors -> MoEWeights in dtype, shapes checked against spec.config."""
    c = spec.config
    E = c.router.num_experts
    if spec.family is MoEFamily.GPT_OSS:
        weights = _read_gpt_oss(take, prefix + "mlp.", dtype)
    else:
        base, names = (
            (prefix + "block_sparse_moe.", ("w1", "w3", "w2"))
            if spec.family is MoEFamily.MIXTRAL
            else (prefix + "mlp.", ("gate_proj", "up_proj", "down_proj"))
        )
        per_expert = [[_need(take, f"{base}experts.{e}.{n}.weight").to(dtype) for e in range(E)] for n in names]
        gate_up, down = stack_experts(*per_expert)
        weights = MoEWeights(
            router=_need(take, base + "gate.weight").to(dtype), router_bias=None, gate_up=gate_up, down=down
        )
    weights.check(c)
    return weights


def _read_gpt_oss(take: Take, base: str, dtype: torch.dtype) -> MoEWeights:
    def matrix(name: str) -> torch.Tensor:
        """[E, out, in] (Linear layout) from either the bf16 (x @ W) or the MXFP4 form."""
        full = take(base + "experts." + name)
        if full is not None:
            return full.to(dtype).transpose(1, 2).contiguous()
        blocks, scales = take(base + f"experts.{name}_blocks"), take(base + f"experts.{name}_scales")
        if blocks is None or scales is None:
            raise ModelLoadError(f"weights lack tensor {base + 'experts.' + name!r} (or its _blocks and _scales)")
        return dequantize_mxfp4(blocks, scales, dtype)

    return MoEWeights(
        router=_need(take, base + "router.weight").to(dtype),
        router_bias=_need(take, base + "router.bias").to(dtype),
        gate_up=deinterleave_gate_up(matrix("gate_up_proj")).contiguous(),
        down=matrix("down_proj"),
        gate_up_bias=deinterleave_gate_up(_need(take, base + "experts.gate_up_proj_bias").to(dtype)).contiguous(),
        down_bias=_need(take, base + "experts.down_proj_bias").to(dtype),
    )
