"""Triton compiles a kernel once per specialization of its launch arguments (pointer alignment,
integers equal to 1 or divisible by 16). The step metadata's views sit at offsets that change with
the batch: if that changed the specialization, a serving engine would compile new kernels at new
batch shapes long after warm-up (hundreds of milliseconds each, on the step path). Here the CUDA
path's packing runs on a CPU for many batch shapes, and every launch's specialization is compared."""

from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from tests.support.triton_keys import LaunchRecorder  # noqa: E402
from traceless.model.layers import triton_kernels as tk  # noqa: E402
from traceless.runner.batch import BatchBuilder, SeqInput  # noqa: E402

NH, NKV, D, BS = 8, 2, 16, 4


def _batches():
    """Decode batches of 1..40 sequences and mixes of prefill chunks and decode rows."""
    rng = random.Random(5)
    for n in range(1, 41):
        yield [SeqInput(list(range(1, 40)), rng.randrange(1, 150), [7], 1) for _ in range(n)]
    for _ in range(30):
        yield [
            SeqInput(list(range(1, 40)), rng.randrange(0, 100), [7] * rng.randrange(1, 50), rng.randrange(0, 2))
            for _ in range(rng.randrange(1, 6))
        ]


def _launch(builder: BatchBuilder, seqs: list[SeqInput], k: torch.Tensor, v: torch.Tensor) -> None:
    """What the decoder's Triton ops launch for one step (triton_ops.py), on the packed views."""
    batch = builder.build(seqs)
    meta, pb = batch.meta, batch.meta.paged
    T = batch.input_ids.shape[0]
    qkv = torch.zeros(T, (NH + 2 * NKV) * D)
    angles = torch.zeros(256, D // 2)
    tk.rope_cache(qkv, (NH, NKV, D), angles, angles, batch.positions, meta.slots, k[0], v[0])
    q = qkv[:, : NH * D].view(T, NH, D)
    out = q.new_empty(T, NH, D)
    for sms in (0, 132):
        tk.paged_attention(q, k[0], v[0], out, pb.block_tables, pb.cu_q, pb.context_lens, meta.scale, pb.max_q, sms)
    builder.scrub()


def test_no_new_specialization_at_new_batch_shapes(monkeypatch):
    kernels = {
        name: LaunchRecorder(getattr(tk, name))
        for name in ("_paged_attention_kernel", "_combine_kernel", "_rope_cache_kernel")
    }
    for name, rec in kernels.items():
        monkeypatch.setattr(tk, name, rec)
    builder = BatchBuilder(BS, torch.device("cpu"), False, D**-0.5, paged=True)
    k = torch.zeros(2, 64, NKV, D, BS)
    v = torch.zeros(2, 64, NKV, BS, D)
    for seqs in _batches():
        _launch(builder, seqs, k, v)
    for name, rec in kernels.items():
        variants = {tuple(s for s in key if s[0] != "constexpr") for key in rec.keys}
        assert len(rec.keys) > 10 and len(variants) == 1, (name, variants)
    # the constexprs: a decode tile with 1 to 16 key splits, a prefill tile unsplit (all compiled at
    # start: the graph capture's ladder meets every split count, the profiling pass the prefill tile)
    tiles = {(dict(c)["BLOCK_M"], dict(c)["SPLITS"]) for c in _constexprs(kernels["_paged_attention_kernel"])}
    assert tiles == {(16, 1), (16, 2), (16, 4), (16, 8), (16, 16), (64, 1)}


def _constexprs(rec: LaunchRecorder) -> set[tuple]:
    names = ("BLOCK_M", "SPLITS")
    return {tuple((n, key[rec.index[n]][1]) for n in names) for key in rec.keys}
