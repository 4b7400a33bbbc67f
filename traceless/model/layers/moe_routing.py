"""Routing of a mixture-of-experts layer: which experts each token goes to, with which weight, and
the token/expert pairs sorted by expert so that each expert's tokens are one contiguous run.

    weights, ids = route(logits, config)         logits [T, E] -> weights [T, k] float32, ids [T, k] int64
    groups = group_by_expert(ids, E)              CPU: pairs sorted by expert, one run per expert
    blocks = align_pairs(ids, E, block_m)         CUDA: the same runs padded to tiles of block_m rows

A pair is (token t, slot j) and has the id p = t * k + j: the pair layout of every [T * k, ...]
buffer. Routing is dropless and batch-invariant: no capacity factor, no token is ever dropped, and
a token's experts and weights are a function of its own logits row only, so a request's output
never depends on which other requests share its batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from traceless.errors import ModelLoadError


class RoutingMode(Enum):
    # softmax over all E logits, then the top k of the probabilities (Mixtral, Qwen3-MoE); with
    # renormalize the k weights are divided by their sum (Mixtral always, Qwen3-MoE by norm_topk_prob)
    SOFTMAX_TOPK = "softmax_topk"
    # the top k logits, then a softmax over those k (gpt-oss): equal in exact arithmetic to
    # SOFTMAX_TOPK renormalized, computed as the checkpoint's authors did
    TOPK_SOFTMAX = "topk_softmax"


@dataclass(frozen=True, slots=True)
class RouterConfig:
    num_experts: int
    top_k: int
    mode: RoutingMode
    renormalize: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ModelLoadError(f"top_k {self.top_k} must be in 1..num_experts ({self.num_experts})")
        if self.renormalize and self.mode is RoutingMode.TOPK_SOFTMAX:
            raise ModelLoadError("renormalize applies to softmax_topk routing only (topk_softmax weights sum to 1)")


def route(logits: torch.Tensor, config: RouterConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, k] float32, expert ids [T, k] int64), row by row.

    The weights are computed in float32 whatever the model's dtype. torch.topk orders each row by
    value; ties are broken inside the row, never by another row."""
    if logits.dim() != 2 or logits.shape[1] != config.num_experts:
        raise ValueError(f"router logits of shape {tuple(logits.shape)}, expected [T, {config.num_experts}]")
    x = logits.float()
    if config.mode is RoutingMode.TOPK_SOFTMAX:
        top, ids = torch.topk(x, config.top_k, dim=-1)
        return torch.softmax(top, dim=-1), ids
    probs = torch.softmax(x, dim=-1)
    weights, ids = torch.topk(probs, config.top_k, dim=-1)
    if config.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


@dataclass(frozen=True, slots=True)
class ExpertGroups:
    """Pairs sorted by expert (stable: token order within an expert).
    order: [T * k] pair ids; counts: pairs per expert, a Python list of E ints (the CPU path
    slices runs with it; reading it is the one host synchronization of the grouping)."""

    order: torch.Tensor
    counts: list[int]


def group_by_expert(ids: torch.Tensor, num_experts: int) -> ExpertGroups:
    """ids [T, k] -> the pairs sorted by expert. Expert e's pairs are order[s_e : s_e + counts[e]],
    s_e the sum of the counts before e."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    return ExpertGroups(order=order, counts=counts)


@dataclass(frozen=True, slots=True)
class AlignedPairs:
    """The expert runs padded to whole tiles of block_m rows, built on the device with no host
    synchronization (a fixed-size launch, so it can be captured in a CUDA graph).

    sorted_pairs: [capacity] int32, pair ids by expert; each run padded with the invalid id T * k
    block_expert: [capacity / block_m] int32, the expert of each tile
    num_padded:   [1] int32, rows in use (tiles beyond it are skipped by the kernel)

        sorted_pairs   | e0 e0 e0 -- | e2 e2 e2 e2 | e2 -- -- -- | e5 -- -- -- | unused ...
        block_expert   |      0      |      2      |      2      |      5      |
    """

    sorted_pairs: torch.Tensor
    block_expert: torch.Tensor
    num_padded: torch.Tensor
    block_m: int


def align_pairs(ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedPairs:
    """ids [T, k] -> AlignedPairs. capacity = T k + min(E, T k) (block_m - 1), rounded up to a
    whole tile: the most rows any routing of T tokens can need (each active expert wastes at most
    block_m - 1 rows)."""
    flat = ids.reshape(-1)
    pairs = flat.numel()
    device = flat.device
    order = torch.argsort(flat, stable=True)
    # (a scatter-add, not bincount: bincount on CUDA reads the largest id back to the host)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)
    run_start = torch.cumsum(counts, 0) - counts
    expert_of = flat[order]  # [P] expert of each sorted pair
    rank = torch.arange(pairs, device=device) - run_start[expert_of]  # index inside its expert's run
    dest = pad_end[expert_of] - padded[expert_of] + rank
    capacity = pairs + min(num_experts, pairs) * (block_m - 1)
    capacity = -(-capacity // block_m) * block_m
    sorted_pairs = torch.full((capacity,), pairs, dtype=torch.int32, device=device)
    sorted_pairs[dest] = order.to(torch.int32)
    tile_start = torch.arange(0, capacity, block_m, device=device)
    block_expert = torch.searchsorted(pad_end, tile_start, right=True).clamp_(max=num_experts - 1)
    return AlignedPairs(
        sorted_pairs=sorted_pairs,
        block_expert=block_expert.to(torch.int32),
        num_padded=pad_end[-1:].to(torch.int32),
        block_m=block_m,
    )
