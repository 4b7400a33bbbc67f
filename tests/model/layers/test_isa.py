"""The tests that compare our logprobs and ranks with transformers pass on both machine kinds: here
on the code path an AVX2-only machine runs (TRACELESS_CPU_ISA caps the native kernels, oneDNN and MKL
are capped by their own variables), whatever this machine has. The suite itself covers this
machine's own path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CAPPED = {"TRACELESS_CPU_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
RANK_TESTS = ["tests/runner/test_prompt_logprobs.py", "tests/server/test_echo_logprobs.py"]
# the AVX2 attention row kernels against their reference, and the fused forward on the AVX2 kernels
KERNEL_TESTS = [
    "tests/model/layers/test_kernels.py",
    "tests/model/layers/test_fused_decode.py::test_the_fused_forward_equals_the_per_call_path_to_the_bit",
]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return {**env, **CAPPED, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def test_the_cap_turns_the_avx512_paths_off():
    code = "from traceless.model.layers.kernels import NativeKernels as K; print(int(K.load().uses_avx512()))"
    out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"


@pytest.mark.parametrize("tests", [RANK_TESTS, KERNEL_TESTS], ids=["ranks", "kernels"])
def test_rank_logprob_and_kernel_tests_pass_on_the_avx2_path(tests):
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *tests],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:]
    assert " passed" in out.stdout and "failed" not in out.stdout


# Paged attention over random inputs (float32 and float16 caches, three head shapes, five
# sequences up to 333 keys); prints the outputs' raw bits, one hex string per shape
_ATTENTION_BITS = """
import torch
from traceless.model.layers.kernels import NativeKernels, PagedAttentionArgs
k = NativeKernels.load()
for kvd in (torch.float32, torch.float16):
    for nh, nkv, hd in [(9, 3, 64), (6, 2, 128), (8, 8, 32)]:
        g = torch.Generator().manual_seed(1)
        ctx = [1, 17, 100, 333, 64]
        nblk = max(-(-c // 16) for c in ctx)
        nb = len(ctx) * nblk + 1
        tables = torch.randperm(nb, generator=g)[: len(ctx) * nblk].view(len(ctx), nblk).to(torch.int32).contiguous()
        a = PagedAttentionArgs(
            torch.randn(len(ctx), nh, hd, generator=g) * 3,
            torch.randn(nb, nkv, hd, 16, generator=g).to(kvd),
            torch.randn(nb, nkv, 16, hd, generator=g).to(kvd),
            tables,
            torch.arange(len(ctx) + 1, dtype=torch.int32),
            torch.tensor(ctx, dtype=torch.int32),
            torch.empty(len(ctx), nh, hd),
            hd**-0.5,
        )
        k.paged_attention(a)
        print(a.out.numpy().tobytes().hex())
"""


def test_the_attention_rows_give_the_same_bits_on_avx2_and_avx512():
    """One body for both row kernels, the same operations lane by lane (scores, the softmax's
    exponentials, the value sums): a model's numbers do not depend on which machine serves it. The
    softmax's scalar sums once parted them, vectorized at each target's width when inlined."""
    from traceless.model.layers.kernels import KernelUnavailable, NativeKernels

    try:
        if not NativeKernels.load().uses_avx512():
            pytest.skip("this CPU has no AVX-512")
    except KernelUnavailable:
        pytest.skip("native kernels not built")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    run = [sys.executable, "-c", _ATTENTION_BITS]
    native = subprocess.run(run, env=env, capture_output=True, text=True, check=True).stdout.split()
    capped = subprocess.run(run, env=_env(), capture_output=True, text=True, check=True).stdout.split()
    assert len(native) == 6 and native == capped
