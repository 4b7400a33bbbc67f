"""ctypes binding of the native CPU kernels in csrc/kernels.c.

The library is built by `pip install` (setup.py) as `traceless/runner/_kernels*.so`. It is not a
Python extension module: we find its file with `find_spec` and open it with ctypes. torch is
imported first so that the library's libgomp.so.1 resolves to torch's already-loaded copy and both
share one OpenMP thread pool.
"""
from __future__ import annotations

import ctypes
import importlib.util
from dataclasses import dataclass

import torch

ABI_VERSION = 1


class _AttnShape(ctypes.Structure):
    _fields_ = [
        ("num_seqs", ctypes.c_int),
        ("num_heads", ctypes.c_int),
        ("num_kv_heads", ctypes.c_int),
        ("head_dim", ctypes.c_int),
        ("block_size", ctypes.c_int),
        ("max_blocks", ctypes.c_int),
        ("scale", ctypes.c_float),
    ]


class KernelUnavailable(RuntimeError):
    """The native kernel library is missing or does not match this version of traceless."""


@dataclass(frozen=True, slots=True)
class PagedAttentionArgs:
    """Tensors of one paged-attention call (all on CPU, contiguous).

    q, out:        [num_tokens, num_heads, head_dim]      (bfloat16 or float32)
    k_cache:       [num_blocks, num_kv_heads, head_dim, block_size]  (transposed)
    v_cache:       [num_blocks, num_kv_heads, block_size, head_dim]
    block_tables:  [num_seqs, max_blocks] int32
    cu_q:          [num_seqs + 1] int32, query row offsets
    context_lens:  [num_seqs] int32, keys per sequence including its new tokens
    """

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    cu_q: torch.Tensor
    context_lens: torch.Tensor
    out: torch.Tensor
    scale: float


class NativeKernels:
    def __init__(self, lib: ctypes.CDLL):
        if lib.tl_abi_version() != ABI_VERSION:
            raise KernelUnavailable("native kernel library is stale; reinstall traceless (pip install -e .)")
        args = [ctypes.POINTER(_AttnShape)] + [ctypes.c_void_p] * 7
        self._fns = {}
        for dtype, name in ((torch.bfloat16, "tl_paged_attention_bf16"), (torch.float32, "tl_paged_attention_f32")):
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = ctypes.c_int
            self._fns[dtype] = fn
        self._lib = lib

    @classmethod
    def load(cls) -> "NativeKernels":
        spec = importlib.util.find_spec("traceless.runner._kernels")
        if spec is None or spec.origin is None:
            raise KernelUnavailable(
                "native kernels are not built; install traceless with `pip install -e .` (needs a C compiler)"
            )
        try:
            return cls(ctypes.CDLL(spec.origin))
        except OSError as exc:
            raise KernelUnavailable(f"cannot load native kernels: {exc}") from None

    def supports(self, dtype: torch.dtype) -> bool:
        return dtype in self._fns

    def paged_attention(self, a: PagedAttentionArgs) -> None:
        num_seqs, max_blocks = a.block_tables.shape
        _, num_kv_heads, block_size, head_dim = a.v_cache.shape
        shape = _AttnShape(num_seqs, a.q.shape[1], num_kv_heads, head_dim, block_size, max_blocks, a.scale)
        rc = self._fns[a.q.dtype](
            ctypes.byref(shape),
            a.q.data_ptr(), a.k_cache.data_ptr(), a.v_cache.data_ptr(),
            a.block_tables.data_ptr(), a.cu_q.data_ptr(), a.context_lens.data_ptr(), a.out.data_ptr(),
        )
        if rc != 0:
            raise MemoryError("paged attention could not allocate its scratch memory")
