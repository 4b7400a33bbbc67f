"""The FP8 Linear: its CPU arithmetic against a matmul of dequantized operands, and on CUDA
torch._scaled_mm against that arithmetic (a `gpu` test)."""

from __future__ import annotations

import pytest
import torch

from tests.support.fp8 import decode_e4m3
from traceless.errors import ModelLoadError
from traceless.model.fp8 import convert
from traceless.model.fp8.linear import Fp8Linear


def _operands(seed: int, T: int = 7, K: int = 96, N: int = 64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g) * torch.logspace(-2, 1, T)[:, None]  # rows of very different scale
    w = torch.randn(N, K, generator=g) / K**0.5
    return x, w, torch.randn(N, generator=g)


def _dequantized_reference(lin: Fp8Linear, x: torch.Tensor) -> torch.Tensor:
    """float64 matmul of the dequantized operands (decoded from the bytes by the format's definition)."""
    q, s = lin.quantize_input(x)
    xd = decode_e4m3(q) * s.double()
    wd = decode_e4m3(lin.weight) * lin.weight_scale.double().reshape(-1, 1)
    y = xd @ wd.T
    return y + lin.bias.double() if lin.bias is not None else y


def test_dynamic_fp8_linear_equals_the_dequantized_matmul():
    x, w, b = _operands(0)
    lin = Fp8Linear.from_weight(w, b, torch.float32)
    y = lin(x)
    assert y.dtype == torch.float32 and y.shape == (7, 64)
    torch.testing.assert_close(y.double(), _dequantized_reference(lin, x), rtol=1e-5, atol=1e-5)
    exact = x.double() @ w.double().T + b.double()  # and the FP8 error itself is small
    assert float((y.double() - exact).norm() / exact.norm()) < 0.05


def test_per_token_scales_make_a_token_independent_of_its_batch():
    x, w, _ = _operands(1, T=12)
    lin = Fp8Linear.from_weight(w, None, torch.float32)
    q, s = lin.quantize_input(x)
    q1, s1 = lin.quantize_input(x[4:5])
    assert torch.equal(q1.view(torch.uint8), q[4:5].view(torch.uint8)) and torch.equal(s1, s[4:5])
    torch.testing.assert_close(lin(x[4:5]), lin(x)[4:5], rtol=1e-6, atol=1e-6)  # (matmul rounding only)


def test_static_activation_scale():
    x, w, b = _operands(2)
    q, s = convert.quantize_per_channel(w)
    lin = Fp8Linear(q, s, b, torch.tensor([0.05]), torch.bfloat16)
    qx, sx = lin.quantize_input(x)
    assert torch.equal(sx, torch.full((7, 1), 0.05))
    y = lin(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), _dequantized_reference(lin, x), rtol=1e-2, atol=1e-2)  # bf16 output


@pytest.mark.parametrize(
    ("shape", "scale", "named"),
    [
        ((64, 90), torch.ones(64), "multiples of 16"),
        ((64, 96), torch.ones(1), "weight scale of shape"),
    ],
)
def test_misfit_weights_are_refused(shape, scale, named):
    with pytest.raises(ModelLoadError, match=named):
        Fp8Linear(torch.zeros(shape).to(convert.FP8), scale, None, None, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (FP8 matmuls: Hopper or later)")
def test_scaled_mm_on_cuda_matches_the_fp8_arithmetic():
    x, w, b = _operands(3, T=33, K=256, N=128)
    cpu = Fp8Linear.from_weight(w, b, torch.bfloat16)
    gpu = Fp8Linear.from_weight(w.cuda(), b.cuda(), torch.bfloat16)
    assert torch.equal(gpu.weight.cpu().view(torch.uint8), cpu.weight.view(torch.uint8))
    y = gpu(x.cuda().bfloat16())
    ref = _dequantized_reference(cpu, x.bfloat16())
    assert y.dtype == torch.bfloat16
    assert float((y.double().cpu() - ref).norm() / ref.norm()) < 1e-2  # bf16 output rounding
