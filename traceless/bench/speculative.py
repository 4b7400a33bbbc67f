"""`traceless bench offline --speculative ngram|draft`: each workload with and without speculative
decoding, on two engines that differ only in that option (built one after the other).

Per workload: output tokens/s of plain decoding and with speculation (medians of `repeats` timed
runs after one warm-up), their ratio (speedup), the acceptance rate (accepted / proposed drafts),
tokens per verifying step (1 + accepted / steps that verified drafts, per request), and whether
the greedy outputs of the two engines are identical.
"""
from __future__ import annotations

import gc
import json
import os
from dataclasses import replace
from pathlib import Path

from traceless.bench.offline import run_once, summarize
from traceless.bench.workloads import offline_workloads


def measure(model: str | None, dtype: str, options: dict, names: list[str], repeats: int) -> tuple[dict, dict]:
    """(engine description, {workload: summary + speculation counters + first run's outputs})."""
    from traceless.entrypoints.llm import LLM

    llm = LLM(model, dtype=dtype, **options)
    engine = llm.engine
    workloads = offline_workloads()
    results = {}
    for name in names:
        w = workloads[name]
        run_once(engine, w, f"{name}-warmup")
        before = replace(engine.spec_stats)
        runs = [run_once(engine, w, f"{name}-{i}") for i in range(repeats)]
        s = engine.spec_stats
        proposed, accepted, steps = s.proposed - before.proposed, s.accepted - before.accepted, s.verify_steps - before.verify_steps
        results[name] = dict(summarize(name, runs), proposed=proposed, accepted=accepted, verify_steps=steps,
                             outputs=runs[0].outputs)
    engine.check_integrity()
    info = {"model": engine.model_name, "dtype": str(engine.built.dtype).removeprefix("torch."),
            "device": engine.built.device.type, "attention": engine.built.attention}
    del llm, engine
    gc.collect()
    return info, results


def run(model: str | None, dtype: str, repeats: int, names: list[str], json_path: str | None, engine_options: dict) -> dict:
    load_start = os.getloadavg()
    info, off = measure(model, dtype, dict(engine_options, speculative="off", draft_layers=None), names, repeats)
    _, spec = measure(model, dtype, engine_options, names, repeats)
    report = {"engine": "traceless", **info, "speculative": engine_options["speculative"],
              "num_speculative_tokens": engine_options.get("num_speculative_tokens", 4),
              "draft_layers": engine_options.get("draft_layers"), "repeats": repeats,
              "loadavg_start": load_start, "loadavg_end": os.getloadavg()}
    for name in names:
        a, b = off[name], spec[name]
        report[name] = {
            "description": offline_workloads()[name].description,
            "off_output_tokens_per_s": a["output_tokens_per_s"],
            "spec_output_tokens_per_s": b["output_tokens_per_s"],
            "speedup": b["output_tokens_per_s"] / a["output_tokens_per_s"],
            "acceptance_rate": b["accepted"] / b["proposed"] if b["proposed"] else 0.0,
            "tokens_per_verify_step": 1 + b["accepted"] / b["verify_steps"] if b["verify_steps"] else 1.0,
            "proposed": b["proposed"], "accepted": b["accepted"], "verify_steps": b["verify_steps"],
            "identical_outputs": a["outputs"] == b["outputs"],
        }
    print_table(report, names)
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    return report


def print_table(report: dict, names: list[str]) -> None:
    print(f"\ntraceless bench offline --speculative {report['speculative']}  k={report['num_speculative_tokens']}  "
          f"model={report['model']}  dtype={report['dtype']}  device={report['device']}  "
          f"load={report['loadavg_start'][0]:.2f}->{report['loadavg_end'][0]:.2f}")
    cols = ("off tok/s", "spec tok/s", "speedup", "acceptance", "tokens/step", "identical")
    print(f"{'workload':<9}" + "".join(f"{c:>12}" for c in cols))
    for name in names:
        r = report[name]
        print(f"{name:<9}{r['off_output_tokens_per_s']:>12.1f}{r['spec_output_tokens_per_s']:>12.1f}{r['speedup']:>12.2f}"
              f"{r['acceptance_rate']:>12.2f}{r['tokens_per_verify_step']:>12.2f}{'yes' if r['identical_outputs'] else 'no':>12}")
