"""The CPU's own ceilings, measured in the same run as a benchmark, and what a model must read.

    copy_bytes_per_s   bytes read + written per second copying 1 GiB of float32 (torch, all of
                       torch's threads): the same convention as gpu_limits.py
    bf16_flops_per_s   2 x n^3 / time of a bfloat16 [n, n] x [n, n] matmul (oneDNN), n = 2048
    int8_ops_per_s     the same for an int8 linear (oneDNN's u8 x s8 dynamic linear: it quantizes
                       the float32 activations on every call, as an int8 engine must)

A GGUF file's step bytes are the bytes of the tensors a decode step reads whole (gpu_limits'
step_read_shapes: every weight but an untied embedding table, of which a step gathers one row per
token): the floor a decode step's weight traffic cannot go below on that file's format.

Run as `python -m traceless_tools.bench.cpu_limits [--gguf FILE] [--resident]` for a JSON line;
`--resident` loads the built-in engine (its default weights) and sums the bytes of the tensors its
model holds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path

import torch

_MATMUL_N = 2048


def _median_s(fn, repeats: int) -> float:
    """Median wall seconds of `fn` after three warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _copy_s() -> float:
    src = torch.randn(2**28)  # 1 GiB of float32, freed on return
    dst = torch.empty_like(src)
    return _median_s(lambda: dst.copy_(src), 10)


def _bf16_matmul_s(n: int) -> float:
    a = torch.randn(n, n, dtype=torch.bfloat16)
    b = torch.randn(n, n, dtype=torch.bfloat16)
    return _median_s(lambda: a @ b, 10)


def _int8_linear_s(n: int) -> tuple[float, str]:
    """oneDNN's dynamic int8 linear, else the best other quantized engine torch has here."""
    engines = [e for e in ("onednn", "x86", "fbgemm") if e in torch.backends.quantized.supported_engines]
    if not engines:
        raise RuntimeError("torch has no int8 linear engine on this CPU")
    before = torch.backends.quantized.engine
    try:
        torch.backends.quantized.engine = engines[0]
        x, w = torch.randn(n, n), torch.randn(n, n)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized tensor creation is deprecated, still works
            packed = torch.ops.quantized.linear_prepack(torch.quantize_per_tensor(w, 0.05, 0, torch.qint8), None)
        return _median_s(lambda: torch.ops.quantized.linear_dynamic(x, packed), 10), engines[0]
    finally:
        torch.backends.quantized.engine = before


def measure_cpu_limits() -> dict:
    n = _MATMUL_N
    copy_s, mm_s = _copy_s(), _bf16_matmul_s(n)
    int8_s, int8_engine = _int8_linear_s(n)
    return {
        "device_name": cpu_name(),
        "threads": torch.get_num_threads(),
        "copy_bytes_per_s": 2 * 2**30 / copy_s,
        "bf16_flops_per_s": 2 * n**3 / mm_s,
        "int8_ops_per_s": 2 * n**3 / int8_s,
        "int8_engine": int8_engine,
    }


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def gguf_step_bytes(path: Path) -> dict:
    """File size, and the bytes and parameters of the tensors one decode step reads whole."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    tied = "output.weight" not in tensors
    read = [t for name, t in tensors.items() if name != "token_embd.weight" or tied]
    return {
        "file_bytes": path.stat().st_size,
        "tensor_bytes": sum(int(t.n_bytes) for t in tensors.values()),
        "step_bytes": sum(int(t.n_bytes) for t in read),
        "step_parameters": sum(int(t.n_elements) for t in read),
        "parameters": sum(int(t.n_elements) for t in tensors.values()),
        "tied_embeddings": tied,
        "types": sorted({t.tensor_type.name for t in tensors.values()}),
    }


# Attributes that hold per-request state, not weights: the attention backend's KV cache.
_NOT_WEIGHTS = frozenset({"cache"})


def _tensors(obj, seen: set[int], depth: int = 0):
    """Every torch tensor reachable from `obj` through attributes, slots and containers, except
    under the attribute names in _NOT_WEIGHTS."""
    if depth > 12 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        children = list(obj)
    else:
        children = [v for k, v in getattr(obj, "__dict__", {}).items() if k not in _NOT_WEIGHTS]
        for cls in type(obj).__mro__:
            children += [
                getattr(obj, s) for s in getattr(cls, "__slots__", ()) if s not in _NOT_WEIGHTS and hasattr(obj, s)
            ]
    for child in children:
        if (
            isinstance(child, (str, bytes, int, float, bool, type(None)))
            or callable(child)
            and not hasattr(child, "__dict__")
            and not hasattr(type(child), "__slots__")
        ):
            continue
        yield from _tensors(child, seen, depth + 1)


def model_tensor_bytes(model) -> int:
    """Bytes of the distinct storages of the tensors the model object holds: its weights (and the
    small RoPE tables), the KV cache its attention backend references left out."""
    storages: dict[int, int] = {}
    for t in _tensors(model, set()):
        if t.is_mkldnn:  # an opaque oneDNN tensor: no storage to share, count its elements
            storages[id(t)] = t.numel() * t.element_size()
            continue
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def resident_weights() -> dict:
    """The built-in model under its defaults: the bytes its weights hold in memory, two ways: the
    model object's distinct tensor storages, and the process's resident growth over the load less
    the KV cache (which also counts the tokenizer and the load's leftovers: an upper bound)."""
    from traceless.entrypoints.llm import LLM

    before = _rss_bytes()
    llm = LLM(kv_cache_memory=128 * 2**20, max_model_len=2048)
    after = _rss_bytes()
    info = llm.engine.model
    # The engine's executor holds the model; benchmarks only read its tensors' sizes.
    model = getattr(llm.engine._executor, "model", None)
    if model is None:
        raise RuntimeError("the engine's executor holds no model to measure")
    return {
        "model": llm.engine.model_name,
        "quantization": info.quantization,
        "dtype": info.dtype,
        "weight_bytes": model_tensor_bytes(model),
        "rss_growth_less_kv_bytes": after - before - info.kv_cache_bytes,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="CPU copy bandwidth, bf16 and int8 matmul rates (JSON)")
    p.add_argument("--gguf", type=Path, help="also the step bytes of this GGUF file")
    p.add_argument("--resident", action="store_true", help="only the built-in engine's resident weight bytes")
    args = p.parse_args(argv)
    if args.resident:
        print(json.dumps(resident_weights()))
        return 0
    out = measure_cpu_limits()
    if args.gguf is not None:
        out["gguf"] = gguf_step_bytes(args.gguf)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
