"""`traceless bench offline --speculative ngram|draft`: each workload with and without speculative
decoding, on two engines that differ only in that option, their timed runs interleaved.

Per workload: output tokens/s of plain decoding and with speculation (medians of `repeats` timed
runs after one warm-up each), their ratio (speedup), the acceptance rate (accepted / proposed drafts),
tokens per verifying step (1 + accepted / steps that verified drafts, per request), and whether
the greedy outputs of the two engines are identical.
"""

from __future__ import annotations

import os

from traceless_tools.bench.offline import run_once, summarize
from traceless_tools.bench.workloads import offline_workloads
from traceless_tools.report.output import finish


def _counters(engine) -> tuple[int, int, int]:
    s = engine.spec_stats
    return s.proposed, s.accepted, s.verify_steps


def measure(engines: dict, name: str, repeats: int) -> dict[str, dict]:
    """One workload on each engine, runs interleaved (off, spec, off, spec, ...) so that a change
    of machine load hits both alike: {engine key: summary + speculation counters + outputs}."""
    w = offline_workloads()[name]
    runs: dict[str, list] = {key: [] for key in engines}
    for key, engine in engines.items():
        run_once(engine, w, f"{name}-{key}-warmup")
    before = {key: _counters(e) for key, e in engines.items()}
    for i in range(repeats):
        for key, engine in engines.items():
            runs[key].append(run_once(engine, w, f"{name}-{key}-{i}"))
    out = {}
    for key, engine in engines.items():
        proposed, accepted, steps = (b - a for a, b in zip(before[key], _counters(engine)))
        out[key] = dict(
            summarize(name, runs[key]),
            proposed=proposed,
            accepted=accepted,
            verify_steps=steps,
            outputs=runs[key][0].outputs,
        )
    return out


def run(
    model: str | None, dtype: str, repeats: int, names: list[str], json_path: str | None, engine_options: dict
) -> dict:
    from traceless.entrypoints.llm import LLM

    load_start = os.getloadavg()
    engines = {
        "off": LLM(model, dtype=dtype, **dict(engine_options, speculative="off", draft_layers=None)).engine,
        "spec": LLM(model, dtype=dtype, **engine_options).engine,
    }
    e = engines["off"]
    report = {
        "engine": "traceless",
        "model": e.model_name,
        "dtype": e.model.dtype,
        "device": e.model.device,
        "attention": e.model.attention,
        "speculative": engine_options["speculative"],
        "num_speculative_tokens": engine_options.get("num_speculative_tokens", 4),
        "draft_layers": engine_options.get("draft_layers"),
        "repeats": repeats,
        "loadavg_start": load_start,
    }
    for name in names:
        m = measure(engines, name, repeats)
        a, b = m["off"], m["spec"]
        report[name] = {
            "description": offline_workloads()[name].description,
            "off_output_tokens_per_s": a["output_tokens_per_s"],
            "spec_output_tokens_per_s": b["output_tokens_per_s"],
            "speedup": b["output_tokens_per_s"] / a["output_tokens_per_s"],
            "acceptance_rate": b["accepted"] / b["proposed"] if b["proposed"] else 0.0,
            "tokens_per_verify_step": 1 + b["accepted"] / b["verify_steps"] if b["verify_steps"] else 1.0,
            "proposed": b["proposed"],
            "accepted": b["accepted"],
            "verify_steps": b["verify_steps"],
            "identical_outputs": a["outputs"] == b["outputs"],
        }
    for engine in engines.values():
        engine.check_integrity()
    report["loadavg_end"] = os.getloadavg()
    return finish(report, lambda r: print_table(r, names), json_path)


def print_table(report: dict, names: list[str]) -> None:
    print(
        f"\ntraceless bench offline --speculative {report['speculative']}  k={report['num_speculative_tokens']}  "
        f"model={report['model']}  dtype={report['dtype']}  device={report['device']}  "
        f"load={report['loadavg_start'][0]:.2f}->{report['loadavg_end'][0]:.2f}"
    )
    cols = ("off tok/s", "spec tok/s", "speedup", "acceptance", "tokens/step", "identical")
    print(f"{'workload':<9}" + "".join(f"{c:>12}" for c in cols))
    for name in names:
        r = report[name]
        print(
            f"{name:<9}{r['off_output_tokens_per_s']:>12.1f}{r['spec_output_tokens_per_s']:>12.1f}"
            f"{r['speedup']:>12.2f}{r['acceptance_rate']:>12.2f}{r['tokens_per_verify_step']:>12.2f}"
            f"{'yes' if r['identical_outputs'] else 'no':>12}"
        )
