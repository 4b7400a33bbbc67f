"""Transformers' own mixture-of-experts blocks on random weights, and the same weights as our
MoEConfig / MoEWeights: the reference of the MoE tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from traceless.model.layers.moe import ClampedSwiGLU, MoEConfig, MoEWeights, SiluAndMul, deinterleave_gate_up
from traceless.model.layers.moe_routing import RouterConfig, RoutingMode

FAMILIES = ("mixtral", "qwen3_moe", "qwen3_moe_unnormalized", "gpt_oss")


@dataclass
class Reference:
    block: torch.nn.Module  # transformers' block: [B, S, H] -> [B, S, H] (gpt-oss: a tuple)
    config: MoEConfig
    weights: MoEWeights

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """h [T, H] -> transformers' output [T, H]."""
        with torch.no_grad():
            out = self.block(h[None])
        return (out[0] if isinstance(out, tuple) else out)[0]


def _randomize(block: torch.nn.Module, seed: int) -> None:
    """Weights of unit-ish scale: router logits spread wide enough that top-k choices are not
    near-ties, expert outputs of order one."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in block.named_parameters():
            fan_in = p.shape[-1] if p.dim() > 1 else 1
            scale = 4.0 if "router" in name or name.startswith("gate.") else 1.0
            p.copy_(torch.randn(p.shape, generator=g) * scale / fan_in**0.5)


def reference(
    family: str, hidden: int = 32, inter: int = 24, experts: int = 8, top_k: int = 2, seed: int = 0
) -> Reference:
    common = {"hidden_size": hidden, "num_experts_per_tok": top_k, "experts_implementation": "eager"}
    if family == "mixtral":
        from transformers.models.mixtral.configuration_mixtral import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

        block = MixtralSparseMoeBlock(MixtralConfig(intermediate_size=inter, num_local_experts=experts, **common))
        router = RouterConfig(experts, top_k, RoutingMode.SOFTMAX_TOPK, renormalize=True)
    elif family.startswith("qwen3_moe"):
        from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        norm = family == "qwen3_moe"
        block = Qwen3MoeSparseMoeBlock(
            Qwen3MoeConfig(moe_intermediate_size=inter, num_experts=experts, norm_topk_prob=norm, **common)
        )
        router = RouterConfig(experts, top_k, RoutingMode.SOFTMAX_TOPK, renormalize=norm)
    elif family == "gpt_oss":
        from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

        # a limit of 1 (published: 7) so that unit-scale activations reach both clamps
        block = GptOssMLP(GptOssConfig(intermediate_size=inter, num_local_experts=experts, swiglu_limit=1.0, **common))
        router = RouterConfig(experts, top_k, RoutingMode.TOPK_SOFTMAX)
    else:
        raise ValueError(family)
    block.float().eval()
    _randomize(block, seed)
    if family == "gpt_oss":
        act = ClampedSwiGLU(alpha=block.experts.alpha, limit=block.experts.limit)
        config = MoEConfig(router=router, hidden_size=hidden, intermediate_size=inter, activation=act, expert_bias=True)
        return Reference(block, config, _gpt_oss_weights(block))
    config = MoEConfig(router=router, hidden_size=hidden, intermediate_size=inter, activation=SiluAndMul())
    weights = MoEWeights(
        router=block.gate.weight.detach().clone(),
        router_bias=None,
        gate_up=block.experts.gate_up_proj.detach().clone(),
        down=block.experts.down_proj.detach().clone(),
    )
    return Reference(block, config, weights)


def _gpt_oss_weights(block) -> MoEWeights:
    """transformers keeps gpt-oss's experts as x @ W ([E, H, 2I] interleaved, [E, I, H]); ours are
    Linear-shaped with the gate's rows first."""
    e = block.experts
    return MoEWeights(
        router=block.router.weight.detach().clone(),
        router_bias=block.router.bias.detach().clone(),
        gate_up=deinterleave_gate_up(e.gate_up_proj.detach().transpose(1, 2)).contiguous(),
        down=e.down_proj.detach().transpose(1, 2).contiguous(),
        gate_up_bias=deinterleave_gate_up(e.gate_up_proj_bias.detach()).contiguous(),
        down_bias=e.down_proj_bias.detach().clone(),
    )
