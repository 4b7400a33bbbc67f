"""The quantized-weight kernels equal dequantize-then-matmul on random blocks of every format, on
every instruction-set path this CPU has (AVX-512 VNNI, AVX2, portable).

Tolerance: the kernels quantize activations per block of 32 to int8 and the reference applies the
same rounding (tests/support/qref.py), so what is left is float summation order: |ours - ref| <=
1e-4 * (|W| |x|) + 1e-6 per output. Against the unquantized activations the int8 rounding bounds
the error by 0.5 / 127 of each block's max|x| per element: checked with 1% of |W| |x|."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.ggml_raw import random_tensor
from tests.support.qkernels import ISAS, KERNELS, NEEDS_KERNELS
from tests.support.qref import quantize_activations, reference_matmul
from traceless.model.layers.qkernels import Isa
from traceless.model.layers.quant import (
    QFormat,
    QuantTensor,
    ggml_blocks,
    quantize_q4_0,
    quantize_q8_0,
    to_kernel_layout,
)

pytestmark = NEEDS_KERNELS


def _weights(fmt: QFormat, rows: int, cols: int, seed: int) -> QuantTensor:
    base = fmt.name.removesuffix("_ROWS")
    raw = random_tensor(base, rows, cols, np.random.default_rng(seed), scale=0.02)
    w = QuantTensor(QFormat[base], (rows, cols), torch.from_numpy(raw))
    out = to_kernel_layout(w) if fmt.name.endswith("_ROWS") else w
    assert out.fmt == fmt
    return out


@pytest.mark.parametrize("fmt", [QFormat.Q4_0, QFormat.Q4_1])
def test_row_split_layout_is_the_same_bytes(fmt):
    w = _weights(fmt, 5, 128, seed=2)
    split = to_kernel_layout(w)
    assert split.fmt.name == fmt.name + "_ROWS" and split.nbytes == w.nbytes
    assert torch.equal(ggml_blocks(split).blocks, w.blocks)
    assert to_kernel_layout(_weights(fmt, 5, 96, seed=2)).fmt == fmt  # odd block count: kept as it is


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize("fmt", list(QFormat), ids=lambda f: f.name)
@pytest.mark.parametrize("T", [1, 3, 9, 37])
def test_matmul_equals_dequantize_then_matmul(fmt, isa, T):
    torch.manual_seed(T)
    w = _weights(fmt, 37, 512, seed=fmt.value)  # 37 rows: a partial row chunk; 512: two super-blocks
    x = torch.randn(T, 512) * 3
    out = torch.empty(T, 37)
    KERNELS.matmul(x, w, out, isa=isa)
    ref, scale = reference_matmul(x, w)
    assert torch.all((out.double() - ref).abs() <= 1e-4 * scale + 1e-6)
    plain = x.double() @ w.dequantize().double().T
    assert torch.all((out.double() - plain).abs() <= 0.01 * (x.double().abs() @ w.dequantize().double().abs().T))


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
def test_bfloat16_in_and_out_bias_and_column_slices(isa):
    w = _weights(QFormat.Q4_1, 20, 64, seed=9)
    x = torch.randn(5, 64).to(torch.bfloat16)
    bias = torch.randn(20)
    wide = torch.zeros(5, 50, dtype=torch.bfloat16)
    KERNELS.matmul(x, w, wide[:, 10:30], bias=bias, isa=isa)
    ref, scale = reference_matmul(x.float(), w)
    got = wide[:, 10:30].double()
    assert torch.all((got - (ref + bias.double())).abs() <= 1e-2 * (scale + bias.double().abs()) + 1e-2)
    assert torch.all(wide[:, :10] == 0) and torch.all(wide[:, 30:] == 0)


@pytest.mark.parametrize("fmt", list(QFormat), ids=lambda f: f.name)
def test_embedding_rows_equal_the_dequantized_rows_to_the_bit(fmt):
    w = _weights(fmt, 30, 256, seed=3)
    ids = torch.tensor([0, 29, 7, 7, 12])
    assert torch.equal(w.dequantize(), ggml_blocks(w).dequantize())
    got = KERNELS.embed(w, ids, torch.float32)
    assert torch.equal(got.view(torch.int32), w.dequantize()[ids].view(torch.int32))
    whole = KERNELS.dequantize(w, torch.float32)
    assert torch.equal(whole.view(torch.int32), w.dequantize().view(torch.int32))
    assert torch.equal(KERNELS.dequantize(w, torch.bfloat16), w.dequantize().to(torch.bfloat16))


def test_embedding_refuses_ids_out_of_range():
    w = _weights(QFormat.Q8_0, 4, 32, seed=1)
    with pytest.raises(ValueError, match="range"):
        KERNELS.embed(w, torch.tensor([4]), torch.float32)


@pytest.mark.parametrize("quantize,fmt", [(quantize_q8_0, "Q8_0"), (quantize_q4_0, "Q4_0")])
def test_load_time_quantizers_write_ggmls_blocks(quantize, fmt):
    from gguf import GGMLQuantizationType, quants

    w = torch.randn(24, 96) * 2
    ours = quantize(w)
    want = quants.quantize(w.numpy(), GGMLQuantizationType[fmt])
    assert np.array_equal(ours.blocks.numpy(), want)


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize("fmt", [QFormat.Q4_0_ROWS, QFormat.Q4_1_ROWS, QFormat.Q8_0], ids=lambda f: f.name)
@pytest.mark.parametrize("K", [64, 576, 1536])
def test_row_lengths_with_partial_scale_groups(fmt, isa, K):
    """576 = 18 blocks: one group of 16 scales and a partial one (masked loads)."""
    w = _weights(fmt, 19, K, seed=K)
    x = torch.randn(5, K)
    out = torch.empty(5, 19)
    KERNELS.matmul(x, w, out, isa=isa)
    ref, scale = reference_matmul(x, w)
    assert torch.all((out.double() - ref).abs() <= 1e-4 * scale + 1e-6)


@pytest.mark.parametrize("cap,want", [("avx2", Isa.AVX2), ("portable", Isa.PORTABLE)])
def test_the_isa_cap_lowers_the_path_and_refuses_calls_above_it(cap, want):
    import os
    import subprocess
    import sys

    code = (
        "import torch\nfrom traceless.model.layers.qkernels import QuantKernels, Isa\n"
        "from traceless.model.layers.quant import quantize_q8_0\n"
        "k = QuantKernels.load(); print(int(k.isa))\n"
        "w = quantize_q8_0(torch.ones(2, 32))\n"
        "try:\n    k.matmul(torch.ones(1, 32), w, torch.empty(1, 2), isa=Isa.AVX512)\n"
        "except ValueError:\n    print('refused')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(TRACELESS_CPU_ISA=cap, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    lines = out.stdout.split()
    assert int(lines[0]) == min(want, KERNELS.isa)
    assert lines[1:] == (["refused"] if min(want, KERNELS.isa) < Isa.AVX512 else [])


@pytest.mark.parametrize("isa", ISAS, ids=lambda i: i.name)
@pytest.mark.parametrize("fmt", list(QFormat), ids=lambda f: f.name)
def test_a_rows_result_is_the_same_bits_whatever_the_rows_beside_it(fmt, isa):
    """Batch invariance: row t of x W^T is computed alike in a call of 1, 6 or 70 rows and at any
    position among them (576 columns: a last group of 2 blocks beside a whole one of 16)."""
    K = 256 * 3 if fmt.name.endswith("_K") else 576
    torch.manual_seed(fmt.value)
    w = _weights(fmt, 21, K, seed=5)
    x = torch.randn(70, K) * 2
    whole = torch.empty(70, 21)
    KERNELS.matmul(x, w, whole, isa=isa)
    ref, scale = reference_matmul(x, w)
    assert torch.all((whole.double() - ref).abs() <= 1e-4 * scale + 1e-6)
    for rows in ([13], [69, 2, 40, 41, 7, 0], list(range(69, -1, -1))):
        part = torch.empty(len(rows), 21)
        KERNELS.matmul(x[rows].contiguous(), w, part, isa=isa)
        assert torch.equal(part.view(torch.int32), whole[rows].view(torch.int32))


@pytest.mark.parametrize("fmt", [QFormat.Q4_0_ROWS, QFormat.Q4_1_ROWS], ids=lambda f: f.name)
@pytest.mark.parametrize("K", [64, 576, 832, 960, 1536])
def test_row_split_q4_gives_the_same_bits_on_avx2_and_avx512(fmt, K):
    """Both SIMD paths run the same lanes in the same order: a model's numbers do not depend on
    which of the two machines serves it. K: a last partial group of 2, 10 or 14 blocks (alone for
    64), none for 1536."""
    if KERNELS.isa < Isa.AVX512:
        pytest.skip("this CPU has no AVX-512 VNNI")
    torch.manual_seed(3)
    w = _weights(fmt, 19, K, seed=8)
    x = torch.randn(9, K)
    a, b = torch.empty(9, 19), torch.empty(9, 19)
    KERNELS.matmul(x, w, a, isa=Isa.AVX512)
    KERNELS.matmul(x, w, b, isa=Isa.AVX2)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def _one_hot_rows(fmt: str, K: int) -> QuantTensor:
    """K rows, row n a block scale of 1 and code 1 at column n, every other value 0: row n of
    x W^T is the quantized activation n itself, d_a * q_a, one exact product."""
    nb = K // 32
    one = np.array([1.0], dtype=np.float16).view(np.uint8)
    if fmt == "Q8_0":
        blocks = np.zeros((K, nb, 34), dtype=np.uint8)
        blocks[:, :, 0:2] = one
        for n in range(K):
            blocks[n, n // 32, 2 + n % 32] = 1
        return QuantTensor(QFormat.Q8_0, (K, K), torch.from_numpy(blocks.reshape(K, -1)))
    blocks = np.zeros((K, nb, 20), dtype=np.uint8)
    blocks[:, :, 0:2] = one  # d = 1, m = 0
    for n in range(K):
        i = n % 32
        blocks[n, n // 32, 4 + i % 16] = 1 << (4 * (i // 16))
    return to_kernel_layout(QuantTensor(QFormat.Q4_1, (K, K), torch.from_numpy(blocks.reshape(K, -1))))


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_1"])
@pytest.mark.parametrize("K", [64, 576, 1536])
def test_every_path_quantizes_the_activations_to_the_same_bits(fmt, K):
    """The activations' int8 codes and scales (the SIMD quantizer's and the portable one's, in each
    layout) read back through one-hot weights: the same bits on every path, and the reference's
    codes."""
    w = _one_hot_rows(fmt, K)
    torch.manual_seed(K)
    x = torch.randn(3, K) * torch.logspace(-3, 3, K)
    x[1, :32] = 0  # a block of zeros: d = 0
    outs = []
    for isa in ISAS:
        out = torch.empty(3, K)
        KERNELS.matmul(x, w, out, isa=isa)
        outs.append(out)
    for out in outs[1:]:
        assert torch.equal(out.view(torch.int32), outs[0].view(torch.int32))
    # d = max|x| / 127 is compiled as a multiply by 1 / 127 (fast math): one float32 step off the
    # reference's division at most, where a code off by one would be 1 / 127 of the value
    ref = quantize_activations(x)
    assert torch.allclose(outs[0], ref, rtol=3e-7, atol=0)
