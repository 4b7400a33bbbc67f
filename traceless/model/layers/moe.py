"""A mixture-of-experts feed-forward block over packed tokens (Mixtral, Qwen3-MoE, gpt-oss).

The decoder calls it where a dense layer calls its MLP, on the normed hidden states; the residual
add stays the caller's:

    moe = GroupedMoE(config, weights)        # or moe_triton.TritonMoE(config, weights) on CUDA
    out = moe(h)                             # h [T, H] -> out [T, H], h's dtype

Inside, for T tokens, E experts, top k, I the intermediate size of one expert:

    logits = h W_router^T (+ b)              [T, E]
    weights, ids = route(logits)             [T, k] float32, [T, k]      (moe_routing.py)
    pairs sorted by expert                   pair p = t k + j: token t's j-th expert
    per active expert e, over its pairs:     x [n, H] -> gate_up [n, 2I] -> act [n, I] -> y [n, H]
    out[t] = sum_j weights[t, j] y[t k + j]  in float32, j = 0..k-1 in that order

Dropless and batch-invariant: every token reaches all k of its experts (no capacity, no dropping),
and its result is a function of its own row. The one part that can vary with the batch is the
matmul of an expert over its n tokens, whose library kernel may round a row differently for
different n (last bits only): tests/model/layers/test_moe.py measures it. The combine is plain
element-wise multiplies and adds in a fixed order (no fused multiply-add whose use could depend on
where a row falls in a vector loop).

Weights are stacked per layer (MoEWeights): gate_up [E, 2I, H] with the gate's rows first, down
[E, H, I], each expert's matrices laid out as a torch Linear weight (out, in).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from traceless.errors import ModelLoadError
from traceless.model.layers.moe_routing import RouterConfig, group_by_expert, route


@dataclass(frozen=True, slots=True)
class SiluAndMul:
    """silu(gate) * up (Mixtral, Qwen3-MoE)."""

    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [n, 2I] = [gate | up] -> [n, I]."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


@dataclass(frozen=True, slots=True)
class ClampedSwiGLU:
    """gpt-oss's expert activation: gate clamped above at limit, up clamped to [-limit, limit],
    then gate * sigmoid(alpha * gate) * (up + 1)."""

    alpha: float
    limit: float

    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [n, 2I] = [gate | up] -> [n, I]."""
        gate, up = gate_up.chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return gate * torch.sigmoid(gate * self.alpha) * (up + 1)


Activation = SiluAndMul | ClampedSwiGLU


@dataclass(frozen=True, slots=True)
class MoEConfig:
    router: RouterConfig
    hidden_size: int
    intermediate_size: int  # of one expert
    activation: Activation = SiluAndMul()
    expert_bias: bool = False  # gpt-oss: biases on gate_up and down


@dataclass(slots=True)
class MoEWeights:
    """One layer's router and experts, stacked. Shapes (E experts, H hidden, I per expert):
    router [E, H], router_bias [E] or None, gate_up [E, 2I, H] (rows [0, I) gate, [I, 2I) up),
    down [E, H, I], gate_up_bias [E, 2I] and down_bias [E, H] or None."""

    router: torch.Tensor
    router_bias: torch.Tensor | None
    gate_up: torch.Tensor
    down: torch.Tensor
    gate_up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None

    def check(self, config: MoEConfig) -> None:
        """Raises ModelLoadError naming the first tensor whose shape does not fit the config."""
        E, H, inter = config.router.num_experts, config.hidden_size, config.intermediate_size
        bias = config.expert_bias
        want = {
            "router": (E, H),
            "gate_up": (E, 2 * inter, H),
            "down": (E, H, inter),
            "gate_up_bias": (E, 2 * inter) if bias else None,
            "down_bias": (E, H) if bias else None,
        }
        for name, shape in want.items():
            t = getattr(self, name)
            if shape is None and t is not None:
                raise ModelLoadError(f"MoE tensor {name!r} given but the config has no expert biases")
            if shape is not None and (t is None or tuple(t.shape) != shape):
                got = None if t is None else tuple(t.shape)
                raise ModelLoadError(f"MoE tensor {name!r} has shape {got}, expected {shape}")
        if self.router_bias is not None and tuple(self.router_bias.shape) != (E,):
            raise ModelLoadError(f"MoE tensor 'router_bias' has shape {tuple(self.router_bias.shape)}, expected {(E,)}")


def stack_experts(
    gates: list[torch.Tensor], ups: list[torch.Tensor], downs: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-expert checkpoint matrices (Mixtral's w1/w3/w2, Qwen3-MoE's gate/up/down_proj: gate and
    up [I, H], down [H, I]) -> (gate_up [E, 2I, H], down [E, H, I])."""
    gate_up = torch.stack([torch.cat([g, u]) for g, u in zip(gates, ups, strict=True)])
    return gate_up, torch.stack(downs)


def deinterleave_gate_up(gate_up: torch.Tensor) -> torch.Tensor:
    """gpt-oss interleaves gate and up along the output dimension (gate at even, up at odd
    indices). [E, 2I, ...] interleaved -> [E, 2I, ...] with the gate's I rows first."""
    return torch.cat([gate_up[:, 0::2], gate_up[:, 1::2]], dim=1)


def combine(pairs: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """pairs [T, k, H] (expert outputs in pair order), weights [T, k] float32 -> [T, H] in dtype.
    out[t] = sum_j weights[t, j] pairs[t, j] in float32, j in order; each step a separate multiply
    and add, so every element is rounded the same way wherever it lies in the tensor."""
    out = pairs[:, 0].float() * weights[:, :1]
    for j in range(1, pairs.shape[1]):
        out += pairs[:, j].float() * weights[:, j : j + 1]
    return out.to(dtype)


Matmul = Callable[[torch.Tensor], torch.Tensor]
MakeLinear = Callable[[torch.Tensor, torch.Tensor | None], Matmul]


def plain_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> Matmul:
    """x -> x W^T + b with torch's own kernel."""
    return lambda x: F.linear(x, weight, bias)


def _row(t: torch.Tensor | None, e: int) -> torch.Tensor | None:
    return None if t is None else t[e]


class GroupedMoE:
    """The torch implementation (the CPU path): tokens grouped by expert, one gate_up and one down
    matmul per active expert over all the tokens routed to it."""

    def __init__(self, config: MoEConfig, weights: MoEWeights, linear: MakeLinear = plain_linear):
        """linear(weight [out, in], bias) -> one expert matrix's matmul (the decoder passes its
        Linear: on the CPU the weight prepacked for oneDNN, which runs these small matmuls about
        1.7 times as fast in bfloat16). The stacked tensors are not kept beyond what it keeps."""
        weights.check(config)
        self.config = config
        self.router, self.router_bias = weights.router, weights.router_bias
        E = config.router.num_experts
        self.gate_up = [linear(weights.gate_up[e], _row(weights.gate_up_bias, e)) for e in range(E)]
        self.down = [linear(weights.down[e], _row(weights.down_bias, e)) for e in range(E)]

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """h [T, H] -> [T, H]."""
        logits = F.linear(h, self.router, self.router_bias)  # [T, E]
        weights, ids = route(logits, self.config.router)
        return self.experts(h, weights, ids)

    def experts(self, h: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """h [T, H], weights [T, k] float32, ids [T, k] -> [T, H]: the routed experts' outputs,
        weighted and summed."""
        T, k = ids.shape
        groups = group_by_expert(ids, self.config.router.num_experts)
        x = h.index_select(0, groups.order // k)  # [T k, H] token rows, sorted by expert
        pairs = h.new_empty(T * k, h.shape[1])  # expert outputs in pair order
        start = 0
        for e, n in enumerate(groups.counts):
            if n == 0:
                continue
            rows = groups.order[start : start + n]
            pairs.index_copy_(0, rows, self._expert(e, x[start : start + n]))
            start += n
        return combine(pairs.view(T, k, -1), weights, h.dtype)

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e on its tokens x [n, H] -> [n, H]."""
        act = self.config.activation(self.gate_up[e](x))  # [n, 2I] -> [n, I]
        return self.down[e](act.contiguous())
