"""The mixture-of-experts block against transformers' own blocks (Mixtral, Qwen3-MoE with and
without norm_topk_prob, gpt-oss), and its dropless, batch-invariant routing."""

from __future__ import annotations

import pytest
import torch

from tests.support.moe import FAMILIES, reference
from traceless.errors import ModelLoadError
from traceless.model.layers.moe import GroupedMoE, MoEWeights, combine
from traceless.model.layers.moe_routing import RouterConfig, RoutingMode, align_pairs, group_by_expert, route

TOL = 2e-6  # float32: relative error (Frobenius) against transformers' block


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("experts", "top_k", "tokens"), [(4, 2, 1), (8, 2, 13), (8, 3, 40)])
def test_moe_matches_transformers(family, experts, top_k, tokens):
    ref = reference(family, experts=experts, top_k=top_k, seed=experts + top_k)
    h = torch.randn(tokens, 32, generator=torch.Generator().manual_seed(tokens))
    out = GroupedMoE(ref.config, ref.weights)(h)
    want = ref(h)
    assert out.shape == want.shape and out.dtype == torch.float32
    assert _rel(out, want) < TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_routing_matches_transformers_router(family):
    ref = reference(family, experts=8, top_k=3)
    h = torch.randn(50, 32, generator=torch.Generator().manual_seed(5))
    router = ref.block.router if family == "gpt_oss" else ref.block.gate
    with torch.no_grad():
        logits, want_w, want_ids = router(h)
    weights, ids = route(logits, ref.config.router)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_w.float(), rtol=1e-6, atol=1e-7)
    if ref.config.router.mode is RoutingMode.TOPK_SOFTMAX or ref.config.router.renormalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(50), rtol=1e-6, atol=1e-6)
    else:  # Qwen3-MoE without norm_topk_prob: the k probabilities keep their share of all E
        assert float(weights.sum(-1).max()) < 1.0


def test_clamped_swiglu_reaches_its_clamps():
    """The gpt-oss reference runs with limit 1 so both clamps of its activation are exercised."""
    ref = reference("gpt_oss")
    h = torch.randn(20, 32, generator=torch.Generator().manual_seed(2))
    gu = torch.nn.functional.linear(h, ref.weights.gate_up[0], ref.weights.gate_up_bias[0])
    gate, up = gu.chunk(2, -1)
    assert bool((gate > 1).any()) and bool((up < -1).any()) and bool((up > 1).any())


def test_every_token_reaches_its_experts_when_all_choose_the_same_ones():
    """Dropless: 64 tokens all routed to experts 0 and 1 are all computed, none dropped, and each
    equals that token computed alone with a naive per-token reference."""
    ref = reference("mixtral", experts=4, top_k=2)
    w = ref.weights
    w.router = torch.zeros_like(w.router)
    w.router[0, 0], w.router[1, 0] = 50.0, 49.0  # feature 0 > 0 decides: experts 0 then 1
    h = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    h[:, 0] = h[:, 0].abs() + 1.0
    moe = GroupedMoE(ref.config, w)
    out = moe(h)
    weights, ids = route(torch.nn.functional.linear(h, w.router), ref.config.router)
    assert bool((ids[:, 0] == 0).all()) and bool((ids[:, 1] == 1).all())
    for t in range(64):
        want = sum(float(weights[t, j]) * moe._expert(int(ids[t, j]), h[t : t + 1])[0] for j in range(2))
        assert _rel(out[t], want) < 1e-6


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_a_token_alone_and_among_strangers_gives_the_same_result(family):
    """Batch invariance: five tokens alone, then placed at random rows among 0..200 random other
    tokens, come out equal within 1e-6 (relative), and a peaked head picks the same argmax."""
    ref = reference(family, experts=8, top_k=2, seed=3)
    moe = GroupedMoE(ref.config, ref.weights)
    g = torch.Generator().manual_seed(7)
    mine = torch.randn(5, 32, generator=g)
    head = torch.randn(100, 32, generator=g) * 4
    alone = moe(mine)
    logits = alone @ head.T
    top2 = logits.topk(2, -1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 1e-3  # no near-ties: the greedy check means something
    worst = 0.0
    for strangers in (0, 1, 7, 64, 200):
        batch = torch.randn(strangers + 5, 32, generator=g)
        rows = torch.randperm(strangers + 5, generator=g)[:5]
        batch[rows] = mine
        got = moe(batch)[rows]
        worst = max(worst, float((got - alone).abs().max() / alone.abs().max()))
        assert torch.equal((got @ head.T).argmax(-1), logits.argmax(-1))
    assert worst < 1e-6


def test_group_by_expert_sorts_pairs_stably():
    ids = torch.tensor([[2, 0], [0, 3], [2, 1]])
    groups = group_by_expert(ids, 5)
    assert groups.counts == [2, 1, 2, 1, 0]
    assert groups.order.tolist() == [1, 2, 5, 0, 4, 3]  # pair t k + j, by expert, token order within


@pytest.mark.parametrize(("tokens", "k", "experts", "block_m"), [(1, 2, 8, 16), (9, 2, 4, 4), (50, 4, 16, 8)])
def test_align_pairs_pads_each_expert_run_to_whole_tiles(tokens, k, experts, block_m):
    g = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    a = align_pairs(ids, experts, block_m)
    pairs = tokens * k
    used = int(a.num_padded)
    assert used % block_m == 0 and a.sorted_pairs.numel() >= used
    assert a.block_expert.numel() * block_m == a.sorted_pairs.numel()
    valid = a.sorted_pairs[:used][a.sorted_pairs[:used] < pairs]
    assert sorted(valid.tolist()) == list(range(pairs))  # every pair once
    assert bool((a.sorted_pairs[used:] == pairs).all())
    flat = ids.flatten()
    for tile in range(used // block_m):
        chunk = a.sorted_pairs[tile * block_m : (tile + 1) * block_m]
        real = chunk[chunk < pairs].long()
        assert real.numel() > 0  # no tile of padding only below num_padded
        assert bool((flat[real] == a.block_expert[tile]).all())


def test_combine_weights_in_float32_and_casts():
    pairs = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]], dtype=torch.bfloat16)
    out = combine(pairs, torch.tensor([[0.25, 0.75]]), torch.bfloat16)
    assert out.dtype == torch.bfloat16 and out.tolist() == [[2.5, 3.5]]


def test_weights_of_the_wrong_shape_are_refused_by_name():
    ref = reference("mixtral")
    bad = MoEWeights(
        router=ref.weights.router, router_bias=None, gate_up=ref.weights.gate_up[:, :-1], down=ref.weights.down
    )
    with pytest.raises(ModelLoadError, match="'gate_up' has shape"):
        GroupedMoE(ref.config, bad)
    extra = MoEWeights(
        router=ref.weights.router,
        router_bias=None,
        gate_up=ref.weights.gate_up,
        down=ref.weights.down,
        down_bias=torch.zeros(8, 32),
    )
    with pytest.raises(ModelLoadError, match="'down_bias' given"):
        GroupedMoE(ref.config, extra)


def test_router_config_is_validated():
    with pytest.raises(ModelLoadError, match="top_k"):
        RouterConfig(4, 5, RoutingMode.SOFTMAX_TOPK)
    with pytest.raises(ModelLoadError, match="renormalize"):
        RouterConfig(4, 2, RoutingMode.TOPK_SOFTMAX, renormalize=True)
