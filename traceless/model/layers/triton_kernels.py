"""Triton kernels for the CUDA path: paged attention over the block tables, and the fused
element-wise work of a decoder layer (RMSNorm with the residual add, SiLU-and-mul, RoPE with the
KV-cache write).

Why Triton (docs/gpu.md): it ships with PyTorch's CUDA wheels, compiles at start (the warm-up and
graph capture run every kernel once), and needs no library built for this torch/CUDA pair. The
kernels also run on a CPU under TRITON_INTERPRET=1, which is how the suite checks them against a
PyTorch reference.

The KV cache keeps the CPU layout (kv_cache.py): per block and KV head, K is one contiguous
[D, BS] tile (already transposed for Q K^T) and V one contiguous [BS, D] tile, so the attention
kernel reads both in place through the block table: no gather, no padding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _softcap(s, cap):
    """cap * tanh(s / cap) (Gemma 2's attention soft-capping), tanh through the sigmoid."""
    return cap * (2.0 * tl.sigmoid(2.0 * s / cap) - 1.0)


@triton.jit
def _attend_tile(
    acc,
    m_i,
    l_i,
    q,
    q_pos,
    k_ptr,
    v_ptr,
    tbl_ptr,
    start,
    kv_end,
    scale,
    k_stride_b,
    v_stride_b,
    window,
    softcap,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    BS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    MASKED: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """Keys [start, start + BLOCK_N) of one sequence and KV head into the running softmax (acc
    [BLOCK_M, D_PAD], m_i, l_i [BLOCK_M]). start is a multiple of BLOCK_N (so of BS): a tile is
    BLOCK_N // BS whole blocks, and the offset of key n in its block is n % BS, known at compile
    time; K and V addresses are contiguous runs of BS (K) and D (V) elements, loaded 16 bytes at a
    time. k_ptr / v_ptr: the KV head's base; tbl_ptr: the sequence's block-table row.
    MASKED: the tile may hold keys at or past kv_end, after a query's position (the last tile, the
    causal diagonal) or below a query's window (window > 0: a query at p sees keys (p - window, p]);
    an unmasked tile has none of these and loads and scores without masks.
    SOFTCAP: scores are soft-capped (softcap * tanh(s / softcap)) before the mask and the softmax."""
    start = tl.multiple_of(start, BLOCK_N)
    n = tl.arange(0, BLOCK_N)
    kpos = start + n
    off = n % BS
    d = tl.arange(0, D_PAD)
    if MASKED:
        # Loads are masked by whole blocks (a mask constant over each run of BS keys keeps them
        # 16 bytes wide); the keys past kv_end inside the last block are cut from the scores.
        blk_ok = start + n // BS * BS < kv_end
        blk = tl.load(tbl_ptr + start // BS + n // BS, mask=blk_ok, other=0).to(tl.int64)
    else:
        blk = tl.load(tbl_ptr + start // BS + n // BS).to(tl.int64)
    # K tile [D_PAD, BLOCK_N]: block blk's [D, BS] tile, element (dim, offset) at dim * BS + offset.
    k_addr = k_ptr + blk[None, :] * k_stride_b + d[:, None] * BS + off[None, :]
    # V tile [BLOCK_N, D_PAD]: block blk's [BS, D] tile.
    v_addr = v_ptr + blk[:, None] * v_stride_b + off[:, None] * D + d[None, :]
    if MASKED:
        d_ok = d < D
        k_ok = kpos < kv_end
        k = tl.load(k_addr, mask=d_ok[:, None] & blk_ok[None, :], other=0.0)
        v = tl.load(v_addr, mask=blk_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.where(k_ok[:, None], v, 0.0)  # (weight 0 there; whatever the block holds past kv_end)
    elif D == D_PAD:
        k = tl.load(k_addr)
        v = tl.load(v_addr)
    else:
        d_ok = d < D
        k = tl.load(k_addr, mask=d_ok[:, None], other=0.0)
        v = tl.load(v_addr, mask=d_ok[None, :], other=0.0)
    s = tl.dot(q, k, input_precision=PRECISION) * scale  # [BLOCK_M, BLOCK_N]
    if SOFTCAP:
        s = _softcap(s, softcap)
    if MASKED:
        allowed = (kpos[None, :] <= q_pos[:, None]) & k_ok[None, :]
        allowed = allowed & ((window <= 0) | (kpos[None, :] > q_pos[:, None] - window))
        s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw no key yet
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=["tables_stride", "T", "window"])
def _paged_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    tables_ptr,
    cu_q_ptr,
    ctx_ptr,
    scale,
    q_stride_t,
    q_stride_h,
    o_stride_t,
    o_stride_h,
    k_stride_b,
    k_stride_h,
    v_stride_b,
    v_stride_h,
    tables_stride,
    part_ptr,
    ml_ptr,
    T,
    H,
    window,
    sinks_ptr,
    softcap,
    G: tl.constexpr,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    BS: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    SPLITS: tl.constexpr,
    SINKS: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """One program: sequence b, query tokens [qt * BLOCK_Q, (qt + 1) * BLOCK_Q) of it, KV head g
    with its G query heads. Rows of the tile are (token, head) pairs: row r = token r // G, head
    g * G + r % G, so one K/V tile serves all the query heads that share it (GQA).
    SPLITS > 1 (decode only: one query tile): program_id(1) is the split, which takes a slice of
    the keys and leaves its unnormalized output and (max, sum) in part/ml for _combine_kernel
    (flash-decoding: a short batch then fills the GPU).
    tables_stride and T vary with the batch: not specialized (no recompilation at new shapes).
    window > 0 (sliding-window layers): a query at position p sees keys (p - window, p]; the loop
    starts at the tile holding the lowest key the tile's first query sees, and the tiles that some
    of the tile's queries see only in part take the masked path, as the causal diagonal does.
    SINKS (gpt-oss): sinks_ptr [H] float32, a logit per head that joins each softmax and attends
    nothing: one more term of the denominator, added once at the end (here, or in _combine_kernel
    when the keys are split)."""
    b = tl.program_id(0)
    split = tl.program_id(1) if SPLITS > 1 else 0
    qt = tl.program_id(1) if SPLITS == 1 else 0
    g = tl.program_id(2)
    q_begin = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - q_begin
    if qt * BLOCK_Q >= q_len:
        return
    ctx = tl.load(ctx_ptr + b)  # keys of the sequence, this step's tokens included
    first_pos = ctx - q_len  # position of the sequence's first query token

    rows = tl.arange(0, BLOCK_M)
    tok = qt * BLOCK_Q + rows // G
    head = g * G + rows % G
    row_ok = (rows < BLOCK_Q * G) & (tok < q_len)
    d = tl.arange(0, D_PAD)
    d_ok = d < D
    q = tl.load(
        q_ptr + (q_begin + tok)[:, None] * q_stride_t + head[:, None] * q_stride_h + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )  # [BLOCK_M, D_PAD]
    q_pos = first_pos + tok

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    # Keys [kv_lo, kv_end) of this program: causal (none beyond its last query), inside the window of
    # its first query, one split's slice.
    kv_end = tl.minimum(ctx, first_pos + (qt + 1) * BLOCK_Q)
    win_lo = tl.where(window > 0, tl.maximum(first_pos + qt * BLOCK_Q - window + 1, 0) // BLOCK_N * BLOCK_N, 0)
    per_split = tl.cdiv(tl.cdiv(kv_end - win_lo, BLOCK_N), SPLITS) * BLOCK_N
    kv_lo = win_lo + split * per_split
    kv_end = tl.minimum(kv_end, kv_lo + per_split)
    # Whole tiles below both kv_end and the tile's first query position need no causal mask; with a
    # window, only those that start at or above the lowest key its last query sees (kv_end - window).
    full = tl.minimum(kv_end, first_pos + qt * BLOCK_Q + 1)
    full_end = kv_lo + tl.maximum(full - kv_lo, 0) // BLOCK_N * BLOCK_N
    lo_end = tl.where(window > 0, kv_lo + tl.cdiv(tl.maximum(kv_end - window - kv_lo, 0), BLOCK_N) * BLOCK_N, kv_lo)
    lo_end = tl.minimum(lo_end, full_end)
    tbl_ptr = tables_ptr + b * tables_stride
    k_base = k_ptr + g * k_stride_h
    v_base = v_ptr + g * v_stride_h
    for start in range(kv_lo, lo_end, BLOCK_N):  # the window's lower edge
        acc, m_i, l_i = _attend_tile(
            acc,
            m_i,
            l_i,
            q,
            q_pos,
            k_base,
            v_base,
            tbl_ptr,
            start,
            kv_end,
            scale,
            k_stride_b,
            v_stride_b,
            window,
            softcap,
            D,
            D_PAD,
            BS,
            BLOCK_N,
            PRECISION,
            True,
            SOFTCAP,
        )
    for start in range(lo_end, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc,
            m_i,
            l_i,
            q,
            q_pos,
            k_base,
            v_base,
            tbl_ptr,
            start,
            kv_end,
            scale,
            k_stride_b,
            v_stride_b,
            window,
            softcap,
            D,
            D_PAD,
            BS,
            BLOCK_N,
            PRECISION,
            False,
            SOFTCAP,
        )
    for start in range(full_end, kv_end, BLOCK_N):  # the causal diagonal and the last partial tile
        acc, m_i, l_i = _attend_tile(
            acc,
            m_i,
            l_i,
            q,
            q_pos,
            k_base,
            v_base,
            tbl_ptr,
            start,
            kv_end,
            scale,
            k_stride_b,
            v_stride_b,
            window,
            softcap,
            D,
            D_PAD,
            BS,
            BLOCK_N,
            PRECISION,
            True,
            SOFTCAP,
        )
    if SPLITS == 1:
        if SINKS:
            sink = tl.load(sinks_ptr + head, mask=row_ok, other=0.0)
            m_fin = tl.maximum(m_i, sink)
            alpha = tl.exp(m_i - m_fin)  # 0 for a row that saw no key
            l_i = l_i * alpha + tl.exp(sink - m_fin)
            acc = acc * alpha[:, None]
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(
            o_ptr + (q_begin + tok)[:, None] * o_stride_t + head[:, None] * o_stride_h + d[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=row_ok[:, None] & d_ok[None, :],
        )
    else:
        # part: [SPLITS, T, H, D_PAD] float32; ml: [SPLITS, T, H, 2] (running max, sum)
        row = (split * T + q_begin + tok).to(tl.int64) * H + head
        tl.store(part_ptr + row[:, None] * D_PAD + d[None, :], acc, mask=row_ok[:, None])
        tl.store(ml_ptr + row * 2, m_i, mask=row_ok)
        tl.store(ml_ptr + row * 2 + 1, l_i, mask=row_ok)


@triton.jit(do_not_specialize=["T"])
def _combine_kernel(
    part_ptr,
    ml_ptr,
    o_ptr,
    T,
    H,
    o_stride_t,
    o_stride_h,
    sinks_ptr,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    SPLITS: tl.constexpr,
    SINKS: tl.constexpr,
):
    """One (token, head): merge the splits' partial softmax sums (and the head's sink: one more
    term of the denominator). A row with no key at all (a padding sequence of a captured batch)
    comes out zero."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, SPLITS)
    d = tl.arange(0, D_PAD)
    row = (s * T + t) * H + h
    m = tl.load(ml_ptr + row * 2)
    l_part = tl.load(ml_ptr + row * 2 + 1)
    m_all = tl.max(m, 0)
    if SINKS:
        sink = tl.load(sinks_ptr + h)
        m_all = tl.maximum(m_all, sink)
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_safe))
    acc = tl.load(part_ptr + row[:, None] * D_PAD + d[None, :])
    total = tl.sum(w * l_part, 0)
    if SINKS:
        total += tl.exp(sink - m_safe)
    out = tl.sum(acc * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(o_ptr + t * o_stride_t + h * o_stride_h + d, out.to(o_ptr.dtype.element_ty), mask=d < D)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    tables: torch.Tensor,
    cu_q: torch.Tensor,
    ctx_lens: torch.Tensor,
    scale: float,
    max_q: int,
    num_sms: int = 0,
    window: int = 0,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> None:
    """q: [T, H, D] (strided view); k_cache: [blocks, H_kv, D, BS]; v_cache: [blocks, H_kv, BS, D];
    out: [T, H, D]; tables: [B, W] int32; cu_q: [B + 1] int32; ctx_lens: [B] int32 (keys of each
    sequence, its new tokens included; its queries are the last cu_q[b + 1] - cu_q[b] positions).
    max_q: the most query tokens of any sequence (a bound: it sizes the grid). num_sms: the
    device's multiprocessors; a decode batch with fewer (sequence, KV head) pairs splits its keys.
    window: keys each query sees, itself included (a sliding-window layer); 0: all.
    sinks: [H] float32 contiguous, a logit per head joining each softmax (gpt-oss), or None.
    softcap: scores become softcap * tanh(s / softcap) (Gemma 2), or None."""
    T, H, D = q.shape
    H_kv, BS = k_cache.shape[1], k_cache.shape[3]
    G = H // H_kv
    B = tables.shape[0]
    # Decode (max_q 1): at least 16 rows for tl.dot, G of them real per token. Prefill: 64 rows.
    rows = 16 if max_q <= 16 // G else 64
    block_m = max(triton.next_power_of_2(G), rows)
    block_q = max(block_m // G, 1)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    d_pad = triton.next_power_of_2(D)
    # Only a decode tile splits (one query token, or the 16-row tile): a prefill tile has one
    # variant, so every compiled variant is met at start (the profiling pass, the graph capture).
    splits = decode_splits(B, H_kv, max_q <= block_q and (rows == 16 or max_q == 1), num_sms)
    grid = (B, splits if splits > 1 else triton.cdiv(max_q, block_q), H_kv)
    part = ml = out  # unused unless split
    if splits > 1:
        part, ml = split_workspace(splits, T, H, d_pad, q.device)
    _paged_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        tables,
        cu_q,
        ctx_lens,
        scale,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        tables.stride(0),
        part,
        ml,
        T,
        H,
        window,
        out if sinks is None else sinks,
        softcap or 0.0,
        G=G,
        D=D,
        D_PAD=d_pad,
        BS=BS,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        BLOCK_N=max(64, BS),
        PRECISION=precision,
        SPLITS=splits,
        SINKS=sinks is not None,
        SOFTCAP=bool(softcap),
        num_warps=8 if block_m >= 64 else 4,  # a 64-row tile in 4 warps needs ~250 registers a thread
    )
    if splits > 1:
        # (part and ml are zeroed with the rest of free device memory at the step's sweep)
        _combine_kernel[(T, H)](
            part,
            ml,
            out,
            T,
            H,
            out.stride(0),
            out.stride(1),
            out if sinks is None else sinks,
            D=D,
            D_PAD=d_pad,
            SPLITS=splits,
            SINKS=sinks is not None,
        )


def split_workspace(splits: int, T: int, H: int, d_pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-K partials: part [SPLITS, T, H, D_PAD] float32 and ml [SPLITS, T, H, 2] (running
    max, sum). Every element is written by the attention kernel before the combine reads it."""
    part = torch.empty(splits, T, H, d_pad, dtype=torch.float32, device=device)
    ml = torch.empty(splits, T, H, 2, dtype=torch.float32, device=device)
    return part, ml


def decode_splits(num_seqs: int, kv_heads: int, one_tile: bool, num_sms: int) -> int:
    """Key splits per (sequence, KV head) for a decode batch too small to fill the GPU: a power of
    two up to 16, so that about num_sms programs run. 1 for prefill tiles or a full batch."""
    if not one_tile or num_sms <= 0:
        return 1
    splits = 1
    while splits < 16 and num_seqs * kv_heads * splits * 2 <= num_sms:
        splits *= 2
    return splits


@triton.jit
def _add_rms_norm_kernel(x_ptr, delta_ptr, w_ptr, out_ptr, N, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    """One row: x += delta (rounded to x's dtype, as torch adds); out = (x * rstd -> dtype) * w."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_DELTA:
        x = x + tl.load(delta_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
        x = x.to(x_ptr.dtype.element_ty)
        tl.store(x_ptr + row * N + cols, x, mask=ok)
        x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / N + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    y = (x * rstd).to(out_ptr.dtype.element_ty) * w
    tl.store(out_ptr + row * N + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, out: torch.Tensor, eps: float
) -> None:
    """x, delta, out: [T, N] contiguous; weight: [N]."""
    T, N = x.shape
    _add_rms_norm_kernel[(T,)](
        x,
        x if delta is None else delta,
        weight,
        out,
        N,
        eps,
        HAS_DELTA=delta is not None,
        BLOCK=triton.next_power_of_2(N),
        num_warps=8,
    )


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, F, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < F
    g = tl.load(gu_ptr + row * 2 * F + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * F + F + cols, mask=ok, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * F + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor) -> None:
    """gate_up: [T, 2F] contiguous -> out [T, F] = silu(gate) * up."""
    T, F = out.shape
    block = 1024
    _silu_mul_kernel[(T, triton.cdiv(F, block))](gate_up, out, F, BLOCK=block)


@triton.jit
def _rope_cache_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    blk_ptr,
    off_ptr,
    k_ptr,
    v_ptr,
    qkv_stride,
    k_stride_b,
    k_stride_h,
    v_stride_b,
    v_stride_h,
    NH: tl.constexpr,
    NKV: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    NH_PAD: tl.constexpr,
    BS: tl.constexpr,
):
    """One token: rotate-half RoPE in place on its q and k heads; k and v into the cache at its
    slot. A slot with a negative block (padding of a captured batch) is not written."""
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    i = tl.arange(0, HALF_PAD)
    i_ok = i < HALF
    cos = tl.load(cos_ptr + pos * HALF + i, mask=i_ok, other=0.0)
    sin = tl.load(sin_ptr + pos * HALF + i, mask=i_ok, other=0.0)
    h = tl.arange(0, NH_PAD)
    ok = (h < NH + NKV)[:, None] & i_ok[None, :]  # q heads then k heads, contiguous in qkv
    base = qkv_ptr + t * qkv_stride + h[:, None] * (2 * HALF) + i[None, :]
    x1 = tl.load(base, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF, mask=ok, other=0.0).to(tl.float32)
    r1 = (x1 * cos[None, :] - x2 * sin[None, :]).to(qkv_ptr.dtype.element_ty)
    r2 = (x2 * cos[None, :] + x1 * sin[None, :]).to(qkv_ptr.dtype.element_ty)
    tl.store(base, r1, mask=ok)
    tl.store(base + HALF, r2, mask=ok)
    blk = tl.load(blk_ptr + t).to(tl.int64)
    if blk >= 0:
        off = tl.load(off_ptr + t).to(tl.int64)
        is_k = (h >= NH) & (h < NH + NKV)
        kh = tl.where(is_k, h - NH, 0)
        kmask = is_k[:, None] & i_ok[None, :]
        # K tile of (block, head) is [D, BS]: element (dim, offset) at dim * BS + offset.
        kdst = k_ptr + blk * k_stride_b + kh[:, None] * k_stride_h + off
        tl.store(kdst + i[None, :] * BS, r1, mask=kmask)
        tl.store(kdst + (i[None, :] + HALF) * BS, r2, mask=kmask)
        vh = tl.arange(0, NH_PAD)
        vmask = (vh < NKV)[:, None] & i_ok[None, :]
        vsrc = qkv_ptr + t * qkv_stride + (NH + NKV + vh[:, None]) * (2 * HALF) + i[None, :]
        vdst = v_ptr + blk * v_stride_b + vh[:, None] * v_stride_h + off * (2 * HALF) + i[None, :]
        tl.store(vdst, tl.load(vsrc, mask=vmask, other=0.0), mask=vmask)
        tl.store(vdst + HALF, tl.load(vsrc + HALF, mask=vmask, other=0.0), mask=vmask)


def rope_cache(
    qkv: torch.Tensor,
    heads: tuple[int, int, int],
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    slots: tuple[torch.Tensor, torch.Tensor],
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
) -> None:
    """qkv: [T, (H + 2 H_kv) D] (rows contiguous); cos, sin: [P, D / 2] float32; positions,
    slots: [T] each; k_cache: [blocks, H_kv, D, BS]; v_cache: [blocks, H_kv, BS, D]."""
    nh, nkv, d = heads
    T = qkv.shape[0]
    half = d // 2
    _rope_cache_kernel[(T,)](
        qkv,
        cos,
        sin,
        positions,
        slots[0],
        slots[1],
        k_cache,
        v_cache,
        qkv.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        NH=nh,
        NKV=nkv,
        HALF=half,
        HALF_PAD=triton.next_power_of_2(half),
        NH_PAD=triton.next_power_of_2(nh + nkv),
        BS=k_cache.shape[3],
    )
