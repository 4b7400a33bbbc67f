"""The native paged-attention kernel against a plain-torch reference; the native argmax against
torch's."""

import pytest
import torch

from traceless.model.layers.kernels import NativeKernels, PagedAttentionArgs


@pytest.fixture(scope="module")
def kernels():
    return NativeKernels.load()


def reference(a: PagedAttentionArgs) -> torch.Tensor:
    _, nkv, bs, hd = a.v_cache.shape
    nh = a.q.shape[1]
    outs = []
    for b in range(a.context_lens.numel()):
        lo, hi, ctx = int(a.cu_q[b]), int(a.cu_q[b + 1]), int(a.context_lens[b])
        nblk = -(-ctx // bs)
        ids = a.block_tables[b, :nblk].long()
        k = a.k_cache[ids].transpose(2, 3).permute(1, 0, 2, 3).reshape(nkv, nblk * bs, hd)[:, :ctx].float()
        v = a.v_cache[ids].permute(1, 0, 2, 3).reshape(nkv, nblk * bs, hd)[:, :ctx].float()
        k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
        q = a.q[lo:hi].float().transpose(0, 1)  # [nh, q_len, hd]
        s = q @ k.transpose(1, 2) * a.scale
        pos = torch.arange(ctx - (hi - lo), ctx)[:, None]
        s.masked_fill_(torch.arange(ctx)[None, :] > pos, float("-inf"))
        outs.append((s.softmax(-1) @ v).transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize(
    "dtype, kv_dtype, tol",
    [
        (torch.float32, torch.float32, 1e-5),
        (torch.bfloat16, torch.bfloat16, 2e-2),
        (torch.float32, torch.float16, 1e-5),
    ],
)
@pytest.mark.parametrize("block_size", [16, 8])  # 16: the AVX-512 or AVX2 row kernel
@pytest.mark.parametrize("heads", [(9, 3, 64), (4, 4, 32), (8, 1, 16), (6, 2, 128)])  # 128: 8 vectors a row
def test_paged_attention_matches_reference(kernels, dtype, kv_dtype, tol, block_size, heads):
    """float16 K/V under float32 queries: the reference reads the same float16 values."""
    nh, nkv, hd = heads
    gen = torch.Generator().manual_seed(0)
    num_blocks = 128
    q_lens, ctxs = [1, 3, 1, 7, 1], [5, 40, 130, 17, 1]
    max_blocks = max(-(-c // block_size) for c in ctxs)
    tables = torch.randperm(num_blocks, generator=gen)[: len(ctxs) * max_blocks].view(len(ctxs), max_blocks)
    cu_q = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    args = PagedAttentionArgs(
        q=torch.randn(sum(q_lens), nh, hd, generator=gen).to(dtype),
        k_cache=torch.randn(num_blocks, nkv, hd, block_size, generator=gen).to(kv_dtype),
        v_cache=torch.randn(num_blocks, nkv, block_size, hd, generator=gen).to(kv_dtype),
        block_tables=tables.to(torch.int32).contiguous(),
        cu_q=cu_q,
        context_lens=torch.tensor(ctxs, dtype=torch.int32),
        out=torch.full((sum(q_lens), nh, hd), float("nan"), dtype=dtype),
        scale=hd**-0.5,
    )
    kernels.paged_attention(args)
    torch.testing.assert_close(args.out.float(), reference(args), atol=tol, rtol=tol)


def test_mixed_dtypes_without_a_kernel_are_refused(kernels):
    q = torch.zeros(1, 2, 16)
    cache = torch.zeros(2, 1, 16, 16, dtype=torch.bfloat16)
    args = PagedAttentionArgs(
        q, cache, cache.transpose(2, 3).contiguous(), torch.zeros(1, 1, dtype=torch.int32),
        torch.tensor([0, 1], dtype=torch.int32), torch.ones(1, dtype=torch.int32), torch.empty(1, 2, 16), 0.25,
    )  # fmt: skip
    with pytest.raises(ValueError, match="float32 activations over a torch.bfloat16 KV cache"):
        kernels.paged_attention(args)


@pytest.mark.parametrize("cols", [1, 5, 8, 15, 16, 17, 33, 100, 49152])  # shorter than, and tails past, 8 and 16 lanes
def test_argmax_gives_torchs_answer_on_ties_nans_and_infinities(kernels, cols):
    """Greedy sampling's argmax: the first index of the largest value, the first NaN where a row
    has one (NaN ranks above every number, as in torch), 0 for a row of -inf."""
    gen = torch.Generator().manual_seed(cols)
    rows = []
    for trial in range(24):
        x = torch.randn(6, cols, generator=gen)
        if trial % 3 == 1:  # small integers: many ties, the first must win
            x = torch.randint(-2, 3, (6, cols), generator=gen).float()
        if trial % 4 == 2:
            x.view(-1)[torch.randint(0, x.numel(), (max(1, x.numel() // 7),), generator=gen)] = float("nan")
        if trial % 5 == 3:
            x[0] = float("-inf")
            x[1, -1] = float("inf")
        if trial % 6 == 5:
            x[:, -1] = 1e30  # the maximum in the scalar tail
        rows.append(x)
    x = torch.cat(rows)
    assert torch.equal(kernels.argmax(x), x.argmax(dim=-1))


def test_argmax_refuses_what_it_cannot_read(kernels):
    with pytest.raises(ValueError, match="contiguous float32"):
        kernels.argmax(torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous float32"):
        kernels.argmax(torch.zeros(4, 2).t())
    with pytest.raises(ValueError, match="empty row"):
        kernels.argmax(torch.zeros(2, 0))
