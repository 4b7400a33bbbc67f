"""KV groups on the CUDA path's packing: every group's slots and block tables travel in the one
packed buffer (step_meta.py), and the Triton attention reading them equals the torch attention
reading the CPU path's metadata. On a CPU Triton runs under its interpreter."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from traceless.model.config import ModelConfig  # noqa: E402
from traceless.model.layers.attention import PagedAttention  # noqa: E402
from traceless.model.layers.kv_cache import KVCache  # noqa: E402
from traceless.model.layers.triton_ops import TritonAttention  # noqa: E402
from traceless.runner.batch import BatchBuilder, SeqInput  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
WINDOWS = (8, 0, 8, 0)  # local and global layers alternate: groups (global, local), one slot each... x2
CFG = ModelConfig(
    architecture="gemma2",
    vocab_size=100,
    hidden_size=64,
    intermediate_size=64,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=128,
    tie_word_embeddings=True,
    qkv_bias=False,
    layer_windows=WINDOWS,
)
BS = 4


def _seqs() -> list[SeqInput]:
    """Three sequences: a decode row and two chunks, each past the window; the local tables hold
    the null block below the window, as the KV manager leaves them."""
    out, next_block = [], 1
    for start, n in ((21, 1), (13, 6), (30, 3)):
        blocks = -(-(start + n) // BS)
        table = list(range(next_block, next_block + blocks))
        next_block += blocks
        dead = max(0, start - 8 + 1) // BS
        local = [0] * dead + list(range(next_block, next_block + blocks - dead))
        next_block += blocks - dead
        out.append(SeqInput(table, start, [7] * n, 1, group_tables=(local,)))
    return out


def test_triton_attention_reads_each_groups_tables_as_the_cpu_path_does():
    assert CFG.kv_groups.windows == (0, 8) and CFG.kv_groups.num_slots == 2
    gen = torch.Generator().manual_seed(0)
    cache = KVCache(CFG, 64, BS, torch.float32, DEV)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    cache.zero_blocks([0])  # the null block stays zero
    seqs = _seqs()
    heads = (CFG.num_heads, CFG.num_kv_heads, CFG.head_dim)
    paged = BatchBuilder(BS, DEV, False, 0.25, paged=True, window=8).build(seqs)
    plain = BatchBuilder(BS, DEV, False, 0.25, window=8).build(seqs)
    assert len(paged.meta.groups) == len(plain.meta.groups) == 1
    # the local group's slots are its own blocks, not the global group's
    assert not torch.equal(paged.meta.group(1).slots[0], paged.meta.slots[0])
    assert torch.equal(paged.meta.group(1).slots[0].long(), plain.meta.group(1).slots[0].long())
    T = paged.input_ids.shape[0]
    qkv = torch.randn(T, (4 + 2 * 2) * 16, generator=gen).to(DEV)
    triton, ref = TritonAttention(cache, heads, WINDOWS), PagedAttention(cache, None, heads, WINDOWS)
    for layer in range(4):
        g = CFG.kv_groups.layer_group[layer]
        got = triton(layer, qkv, paged.meta.group(g))
        want = ref(layer, qkv, plain.meta.group(g))
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
