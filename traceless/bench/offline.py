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

from traceless.bench.workloads import Workload, offline_workloads
from traceless.report.output import finish


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
    return RunTimes(first or total, total, workload.prompt_tokens, produced, len(workload.prompts),
                    tuple(tuple(g) for g in generated.values()))


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


def run(model: str | None, dtype: str, repeats: int, names: list[str], json_path: str | None,
        engine_options: dict) -> dict:
    if engine_options.get("speculative", "off") != "off":
        from traceless.bench.speculative import run as run_speculative

        return run_speculative(model, dtype, repeats, names, json_path, engine_options)
    from tqdm.auto import tqdm

    from traceless.entrypoints.llm import LLM

    llm = LLM(model, dtype=dtype, **engine_options)
    load_s = process_age_s()
    engine = llm.engine
    workloads = offline_workloads()
    report: dict[str, Any] = {
        "engine": "traceless", "model": engine.model_name, "dtype": engine.model.dtype,
        "device": engine.model.device, "attention": engine.model.attention, "load_s": load_s,
    }
    for name in names:
        w = workloads[name]
        run_once(engine, w, f"{name}-warmup")
        runs = [run_once(engine, w, f"{name}-{i}") for i in tqdm(range(repeats), desc=f"{name}", unit="run")]
        report[name] = summarize(name, runs)
        report[name]["description"] = w.description
    engine.check_integrity()
    return finish(report, lambda r: print_table(r, names), json_path)


def print_table(report: dict, names: list[str]) -> None:
    print(f"\ntraceless bench offline  model={report['model']}  dtype={report['dtype']}  "
          f"device={report['device']}  attention={report['attention']}  load={report['load_s']:.1f}s")
    cols = ("ttft_s", "decode_tokens_per_s", "output_tokens_per_s", "total_tokens_per_s", "requests_per_s")
    print(f"{'workload':<9}" + "".join(f"{c:>22}" for c in cols))
    for name in names:
        row = report[name]
        cells = "".join(f"{row[c]:>22.3f}" if c in row else f"{'-':>22}" for c in cols)
        print(f"{name:<9}{cells}")
