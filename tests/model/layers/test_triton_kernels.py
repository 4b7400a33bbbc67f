"""The Triton kernels against PyTorch references. On a CPU they run under Triton's interpreter
(TRITON_INTERPRET=1, set before triton is imported: conftest-free, in this module); on CUDA they
run compiled. Inputs are fresh random numbers, outputs are poisoned first."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

from traceless.model.layers import triton_kernels as tk  # noqa: E402
from traceless.model.rope import apply_rope  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _cache(num_blocks: int, nkv: int, d: int, bs: int, dtype: torch.dtype):
    k = torch.randn(num_blocks, nkv, d, bs, dtype=dtype, device=DEVICE)
    v = torch.randn(num_blocks, nkv, bs, d, dtype=dtype, device=DEVICE)
    return k, v


def _reference(q, k_cache, v_cache, tables, q_lens, ctx_lens, scale, sinks=None, softcap=None):
    """float64 causal attention of each sequence's queries over its context, read block by block;
    scores soft-capped (softcap * tanh(s / softcap)) and each head's sink logit one more column of
    the softmax whose probability is dropped, as transformers' eager attention computes them."""
    nh, d = q.shape[1], q.shape[2]
    nkv, bs = k_cache.shape[1], k_cache.shape[3]
    out = torch.empty(q.shape, dtype=torch.float64)
    row = 0
    for b, (n, ctx) in enumerate(zip(q_lens, ctx_lens)):
        blocks = tables[b, : -(-ctx // bs)].long().cpu()
        keys = k_cache.cpu().double()[blocks].permute(1, 0, 3, 2).reshape(nkv, -1, d)[:, :ctx]
        vals = v_cache.cpu().double()[blocks].permute(1, 0, 2, 3).reshape(nkv, -1, d)[:, :ctx]
        keys = keys.repeat_interleave(nh // nkv, 0)
        vals = vals.repeat_interleave(nh // nkv, 0)
        qs = q[row : row + n].cpu().double().transpose(0, 1)  # [H, n, D]
        s = qs @ keys.transpose(1, 2) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        qpos = torch.arange(ctx - n, ctx)[:, None]
        s = s.masked_fill(torch.arange(ctx)[None, :] > qpos, float("-inf"))
        if sinks is not None:
            sink = sinks.cpu().double().view(-1, 1, 1).expand(-1, n, 1)
            p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
        else:
            p = torch.softmax(s, -1)
        out[row : row + n] = (p @ vals).transpose(0, 1)
        row += n
    return out


@pytest.mark.parametrize(("nh", "nkv", "d"), [(4, 2, 16), (8, 2, 32), (4, 4, 16)])
@pytest.mark.parametrize("q_lens", [[1, 1, 1], [1, 7, 20], [33]])
def test_paged_attention_matches_reference(nh, nkv, d, q_lens):
    torch.manual_seed(len(q_lens) * 100 + nh + d)
    bs, num_blocks = 4, 40
    k_cache, v_cache = _cache(num_blocks, nkv, d, bs, torch.float32)
    prefixes = [5, 0, 13][: len(q_lens)]  # cached context before the new tokens (prefix hits, chunks)
    ctx = [p + n for p, n in zip(prefixes, q_lens)]
    width = max(-(-c // bs) for c in ctx) + 1
    perm = torch.randperm(num_blocks - 1)[: width * len(q_lens)] + 1  # scattered blocks, never block 0
    tables = perm.view(len(q_lens), width).to(torch.int32).to(DEVICE)
    q = torch.randn(sum(q_lens), nh, d, device=DEVICE)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    want = _reference(q, k_cache, v_cache, tables, q_lens, ctx, d**-0.5)
    for sms in (0, 64):  # 64 multiprocessors: a decode batch splits its keys (flash-decoding)
        out = torch.full_like(q, float("nan"))
        tk.paged_attention(
            q,
            k_cache,
            v_cache,
            out,
            tables,
            cu,
            torch.tensor(ctx, dtype=torch.int32, device=DEVICE),
            d**-0.5,
            max(q_lens),
            sms,
        )
        err = (out.cpu().double() - want).norm() / want.norm()
        assert not out.isnan().any()
        assert err < 1e-5


@pytest.mark.parametrize(("nh", "nkv"), [(4, 2), (8, 1)])
def test_paged_attention_over_whole_tiles_matches_reference(nh, nkv):
    """Contexts of several 64-key tiles: whole tiles run unmasked, the causal diagonal and the last
    partial tile masked (a decode row, a chunk after a long prefix, a fresh prompt longer than a tile)."""
    torch.manual_seed(nh)
    d, bs, num_blocks = 16, 4, 130
    q_lens, prefixes = [1, 25, 70], [150, 130, 0]
    k_cache, v_cache = _cache(num_blocks, nkv, d, bs, torch.float32)
    ctx = [p + n for p, n in zip(prefixes, q_lens)]
    width = max(-(-c // bs) for c in ctx)
    tables = (torch.randperm(num_blocks - 1)[: width * 3] + 1).view(3, width).to(torch.int32).to(DEVICE)
    q = torch.randn(sum(q_lens), nh, d, device=DEVICE)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    want = _reference(q, k_cache, v_cache, tables, q_lens, ctx, d**-0.5)
    out = torch.full_like(q, float("nan"))
    tk.paged_attention(
        q,
        k_cache,
        v_cache,
        out,
        tables,
        cu,
        torch.tensor(ctx, dtype=torch.int32, device=DEVICE),
        d**-0.5,
        max(q_lens),
        0,
    )
    assert (out.cpu().double() - want).norm() / want.norm() < 1e-5
    decode = torch.full_like(q[:1], float("nan"))  # the decode row alone, its keys split 4 ways
    tk.paged_attention(
        q[:1],
        k_cache,
        v_cache,
        decode,
        tables[:1],
        cu[:2],
        torch.tensor(ctx[:1], dtype=torch.int32, device=DEVICE),
        d**-0.5,
        1,
        64,
    )
    assert (decode.cpu().double() - want[:1]).norm() / want[:1].norm() < 1e-5


@pytest.mark.parametrize(("sinks", "softcap"), [(True, None), (False, 2.0), (True, 2.0)])
def test_paged_attention_with_sinks_and_softcapping_matches_reference(sinks, softcap):
    """gpt-oss's attention sinks (a logit per head in each softmax's denominator) and Gemma 2's
    soft-capping, on prefill tiles, decode rows and split decode (the sink joins at the combine).
    Scores are scaled up so that the cap bites (|s| well above the cap) and sinks near the scores'
    range so that they take a real share."""
    torch.manual_seed(3 + bool(sinks) + int(softcap or 0))
    nh, nkv, d, bs, num_blocks = 8, 2, 16, 4, 170
    q_lens, prefixes = [1, 1, 25, 70], [150, 3, 130, 0]
    k_cache, v_cache = _cache(num_blocks, nkv, d, bs, torch.float32)
    ctx = [p + n for p, n in zip(prefixes, q_lens)]
    width = max(-(-c // bs) for c in ctx)
    tables = (torch.randperm(num_blocks - 1)[: width * 4] + 1).view(4, width).to(torch.int32).to(DEVICE)
    q = torch.randn(sum(q_lens), nh, d, device=DEVICE) * 3
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    sink = torch.randn(nh, device=DEVICE) * 2 + 1 if sinks else None
    want = _reference(q, k_cache, v_cache, tables, q_lens, ctx, d**-0.5, sink, softcap)
    plain = _reference(q, k_cache, v_cache, tables, q_lens, ctx, d**-0.5)
    assert (want - plain).norm() / want.norm() > 0.05  # the features change the answer
    lens = torch.tensor(ctx, dtype=torch.int32, device=DEVICE)
    out = torch.full_like(q, float("nan"))
    tk.paged_attention(q, k_cache, v_cache, out, tables, cu, lens, d**-0.5, max(q_lens), 0, sinks=sink, softcap=softcap)
    assert (out.cpu().double() - want).norm() / want.norm() < 1e-5
    for sms in (0, 64):  # the two decode rows alone: one tile, then keys split across 64 processors
        dec = torch.full_like(q[:2], float("nan"))
        tk.paged_attention(
            q[:2], k_cache, v_cache, dec, tables[:2], cu[:3], lens[:2], d**-0.5, 1, sms, sinks=sink, softcap=softcap
        )
        assert (dec.cpu().double() - want[:2]).norm() / want[:2].norm() < 1e-5, sms


@pytest.mark.parametrize("sms", [0, 64])
def test_paged_attention_zeroes_padding_sequences(sms):
    """A captured batch pads with sequences of one row and no keys: their rows come out zero."""
    k_cache, v_cache = _cache(8, 2, 16, 4, torch.float32)
    q = torch.randn(3, 4, 16, device=DEVICE)
    out = torch.full_like(q, float("nan"))
    tables = torch.tensor([[1, 2], [0, 0], [0, 0]], dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 1, 2, 3], dtype=torch.int32, device=DEVICE)
    ctx = torch.tensor([6, 0, 0], dtype=torch.int32, device=DEVICE)
    tk.paged_attention(q, k_cache, v_cache, out, tables, cu, ctx, 0.25, 1, sms)
    assert out[0].abs().sum() > 0 and not out[0].isnan().any()
    assert torch.equal(out[1:], torch.zeros_like(out[1:]))


def test_decode_splits_fill_the_gpu_only_when_needed():
    assert tk.decode_splits(1, 8, True, 132) == 16  # 8 (seq, head) pairs x 16 splits: 128 programs
    assert tk.decode_splits(4, 8, True, 132) == 4
    assert tk.decode_splits(64, 8, True, 132) == 1
    assert tk.decode_splits(1, 8, False, 132) == 1  # prefill tiles are never split
    assert tk.decode_splits(1, 1, True, 132) == 16


def test_add_rms_norm_matches_torch():
    x = torch.randn(5, 48, device=DEVICE)
    delta = torch.randn(5, 48, device=DEVICE)
    w = torch.randn(48, device=DEVICE)
    want_x = x + delta
    want = torch.nn.functional.rms_norm(want_x, (48,), w, 1e-5)
    out = torch.full_like(x, float("nan"))
    tk.add_rms_norm(x, delta, w, out, 1e-5)
    torch.testing.assert_close(x, want_x)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    out2 = torch.full_like(x, float("nan"))
    tk.add_rms_norm(x, None, w, out2, 1e-5)
    torch.testing.assert_close(out2, torch.nn.functional.rms_norm(x, (48,), w, 1e-5), rtol=1e-5, atol=1e-5)


def test_silu_mul_matches_torch():
    gu = torch.randn(3, 2 * 1100, device=DEVICE)
    out = torch.full((3, 1100), float("nan"), device=DEVICE)
    tk.silu_mul(gu, out)
    g, u = gu.chunk(2, -1)
    torch.testing.assert_close(out, torch.nn.functional.silu(g) * u, rtol=1e-5, atol=1e-5)


def test_rope_cache_rotates_and_writes_the_cache():
    nh, nkv, d, bs, T = 4, 2, 16, 4, 5
    qkv = torch.randn(T, (nh + 2 * nkv) * d, device=DEVICE)
    before = qkv.clone()
    angles = torch.rand(32, d // 2, device=DEVICE) * 6
    cos, sin = angles.cos().contiguous(), angles.sin().contiguous()
    positions = torch.tensor([3, 9, 0, 31, 7], device=DEVICE)
    blocks = torch.tensor([1, 2, -1, 3, 1], dtype=torch.int32, device=DEVICE)  # -1: padding, not written
    offsets = torch.tensor([0, 3, 0, 1, 2], dtype=torch.int32, device=DEVICE)
    k_cache = torch.zeros(4, nkv, d, bs, device=DEVICE)
    v_cache = torch.zeros(4, nkv, bs, d, device=DEVICE)
    tk.rope_cache(qkv, (nh, nkv, d), cos, sin, positions, (blocks, offsets), k_cache, v_cache)
    qk = before[:, : (nh + nkv) * d].view(T, nh + nkv, d)
    want = apply_rope(qk, cos[positions][:, None], sin[positions][:, None])
    torch.testing.assert_close(qkv[:, : (nh + nkv) * d].view(T, nh + nkv, d), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(qkv[:, (nh + nkv) * d :], before[:, (nh + nkv) * d :])
    v = before[:, (nh + nkv) * d :].view(T, nkv, d)
    for t in (0, 1, 3, 4):
        b, o = int(blocks[t]), int(offsets[t])
        torch.testing.assert_close(k_cache[b, :, :, o], want[t, nh:], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v_cache[b, :, o], v[t])
    assert k_cache[0].abs().sum() == 0 and v_cache[0].abs().sum() == 0
    assert int((k_cache != 0).flatten(1).any(1).sum()) == 3  # blocks 1, 2, 3 only
