"""`traceless bench offline`: W1 single stream, W2 batch, W3 long prompts on one engine.

Greedy decoding with a fixed output length (ignore EOS), deterministic prompts from
workloads.py (the same ids the peer-engine scripts feed vLLM). Each workload runs once untimed,
then `repeats` timed runs; the report holds medians. Times are taken around the engine's own
step loop, so TTFT and decode rate come from the same run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceless_tools.bench.workloads import Workload, offline_workloads
from traceless_tools.report.output import finish


def process_age_s() -> float:
    """Seconds since this process started (Linux: /proc), for the load-time figure."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        import os

        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


@dataclass(frozen=True, slots=True)
class RunTimes:
    first_token_s: float  # from submission to the first token of the first request
    total_s: float
    prompt_tokens: int
    output_tokens: int
    requests: int
    outputs: tuple[tuple[int, ...], ...] = ()  # generated ids per prompt, in order (synthetic prompts)


def run_once(engine, workload: Workload, tag: str) -> RunTimes:
    from traceless.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=workload.max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    for i, prompt in enumerate(workload.prompts):
        engine.add_request(f"{tag}-{i}", list(prompt), params)
    first = None
    generated: dict[str, list[int]] = {f"{tag}-{i}": [] for i in range(len(workload.prompts))}
    while engine.has_unfinished():
        outs = engine.step()
        if outs and first is None:
            first = time.perf_counter() - t0
        for o in outs:
            generated[o.request_id].extend(o.new_token_ids)
    total = time.perf_counter() - t0
    produced = sum(len(g) for g in generated.values())
    return RunTimes(
        first or total,
        total,
        workload.prompt_tokens,
        produced,
        len(workload.prompts),
        tuple(tuple(g) for g in generated.values()),
    )


def summarize(name: str, runs: list[RunTimes]) -> dict:
    med = statistics.median
    out = {
        "repeats": len(runs),
        "output_tokens_per_s": med(r.output_tokens / r.total_s for r in runs),
        "total_tokens_per_s": med((r.output_tokens + r.prompt_tokens) / r.total_s for r in runs),
        "requests_per_s": med(r.requests / r.total_s for r in runs),
        "e2e_s": med(r.total_s for r in runs),
    }
    if name == "W1":
        out["ttft_s"] = med(r.first_token_s for r in runs)
        out["decode_tokens_per_s"] = med((r.output_tokens - 1) / (r.total_s - r.first_token_s) for r in runs)
    return out


def run(
    model: str | None,
    dtype: str,
    repeats: int,
    names: list[str],
    json_path: str | None,
    engine_options: dict,
    peer: str | None = None,
) -> dict:
    """peer "hf": transformers generate on the same (dummy) weights and prompts, after ours."""
    if engine_options.get("speculative", "off") != "off":
        from traceless_tools.bench.speculative import run as run_speculative

        return run_speculative(model, dtype, repeats, names, json_path, engine_options)
    if peer is not None and engine_options.get("load_format") != "dummy":
        raise ValueError("--peer hf runs on the same dummy weights: use it with --load-format dummy")
    from tqdm.auto import tqdm

    from traceless.entrypoints.llm import LLM

    limits = _device_limits(engine_options.get("device", "auto"))
    llm = LLM(model, dtype=dtype, **engine_options)
    load_s = process_age_s()
    engine = llm.engine
    workloads = offline_workloads()
    m = engine.model
    report: dict[str, Any] = {
        "engine": "traceless",
        "model": engine.model_name,
        "dtype": m.dtype,
        "quantization": m.quantization,
        "device": m.device,
        "attention": m.attention,
        "kv_cache_dtype": m.kv_cache_dtype,
        "load_s": load_s,
        "load_format": m.load_format,
        "cuda_graphs": m.cuda_graphs,
        "fused_forward": m.fused_forward,
        "capture_s": m.capture_s,
    }
    for name in names:
        w = workloads[name]
        run_once(engine, w, f"{name}-warmup")
        runs = [run_once(engine, w, f"{name}-{i}") for i in tqdm(range(repeats), desc=f"{name}", unit="run")]
        report[name] = summarize(name, runs)
        report[name]["description"] = w.description
    engine.check_integrity()
    if limits is not None:
        report["limits"] = limits
        _add_limit_ratios(report, model, names, workloads)
    if peer is not None:
        device = m.device
        del llm, engine  # the peer needs the device memory our engine holds
        report["peer"] = _run_peer(device, model, m.dtype, names, workloads)
    return finish(report, lambda r: print_table(r, names), json_path)


def _device_limits(device: str) -> dict | None:
    import torch

    if device == "cpu" or not torch.cuda.is_available():
        return None
    from traceless_tools.bench.gpu_limits import measure_limits

    return measure_limits(torch.device("cuda" if device == "auto" else device))


def _add_limit_ratios(report: dict, model: str | None, names: list[str], workloads: dict[str, Workload]) -> None:
    """Each workload's limits and ratios, when the model's shapes are known from a config.json."""
    import torch

    from traceless.errors import TracelessError
    from traceless.model.dummy import read_dummy_config, weight_shapes
    from traceless_tools.bench.gpu_limits import ratios, step_read_shapes, workload_limits

    try:
        config = read_dummy_config(Path(model)) if model is not None else None
    except (TracelessError, OSError):
        config = None
    if config is None:
        return
    shapes = weight_shapes(config)
    total = sum(torch.Size(s).numel() for s in shapes.values())
    params = sum(torch.Size(s).numel() for s in step_read_shapes(shapes, config.tie_word_embeddings).values())
    weight_bytes = params * torch.empty((), dtype=getattr(torch, report["dtype"])).element_size()
    # weight_bytes: what one step reads (the embedding table, of which it reads a row per token, left out)
    report["limits"] |= {"parameters": total, "step_parameters": params, "weight_bytes": weight_bytes}
    for name in names:
        w = workloads[name]
        lim = workload_limits(report["limits"], weight_bytes, params, len(w.prompts), w.prompt_tokens, w.max_tokens)
        report[name]["limit"] = lim
        report[name]["ratio_to_limit"] = ratios(report[name], lim)


def _run_peer(device: str, model: str | None, dtype: str, names: list[str], workloads: dict[str, Workload]) -> dict:
    """Once our engine is released, run transformers on the same weights and prompts."""
    import gc

    import torch

    from traceless_tools.bench.hf_peer import run_peer

    gc.collect()  # the engine's tensors go with its last reference (cycles included)
    if device == "cuda":
        torch.cuda.empty_cache()
    return run_peer(
        Path(model or "."), getattr(torch, dtype), torch.device(device), [workloads[n] for n in names], repeats=1
    )


def print_table(report: dict, names: list[str]) -> None:
    print(
        f"\ntraceless bench offline  model={report['model']}  dtype={report['dtype']}  "
        f"quantization={report.get('quantization', 'none')}  "
        f"device={report['device']}  attention={report['attention']}  load={report['load_s']:.1f}s  "
        f"load_format={report['load_format']}  cuda_graphs={report['cuda_graphs']} "
        f"(captured in {report['capture_s']:.2f}s)"
    )
    cols = ("ttft_s", "decode_tokens_per_s", "output_tokens_per_s", "total_tokens_per_s", "requests_per_s")
    print(f"{'workload':<9}" + "".join(f"{c:>22}" for c in cols))
    for name in names:
        row = report[name]
        cells = "".join(f"{row[c]:>22.3f}" if c in row else f"{'-':>22}" for c in cols)
        print(f"{name:<9}{cells}")
        for label, other in (
            ("  hf", report.get("peer", {}).get(name)),
            ("  limit", row.get("limit")),
            ("  ratio", row.get("ratio_to_limit")),
        ):
            if other:
                print(f"{label:<9}" + "".join(f"{other[c]:>22.3f}" if c in other else f"{'-':>22}" for c in cols))
    if "limits" in report:
        lim = report["limits"]
        print(
            f"limits: {lim['device_name']}  copy {lim['copy_bytes_per_s'] / 1e12:.2f} TB/s  "
            f"bf16 matmul {lim['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s  (ratio: figure / limit; TTFT limit / figure)"
        )
    if report.get("load_format") == "dummy":
        print("weights: dummy (random weights of the model's shapes; outputs are meaningless)")
