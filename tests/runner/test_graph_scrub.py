"""What a scrub replay of a decode graph overwrites. A CUDA graph replays the kernels it captured on
the metadata its buffers hold; between steps they hold `fill_idle`'s image, so the kernels that
matter are run here on that image directly (on a CPU under Triton's interpreter): every attention
output and split-K partial of the last real step must come out zero, and no K/V may be written."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from traceless.model.layers import triton_kernels as tk  # noqa: E402
from traceless.runner.step_meta import Layout, fill_idle  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _idle_views(layout: Layout) -> dict[str, torch.Tensor]:
    host = np.full(layout.size, 77, dtype=np.int32)  # the last real step's metadata, say
    fill_idle(host, layout)
    return layout.views(torch.from_numpy(host).to(DEVICE))


@pytest.mark.parametrize("sms", [0, 64])  # 64 multiprocessors: the batch splits its keys
def test_a_scrub_replay_overwrites_attention_outputs_and_partials(sms, monkeypatch):
    n, nh, nkv, d, bs = 4, 4, 2, 16, 4
    layout = Layout(rows=n, logits=n, seqs=n, width=3)
    v = _idle_views(layout)
    k_cache = torch.randn(6, nkv, d, bs, device=DEVICE)
    v_cache = torch.randn(6, nkv, bs, d, device=DEVICE)
    q = torch.randn(n, nh, d, device=DEVICE)  # token 0's queries (a scrub replay computes them)
    out = torch.randn(n, nh, d, device=DEVICE)  # the graph's attention output: the last step's
    held: list[torch.Tensor] = []
    fresh = tk.split_workspace

    def stale_workspace(*args):
        part, ml = fresh(*args)
        part.normal_()
        ml.normal_()  # what the last real step left in the graph's pool
        held.extend((part, ml))
        return part, ml

    monkeypatch.setattr(tk, "split_workspace", stale_workspace)
    tk.paged_attention(q, k_cache, v_cache, out, v["tables"][:n], v["cu_q"][: n + 1], v["ctx"][:n], 0.25, 1, sms)
    assert torch.equal(out, torch.zeros_like(out))
    if sms:
        part, ml = held
        assert torch.equal(part, torch.zeros_like(part))
        assert torch.equal(ml[..., 1], torch.zeros_like(ml[..., 1]))  # sums; the maxima are -inf
        assert bool((ml[..., 0] == float("-inf")).all())
    else:
        assert not held


def test_a_scrub_replay_writes_no_kv():
    n, nh, nkv, d, bs = 4, 4, 2, 16, 4
    v = _idle_views(Layout(rows=n, logits=n, seqs=n, width=3))
    qkv = torch.randn(n, (nh + 2 * nkv) * d, device=DEVICE)
    angles = torch.rand(8, d // 2, device=DEVICE)
    k_cache = torch.zeros(6, nkv, d, bs, device=DEVICE)
    v_cache = torch.zeros(6, nkv, bs, d, device=DEVICE)
    slots = (v["blocks"][:n], v["offsets"][:n])
    tk.rope_cache(qkv, (nh, nkv, d), angles.cos(), angles.sin(), v["positions"][:n], slots, k_cache, v_cache)
    assert k_cache.abs().sum() == 0 and v_cache.abs().sum() == 0
