"""ctypes binding of the native CPU kernels in csrc/kernels.c.

The library is built by `pip install` (setup.py) as `traceless/model/layers/_kernels*.so`. It is not a
Python extension module: we find its file with `find_spec` and open it with ctypes. torch is
imported first so that the library's libgomp.so.1 resolves to torch's already-loaded copy and both
share one OpenMP thread pool.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from dataclasses import dataclass

import torch

ABI_VERSION = 10
# TRACELESS_CPU_TEAM (csrc/team.c): the kernels' threads; "auto" goes single-threaded while the
# CPUs are oversubscribed, "all" and "one" fix the count (for measurements)
TEAM_SETTINGS = ("auto", "all", "one")
_P, _L, _I, _F = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float


class _AttnShape(ctypes.Structure):
    _fields_ = [
        ("num_seqs", ctypes.c_int),
        ("num_heads", ctypes.c_int),
        ("num_kv_heads", ctypes.c_int),
        ("head_dim", ctypes.c_int),
        ("block_size", ctypes.c_int),
        ("max_blocks", ctypes.c_int),
        ("scale", ctypes.c_float),
        ("q_stride", ctypes.c_long),
        ("window", ctypes.c_int),
        ("softcap", ctypes.c_float),
        ("sinks", ctypes.c_void_p),
    ]


class _RopeShape(ctypes.Structure):
    _fields_ = [
        ("rows", ctypes.c_long),
        ("num_heads", ctypes.c_int),
        ("num_kv_heads", ctypes.c_int),
        ("head_dim", ctypes.c_int),
        ("block_size", ctypes.c_int),
    ]


class KernelUnavailable(RuntimeError):
    """The native kernel library is missing or does not match this version of traceless."""


@dataclass(frozen=True, slots=True)
class PagedAttentionArgs:
    """Tensors of one paged-attention call (all on CPU). q, out and the caches share a dtype
    (float32, bfloat16), or q and out are float32 over a float16 cache.

    q:             [num_tokens, num_heads, head_dim] rows, row stride `q.stride(0)` (may be a view of qkv)
    out:           [num_tokens, num_heads, head_dim] contiguous
    k_cache:       [num_blocks, num_kv_heads, head_dim, block_size]  (transposed)
    v_cache:       [num_blocks, num_kv_heads, block_size, head_dim]
    block_tables:  [num_seqs, max_blocks] int32
    cu_q:          [num_seqs + 1] int32, query row offsets
    context_lens:  [num_seqs] int32, keys per sequence including its new tokens
    window:        keys each query sees, itself included (sliding-window layers); 0: all
    softcap:       scores -> softcap * tanh(score / softcap) before the softmax; 0: none
    sinks:         [num_heads] float32 contiguous, a logit per head joining each softmax (gpt-oss); None: none
    """

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    cu_q: torch.Tensor
    context_lens: torch.Tensor
    out: torch.Tensor
    scale: float
    window: int = 0
    softcap: float = 0.0
    sinks: torch.Tensor | None = None


_SUFFIX = {torch.bfloat16: "bf16", torch.float32: "f32"}
# (activations, KV cache) -> the attention and RoPE-cache kernels' suffix: the cache holds the
# activations' dtype, or float16 under float32 activations (--kv-cache-dtype float16)
_KV_SUFFIX = {
    (torch.bfloat16, torch.bfloat16): "bf16",
    (torch.float32, torch.float32): "f32",
    (torch.float32, torch.float16): "f32h",
}


class NativeKernels:
    def __init__(self, lib: ctypes.CDLL):
        if lib.tl_abi_version() != ABI_VERSION:
            raise KernelUnavailable("native kernel library is stale; reinstall traceless (pip install -e .)")
        team = os.environ.get("TRACELESS_CPU_TEAM", "auto")
        if team not in TEAM_SETTINGS:
            raise KernelUnavailable(f"TRACELESS_CPU_TEAM must be one of {', '.join(TEAM_SETTINGS)}, not {team!r}")
        self._lib = lib
        self._attn, self._norm, self._silu, self._rope = {}, {}, {}, {}
        for dtype, sfx in _SUFFIX.items():
            self._norm[dtype] = self._fn(f"tl_add_rms_norm_{sfx}", [_P, _P, _P, _P, _L, _I, _F], None)
            self._silu[dtype] = self._fn(f"tl_silu_mul_{sfx}", [_P, _P, _L, _I], None)
        self._argmax = self._fn("tl_argmax_f32", [_P, _L, _L, _P], None)
        for pair, sfx in _KV_SUFFIX.items():
            self._attn[pair] = self._fn(f"tl_paged_attention_{sfx}", [ctypes.POINTER(_AttnShape)] + [_P] * 7, _I)
            self._rope[pair] = self._fn(f"tl_rope_cache_{sfx}", [ctypes.POINTER(_RopeShape)] + [_P] * 8, None)

    def _fn(self, name, argtypes, restype):
        fn = getattr(self._lib, name)
        fn.argtypes = argtypes
        fn.restype = restype
        return fn

    @classmethod
    def load(cls) -> NativeKernels:
        spec = importlib.util.find_spec("traceless.model.layers._kernels")
        if spec is None or spec.origin is None:
            raise KernelUnavailable(
                "native kernels are not built; install traceless with `pip install -e .` (needs a C compiler)"
            )
        try:
            return cls(ctypes.CDLL(spec.origin))
        except OSError as exc:
            raise KernelUnavailable(f"cannot load native kernels: {exc}") from None

    def supports(self, dtype: torch.dtype, kv_dtype: torch.dtype | None = None) -> bool:
        """Whether the kernels run activations of `dtype` over a KV cache of `kv_dtype` (default: the same)."""
        return dtype in _SUFFIX and (dtype, kv_dtype or dtype) in _KV_SUFFIX

    def _kv_kernel(self, table: dict, dtype: torch.dtype, kv_dtype: torch.dtype):
        fn = table.get((dtype, kv_dtype))
        if fn is None:
            raise ValueError(f"no native kernel for {dtype} activations over a {kv_dtype} KV cache")
        return fn

    def scrub_pool_stacks(self) -> None:
        """Clear the dead stack of every thread of the calling thread's OpenMP team (csrc/
        pool_stacks.c): what the kernels and torch's CPU operators computed there from a request."""
        if self._fn("tl_scrub_pool_stacks", [], _I)() != 0:
            raise RuntimeError("could not clear the OpenMP worker threads' dead stacks")

    def pool_stack_bounds(self, cap: int = 256) -> list[tuple[int, int]]:
        """[low, high) of each thread's stack in the calling thread's OpenMP team (for tests)."""
        low, high = (ctypes.c_size_t * cap)(), (ctypes.c_size_t * cap)()
        n = self._fn("tl_pool_stack_bounds", [_P, _P, _I], _I)(low, high, cap)
        return [(low[i], high[i]) for i in range(min(n, cap))]

    def uses_avx512(self) -> bool:
        """Whether the AVX-512 paths run: this CPU has them and TRACELESS_CPU_ISA=avx2 does not cap them."""
        return bool(self._fn("tl_uses_avx512", [], _I)())

    def paged_attention(self, a: PagedAttentionArgs) -> None:
        num_seqs, max_blocks = a.block_tables.shape
        _, num_kv_heads, block_size, head_dim = a.v_cache.shape
        shape = _AttnShape(
            num_seqs,
            a.q.shape[1],
            num_kv_heads,
            head_dim,
            block_size,
            max_blocks,
            a.scale,
            a.q.stride(0),
            a.window,
            a.softcap,
            None if a.sinks is None else a.sinks.data_ptr(),
        )
        if a.v_cache.dtype != a.k_cache.dtype or a.out.dtype != a.q.dtype:
            raise ValueError("paged attention: K and V share a dtype, and so do q and out")
        rc = self._kv_kernel(self._attn, a.q.dtype, a.k_cache.dtype)(
            ctypes.byref(shape),
            a.q.data_ptr(),
            a.k_cache.data_ptr(),
            a.v_cache.data_ptr(),
            a.block_tables.data_ptr(),
            a.cu_q.data_ptr(),
            a.context_lens.data_ptr(),
            a.out.data_ptr(),
        )
        if rc != 0:
            raise MemoryError("paged attention could not allocate its scratch memory")

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, out: torch.Tensor, eps: float
    ) -> None:
        """x += delta (when given), then out = rms_norm(x) * weight. x, delta, out: [T, H] contiguous."""
        rows, h = x.shape
        self._norm[x.dtype](
            x.data_ptr(), None if delta is None else delta.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, h, eps
        )

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        """torch.argmax(x, dim=-1) for a contiguous float32 [rows, cols] CPU tensor (the same
        answer: first index of the largest value, the first NaN where a row has one), [rows] int64."""
        if x.dtype != torch.float32 or x.dim() != 2 or not x.is_contiguous() or x.device.type != "cpu":
            raise ValueError("argmax takes a contiguous float32 [rows, cols] CPU tensor")
        rows, cols = x.shape
        if cols < 1:
            raise ValueError("argmax of an empty row")
        out = torch.empty(rows, dtype=torch.int64)
        self._argmax(x.data_ptr(), rows, cols, out.data_ptr())
        return out

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> None:
        """out[T, I] = silu(gate_up[:, :I]) * gate_up[:, I:]."""
        rows, i = out.shape
        self._silu[out.dtype](gate_up.data_ptr(), out.data_ptr(), rows, i)

    def rope_cache(
        self,
        qkv: torch.Tensor,
        heads: tuple[int, int, int],
        cos: torch.Tensor,
        sin: torch.Tensor,
        positions: torch.Tensor,
        slots: tuple[torch.Tensor, torch.Tensor],
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> None:
        """RoPE in place on the q and k parts of qkv [T, (nh + 2 nkv) D], then k, v into the cache.
        heads = (nh, nkv, D); cos/sin float32 [P, D/2]; positions, slot blocks/offsets int64 [T]."""
        nh, nkv, d = heads
        shape = _RopeShape(qkv.shape[0], nh, nkv, d, v_cache.shape[2])
        if v_cache.dtype != k_cache.dtype:
            raise ValueError("the K and V caches share a dtype")
        self._kv_kernel(self._rope, qkv.dtype, k_cache.dtype)(
            ctypes.byref(shape),
            qkv.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            positions.data_ptr(),
            slots[0].data_ptr(),
            slots[1].data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
        )
