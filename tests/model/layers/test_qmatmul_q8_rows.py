"""Row-split Q8_0 (`Q8_0_ROWS`, the layout Q8_0 weights are held in: the built-in model's tied
embedding and LM head) against dequantize-then-matmul, on every instruction-set path this CPU has.

Row lengths: 16 blocks a step, so 576 columns (18 blocks) is one whole group and a tail of 2,
544 (17) a tail of one block (the last pair half masked), 992 (31) a tail of 15, 1536 (48) whole
groups only, 96 (3) a tail only. The random blocks hold every code byte, -128 included, and
scales of both signs.

Tolerance, as for the other formats (tests/support/qref.py applies the kernels' activation
rounding): |ours - ref| <= 1e-4 * (|W| |x|) + 1e-6 per output, the float summation order left."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.ggml_raw import random_tensor
from tests.support.qkernels import ISAS, KERNELS, NEEDS_KERNELS
from tests.support.qref import reference_matmul
from traceless.model.layers.qkernels import Isa
from traceless.model.layers.quant import QFormat, QuantTensor, ggml_blocks, quantize_q8_0, to_kernel_layout

pytestmark = NEEDS_KERNELS
COLS = [64, 96, 544, 576, 992, 1536]


def _q8(rows: int, cols: int, seed: int) -> tuple[QuantTensor, QuantTensor]:
    """(GGML Q8_0 blocks, the same in the row-split layout) of random bytes."""
    raw = random_tensor("Q8_0", rows, cols, np.random.default_rng(seed), scale=0.02)
    w = QuantTensor(QFormat.Q8_0, (rows, cols), torch.from_numpy(raw))
    return w, to_kernel_layout(w)


@pytest.mark.parametrize("cols", COLS)
def test_the_layout_holds_the_same_blocks_in_the_same_bytes(cols):
    w, split = _q8(7, cols, seed=cols)
    assert split.fmt == QFormat.Q8_0_ROWS and split.nbytes == w.nbytes
    assert torch.equal(ggml_blocks(split).blocks, w.blocks)
    assert torch.equal(split.dequantize(), w.dequantize())


def test_load_time_quantization_lands_in_the_row_split_layout():
    w = torch.randn(5, 96)
    split = to_kernel_layout(quantize_q8_0(w))
    assert split.fmt == QFormat.Q8_0_ROWS
    assert torch.equal(ggml_blocks(split).blocks, quantize_q8_0(w).blocks)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("T", [1, 3, 4, 5, 17])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_matmul_equals_dequantize_then_matmul(isa, cols, T, with_bias):
    torch.manual_seed(T * 7 + cols)
    _, w = _q8(23, cols, seed=cols + T)  # 23 rows: a partial tile of 4 and a partial chunk of 16
    x = torch.randn(T, cols) * 3
    bias = torch.randn(23) if with_bias else None
    out = torch.empty(T, 23)
    KERNELS.matmul(x, w, out, bias=bias, isa=isa)
    ref, scale = reference_matmul(x, w)
    if bias is not None:
        ref = ref + bias.double()
    assert torch.all((out.double() - ref).abs() <= 1e-4 * scale + 1e-6)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize("cols", [544, 576, 992])
def test_a_rows_result_is_the_same_bits_alone_or_in_a_batch(isa, cols):
    torch.manual_seed(cols)
    _, w = _q8(21, cols, seed=5)
    x = torch.randn(17, cols) * 2
    whole = torch.empty(17, 21)
    KERNELS.matmul(x, w, whole, isa=isa)
    for t in range(17):
        one = torch.empty(1, 21)
        KERNELS.matmul(x[t : t + 1].contiguous(), w, one, isa=isa)
        assert torch.equal(one.view(torch.int32), whole[t : t + 1].view(torch.int32)), t


@pytest.mark.parametrize("cols", COLS)
def test_avx2_and_avx512_give_the_same_bits(cols):
    """Both SIMD paths run the same integer lanes and the same float steps in the same order."""
    if KERNELS.isa < Isa.AVX512:
        pytest.skip("this CPU has no AVX-512 VNNI")
    torch.manual_seed(3)
    _, w = _q8(19, cols, seed=8)
    x = torch.randn(9, cols)
    a, b = torch.empty(9, 19), torch.empty(9, 19)
    KERNELS.matmul(x, w, a, isa=Isa.AVX512)
    KERNELS.matmul(x, w, b, isa=Isa.AVX2)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("cols", COLS)
def test_extreme_codes_and_activations_stay_exact(cols):
    """Codes of -128 and 127 against activations of +-127 (the integer sums' largest magnitudes):
    every path equals the reference, so no int16 pair or int32 lane overflowed."""
    rows, nb = 8, cols // 32
    codes = torch.full((rows, nb, 32), -128, dtype=torch.int8)
    codes[1::2] = 127
    codes[2, :, ::2] = 127
    d = torch.full((rows, nb, 1), 0.01, dtype=torch.float16)
    blocks = torch.cat([d.view(torch.uint8), codes.view(torch.uint8)], dim=2).reshape(rows, -1)
    w = to_kernel_layout(QuantTensor(QFormat.Q8_0, (rows, cols), blocks))
    x = torch.ones(3, cols)
    x[1] = -1
    x[2, ::3] = -1
    ref, scale = reference_matmul(x, w)
    for isa in ISAS:
        out = torch.empty(3, rows)
        KERNELS.matmul(x, w, out, isa=isa)
        assert torch.all((out.double() - ref).abs() <= 1e-4 * scale + 1e-6), isa


@pytest.mark.parametrize("cols", COLS)
def test_embedding_rows_equal_the_q8_0_rows_to_the_bit(cols):
    w, split = _q8(30, cols, seed=3)
    ids = torch.tensor([0, 29, 7, 7, 12])
    got = KERNELS.embed(split, ids, torch.float32)
    assert torch.equal(got.view(torch.int32), KERNELS.embed(w, ids, torch.float32).view(torch.int32))
    assert torch.equal(got.view(torch.int32), w.dequantize()[ids].view(torch.int32))
    assert torch.equal(KERNELS.embed(split, ids, torch.bfloat16), w.dequantize()[ids].to(torch.bfloat16))
