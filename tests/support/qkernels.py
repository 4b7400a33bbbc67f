"""The quantized-matmul library for kernel tests: loaded once, the instruction sets this CPU runs,
and a skip mark for a tree without the native build."""

from __future__ import annotations

import pytest

from traceless.model.layers.kernels import KernelUnavailable
from traceless.model.layers.qkernels import Isa, QuantKernels

try:
    KERNELS: QuantKernels | None = QuantKernels.load()
except KernelUnavailable:  # pragma: no cover - the native library is part of the install
    KERNELS = None

NEEDS_KERNELS = pytest.mark.skipif(KERNELS is None, reason="native kernels not built")
ISAS = [i for i in (Isa.PORTABLE, Isa.AVX2, Isa.AVX512) if KERNELS is not None and i <= KERNELS.isa]
