"""The device's own ceilings, measured in the same run as the benchmark: device-to-device copy
bandwidth and bf16 matmul rate; and the best a workload could do under them.

Limits of a workload (greedy, fixed output length, one batch when it fits):
    bytes floor   = decode steps x weight bytes / bandwidth (each step reads every weight once,
                    except the embedding table, of which it reads one row per token; a table tied
                    to the LM head is read whole by the head)
    compute floor = 2 x parameters x (prompt + output tokens) / matmul rate (the parameters the
                    matmuls use: the same ones)
    output tok/s limit = output tokens / max(bytes floor, compute floor)
    W1 decode tok/s limit = bandwidth / weight bytes; TTFT floor = max(weights / bandwidth,
    2 x parameters x prompt tokens / matmul rate).
Attention and KV reads are left out, so the limits are a little generous.
"""

from __future__ import annotations

import statistics

import torch


def time_ms(fn, device: torch.device, repeats: int = 10) -> float:
    """Median milliseconds of `fn` on the device (CUDA events), after three warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure_limits(device: torch.device) -> dict:
    """Copy bandwidth (bytes read + written per second) over 1 GiB of random data; bf16 matmul
    rate of 8192^3 products on random data."""
    n = 8192
    copy_ms, mm_ms = _copy_ms(device), _matmul_ms(device, n)
    torch.cuda.empty_cache()
    return {
        "device_name": torch.cuda.get_device_name(device),
        "copy_bytes_per_s": 2 * 2**30 / (copy_ms / 1e3),
        "bf16_flops_per_s": 2 * n**3 / (mm_ms / 1e3),
    }


def _copy_ms(device: torch.device) -> float:
    src = torch.randn(2**28, device=device)  # 1 GiB of float32, freed on return
    dst = torch.empty_like(src)
    return time_ms(lambda: dst.copy_(src), device)


def _matmul_ms(device: torch.device, n: int) -> float:
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    return time_ms(lambda: a @ b, device)


def step_read_shapes(shapes: dict[str, tuple[int, ...]], tie_word_embeddings: bool) -> dict[str, tuple[int, ...]]:
    """The weights a forward step reads whole (and multiplies by): all but an untied embedding
    table, which it gathers one row per token from."""
    return {k: v for k, v in shapes.items() if k != "embed" or tie_word_embeddings}


def workload_limits(
    limits: dict, weight_bytes: int, params: int, prompts: int, prompt_tokens: int, max_tokens: int
) -> dict:
    """The best output tok/s (and, for one prompt, decode tok/s and TTFT) the ceilings allow."""
    bw, rate = limits["copy_bytes_per_s"], limits["bf16_flops_per_s"]
    output = prompts * max_tokens
    floor = max(max_tokens * weight_bytes / bw, 2 * params * (prompt_tokens + output) / rate)
    out = {"output_tokens_per_s": output / floor}
    if prompts == 1:
        out["decode_tokens_per_s"] = bw / weight_bytes
        out["ttft_s"] = max(weight_bytes / bw, 2 * params * prompt_tokens / rate)
    return out


def ratios(figures: dict, limits: dict) -> dict:
    """Each figure over its limit (TTFT: limit over figure), so 1.0 is the ceiling."""
    out = {}
    for key, limit in limits.items():
        if key in figures and figures[key] > 0:
            out[key] = limit / figures[key] if key == "ttft_s" else figures[key] / limit
    return out
