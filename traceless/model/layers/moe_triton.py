"""The mixture-of-experts block on CUDA: a grouped GEMM in Triton over the token/expert pairs
sorted by expert (moe_routing.align_pairs), the same interface as moe.GroupedMoE:

    moe = TritonMoE(config, weights)         # weights on the GPU
    out = moe(h)                             # h [T, H] -> out [T, H]

One step for T tokens, top k, P = T k pairs, I the intermediate size of one expert:

    route (torch, on the device)             weights [T, k] float32, ids [T, k]
    align_pairs                              tiles of BLOCK_M sorted pairs, each of one expert
    grouped GEMM 1: x[t] @ gate_up[e]^T      -> gate_up_out [P, 2I]   (row p = t k + j)
    activation (torch, element-wise)         -> act [P, I]
    grouped GEMM 2: act[p] @ down[e]^T       -> y [P, H], times the pair's routing weight
    combine: out[t] = sum_j y[t k + j]       fixed order, float32 (one program per token)

No host synchronization anywhere (the grid covers the most tiles any routing could need; tiles
past num_padded return at once), so a decode step with experts can be captured in a CUDA graph.
The tile sizes are constants, never chosen from T: a row's dot products then run the same
instructions in the same order whatever else is in the batch, which keeps the block
batch-invariant on the GPU too. Runs on a CPU under TRITON_INTERPRET=1 (how the tests check it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from traceless.model.layers.moe import MoEConfig, MoEWeights
from traceless.model.layers.moe_routing import AlignedPairs, align_pairs, route

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64  # constants: see the module's note on batch invariance


@triton.jit
def _grouped_gemm_kernel(
    a_ptr,
    w_ptr,
    bias_ptr,
    c_ptr,
    pair_weight_ptr,
    sorted_pairs_ptr,
    block_expert_ptr,
    num_padded_ptr,
    N,
    K,
    num_pairs,
    a_row_div,
    stride_am,
    stride_we,
    stride_wn,
    stride_be,
    stride_cm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One program: tile pid_m of sorted pairs (all of expert e), output columns of tile pid_n.
    c[p, n] = sum_k a[p // a_row_div, k] w[e, n, k] (+ bias[e, n]) (* pair_weight[p]).
    a_row_div = k for the first GEMM (a row per token), 1 for the second (a row per pair)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    num_padded = tl.load(num_padded_ptr)
    if pid_m * BLOCK_M >= num_padded:
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    pair = tl.load(sorted_pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < num_pairs  # padding rows carry the id num_pairs
    a_row = (pair // a_row_div).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols_ok = cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        ks_ok = ks < K
        a = tl.load(
            a_ptr + a_row[:, None] * stride_am + ks[None, :], mask=valid[:, None] & ks_ok[None, :], other=0.0
        )  # [BLOCK_M, BLOCK_K]
        w = tl.load(
            w_ptr + expert * stride_we + cols[None, :] * stride_wn + ks[:, None],
            mask=ks_ok[:, None] & cols_ok[None, :],
            other=0.0,
        )  # [BLOCK_K, BLOCK_N]
        acc += tl.dot(a, w, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + expert * stride_be + cols, mask=cols_ok, other=0.0).to(tl.float32)[None, :]
    if MUL_WEIGHT:
        acc *= tl.load(pair_weight_ptr + pair, mask=valid, other=0.0)[:, None]
    c = c_ptr + pair.to(tl.int64)[:, None] * stride_cm + cols[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & cols_ok[None, :])


@triton.jit
def _combine_kernel(y_ptr, out_ptr, H, TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    """One program: token t. out[t] = y[t k] + y[t k + 1] + ... in this order, in float32."""
    t = tl.program_id(0).to(tl.int64)
    for h0 in range(0, H, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        ok = cols < H
        acc = tl.zeros([BLOCK_H], tl.float32)
        for j in tl.static_range(TOP_K):
            acc += tl.load(y_ptr + (t * TOP_K + j) * H + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + t * H + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


def grouped_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    aligned: AlignedPairs,
    out: torch.Tensor,
    a_row_div: int,
    pair_weights: torch.Tensor | None = None,
) -> None:
    """out[p] = a[p // a_row_div] @ w[e(p)]^T (+ bias[e(p)]) (* pair_weights[p]) for every pair p.
    a: [rows, K] contiguous rows; w: [E, N, K]; bias: [E, N]; out: [P, N]; pair_weights: [P] float32."""
    P, N = out.shape
    K = w.shape[2]
    if a.stride(1) != 1 or w.stride(2) != 1 or out.stride(1) != 1:
        raise ValueError("grouped_gemm needs rows contiguous in their last dimension")
    grid = (aligned.block_expert.numel(), triton.cdiv(N, BLOCK_N))
    _grouped_gemm_kernel[grid](
        a,
        w,
        bias if bias is not None else w,
        out,
        pair_weights if pair_weights is not None else out,
        aligned.sorted_pairs,
        aligned.block_expert,
        aligned.num_padded,
        N,
        K,
        P,
        a_row_div,
        a.stride(0),
        w.stride(0),
        w.stride(1),
        bias.stride(0) if bias is not None else 0,
        out.stride(0),
        BLOCK_M=aligned.block_m,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        HAS_BIAS=bias is not None,
        MUL_WEIGHT=pair_weights is not None,
        PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
    )


def combine_pairs(y: torch.Tensor, top_k: int, out: torch.Tensor) -> None:
    """y [T k, H] (already weighted) -> out [T, H]: the sum of each token's k rows."""
    T, H = out.shape
    _combine_kernel[(T,)](y, out, H, TOP_K=top_k, BLOCK_H=min(1024, triton.next_power_of_2(H)))


class TritonMoE:
    """GroupedMoE's interface on the Triton kernels (CUDA; the CPU only under the interpreter)."""

    def __init__(self, config: MoEConfig, weights: MoEWeights):
        weights.check(config)
        self.config, self.w = config, weights

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """h [T, H] contiguous -> [T, H]."""
        logits = F.linear(h, self.w.router, self.w.router_bias)  # [T, E]
        weights, ids = route(logits, self.config.router)
        return self.experts(h, weights, ids)

    def experts(self, h: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """h [T, H], weights [T, k] float32, ids [T, k] -> [T, H]."""
        T, k = ids.shape
        c, w = self.config, self.w
        aligned = align_pairs(ids, c.router.num_experts, BLOCK_M)
        gate_up = h.new_empty(T * k, 2 * c.intermediate_size)
        grouped_gemm(h, w.gate_up, w.gate_up_bias, aligned, gate_up, a_row_div=k)
        act = c.activation(gate_up).contiguous()  # [T k, I]
        y = h.new_empty(T * k, c.hidden_size)
        grouped_gemm(act, w.down, w.down_bias, aligned, y, a_row_div=1, pair_weights=weights.reshape(-1))
        out = torch.empty_like(h)
        combine_pairs(y, k, out)
        return out
