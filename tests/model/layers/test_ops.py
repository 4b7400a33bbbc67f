"""The native fused layer ops agree with their plain-torch versions."""

import pytest
import torch

from traceless.model.config import ModelConfig
from traceless.model.layers.kernels import NativeKernels
from traceless.model.layers.kv_cache import KVCache
from traceless.model.layers.ops import NativeOps, TorchOps
from traceless.model.rope import Rope

CFG = ModelConfig(
    architecture="llama",
    vocab_size=100,
    hidden_size=96,
    intermediate_size=160,
    num_layers=2,
    num_heads=6,
    num_kv_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=64,
    tie_word_embeddings=True,
    qkv_bias=False,
)
TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


def both(dtype, kv_dtype=None):
    gen = torch.Generator().manual_seed(0)
    caches = [KVCache(CFG, 12, 4, kv_dtype or dtype, torch.device("cpu")) for _ in range(2)]
    rope = Rope(CFG, 64, dtype, torch.device("cpu"))
    heads = (CFG.num_heads, CFG.num_kv_heads, CFG.head_dim)
    native = NativeOps(NativeKernels.load(), caches[0], [rope, rope], heads, CFG.rms_norm_eps)
    torch_ops = TorchOps(caches[1], [rope, rope], heads, CFG.rms_norm_eps)
    return gen, native, torch_ops, caches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 40])  # 40 rows take the parallel path
def test_add_rms_norm(dtype, rows):
    gen, native, ref, _ = both(dtype)
    x = torch.randn(rows, 96, generator=gen).to(dtype)
    delta = torch.randn(rows, 96, generator=gen).to(dtype)
    w = torch.rand(96, generator=gen).to(dtype) + 0.5
    for d in (None, delta):
        xa, xb = x.clone(), x.clone()
        oa, ob = torch.empty_like(x), torch.empty_like(x)
        native.add_rms_norm(xa, d, w, oa)
        ref.add_rms_norm(xb, d, w, ob)
        assert torch.equal(xa, xb)  # the residual add rounds exactly as torch's
        torch.testing.assert_close(oa.float(), ob.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul(dtype):
    gen, native, ref, _ = both(dtype)
    gu = (torch.randn(9, 320, generator=gen) * 3).to(dtype)
    oa, ob = torch.empty(9, 160, dtype=dtype), torch.empty(9, 160, dtype=dtype)
    native.silu_mul(gu, oa)
    ref.silu_mul(gu, ob)
    torch.testing.assert_close(oa.float(), ob.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize(
    "dtype, kv_dtype", [(torch.float32, None), (torch.bfloat16, None), (torch.float32, torch.float16)]
)
def test_rope_and_cache_write(dtype, kv_dtype):
    """A float16 cache under float32 activations: each value rounded to nearest even, as torch's
    conversion does."""
    gen, native, ref, (ca, cb) = both(dtype, kv_dtype)
    T, width = 5, (6 + 2 * 2) * 16
    qkv = torch.randn(T, width, generator=gen).to(dtype)
    positions = torch.tensor([0, 3, 17, 40, 63])
    blocks, offsets = torch.tensor([1, 1, 4, 7, 11]), torch.tensor([0, 3, 2, 1, 3])
    qa, qb = qkv.clone(), qkv.clone()
    native.rope_cache(1, qa, positions, (blocks, offsets))
    ref.rope_cache(1, qb, positions, (blocks, offsets))
    torch.testing.assert_close(qa.float(), qb.float(), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(ca.k.float(), cb.k.float(), atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.equal(ca.v, cb.v)  # values are copied, not transformed
    assert ca.k[0].abs().sum() == 0 and ca.nonzero_blocks() == {1, 4, 7, 11}  # only layer 1, only those blocks
