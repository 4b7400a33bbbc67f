"""The fused-MoE Triton kernels (grouped GEMM over expert-sorted pairs) against the torch block of
moe.py. On a CPU they run under Triton's interpreter (TRITON_INTERPRET=1, set before triton is
imported); where CUDA exists they run compiled, on the GPU, as `gpu` tests."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

from tests.support.moe import FAMILIES, reference  # noqa: E402
from traceless.model.layers import moe_triton as mt  # noqa: E402
from traceless.model.layers.moe import GroupedMoE, MoEWeights  # noqa: E402
from traceless.model.layers.moe_routing import align_pairs, route  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []
TOL = 1e-5  # float32 (ieee dot products): relative error against the torch block


def _on(weights: MoEWeights) -> MoEWeights:
    move = {f: getattr(weights, f) for f in MoEWeights.__slots__}
    return MoEWeights(**{f: None if t is None else t.to(DEVICE) for f, t in move.items()})


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("experts", "top_k", "tokens"), [(4, 2, 1), (8, 3, 37)])
def test_triton_moe_matches_the_torch_block(family, experts, top_k, tokens):
    ref = reference(family, hidden=96, inter=80, experts=experts, top_k=top_k, seed=tokens)
    h = torch.randn(tokens, 96, generator=torch.Generator().manual_seed(tokens))
    want = GroupedMoE(ref.config, ref.weights)(h)
    out = mt.TritonMoE(ref.config, _on(ref.weights))(h.to(DEVICE))
    assert out.shape == want.shape and not out.isnan().any()
    assert _rel(out, want) < TOL


def test_grouped_gemm_writes_every_pair_and_only_pairs():
    """Poisoned output: every pair row written once, by its own expert; weights applied per pair."""
    E, T, k, K, N = 5, 11, 2, 70, 130  # K, N not multiples of the tiles
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(DEVICE)
    a = torch.randn(T, K, generator=g).to(DEVICE)
    w = torch.randn(E, N, K, generator=g).to(DEVICE)
    bias = torch.randn(E, N, generator=g).to(DEVICE)
    pw = torch.rand(T * k, generator=g).to(DEVICE)
    out = torch.full((T * k, N), float("nan"), device=DEVICE)
    mt.grouped_gemm(a, w, bias, align_pairs(ids, E, mt.BLOCK_M), out, a_row_div=k, pair_weights=pw)
    flat = ids.flatten().cpu()
    want = torch.stack(
        [(a[p // k].cpu() @ w[flat[p]].cpu().T + bias[flat[p]].cpu()) * pw[p].cpu() for p in range(T * k)]
    )
    assert not out.isnan().any()
    assert _rel(out, want) < TOL


def test_triton_moe_is_batch_invariant():
    """Three tokens alone and at random rows among 0..40 strangers: equal results (the tile sizes
    never depend on the batch), within 1e-6 relative to their largest value."""
    ref = reference("qwen3_moe", hidden=64, inter=48, experts=8, top_k=2, seed=4)
    moe = mt.TritonMoE(ref.config, _on(ref.weights))
    g = torch.Generator().manual_seed(9)
    mine = torch.randn(3, 64, generator=g)
    alone = moe(mine.to(DEVICE))
    for strangers in (0, 5, 40):
        batch = torch.randn(strangers + 3, 64, generator=g)
        rows = torch.randperm(strangers + 3, generator=g)[:3]
        batch[rows] = mine
        got = moe(batch.to(DEVICE))[rows.to(DEVICE)]
        assert float((got - alone).abs().max() / alone.abs().max()) < 1e-6


@pytest.mark.skipif(DEVICE != "cuda", reason="bfloat16 tensor-core path: CUDA only")
def test_triton_moe_bfloat16_is_close_to_float32():
    """The same routing for both (float32 router), so that the check is the experts' kernels."""
    ref = reference("mixtral", hidden=256, inter=512, experts=8, top_k=2)
    h = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    weights, ids = route(torch.nn.functional.linear(h, ref.weights.router), ref.config.router)
    want = GroupedMoE(ref.config, ref.weights).experts(h, weights, ids)
    w = _on(ref.weights)
    w16 = MoEWeights(router=w.router.bfloat16(), router_bias=None, gate_up=w.gate_up.bfloat16(), down=w.down.bfloat16())
    out = mt.TritonMoE(ref.config, w16).experts(h.to(DEVICE).bfloat16(), weights.to(DEVICE), ids.to(DEVICE))
    assert out.dtype == torch.bfloat16
    assert _rel(out.float(), want) < 2e-2  # bfloat16 inputs and outputs, float32 accumulation
