"""Which attention backend runs for the one asked for, on each device type (the choice reads only
the device's type: CUDA's branch is checked without a GPU)."""

from __future__ import annotations

import pytest
import torch

from traceless.config import EngineConfig
from traceless.model.layers.kernels import KernelUnavailable, NativeKernels
from traceless.modes import AttentionBackend
from traceless.runner.build import _attention_backend

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def _resolved(asked: str, device: torch.device) -> AttentionBackend:
    return _attention_backend(EngineConfig(attention_backend=asked), device, torch.float32)


def test_each_device_refuses_the_others_kernels():
    with pytest.raises(ValueError, match="triton.*CUDA only"):
        _resolved("triton", CPU)
    with pytest.raises(ValueError, match="native.*CPU only"):
        _resolved("native", CUDA)


def test_torch_runs_where_it_is_asked_for():
    assert _resolved("torch", CPU) is AttentionBackend.TORCH
    assert _resolved("torch", CUDA) is AttentionBackend.TORCH


def test_auto_is_the_devices_own():
    pytest.importorskip("triton")
    assert _resolved("auto", CUDA) is AttentionBackend.TRITON
    assert _resolved("triton", CUDA) is AttentionBackend.TRITON
    try:
        NativeKernels.load()
        cpu_own = AttentionBackend.NATIVE
    except KernelUnavailable:
        cpu_own = AttentionBackend.TORCH  # a build without the C kernels
    assert _resolved("auto", CPU) is cpu_own
