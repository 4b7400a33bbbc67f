"""`traceless bench offline --json-schema FILE`: the cost of structured decoding.

Each workload runs free (greedy, EOS ignored, the workload's output length) and constrained by the
schema (greedy, the same length cap; the output ends when the schema's JSON is complete), timed
runs interleaved after one warm-up each. The schema is compiled once per run; each request gets
its own matcher, made inside the timed run, as the server does per choice. Reported per workload:
output tokens/s of both, their ratio (structured / free), output tokens per structured request,
and how many structured outputs that stopped parse as JSON (all of them, or the bench fails).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from traceless.sampling_params import SamplingParams
from traceless.structured.spec import StructuredKind, StructuredOutput
from traceless_tools.bench.offline import RunTimes, summarize
from traceless_tools.bench.workloads import Workload, offline_workloads
from traceless_tools.report.output import finish


def _run(engine, w: Workload, tag: str, spec: StructuredOutput | None) -> tuple[RunTimes, list[str | None]]:
    """One timed pass; with a spec, the text of each output that stopped (None: cut by length)."""
    params = SamplingParams(temperature=0.0, max_tokens=w.max_tokens, ignore_eos=True, structured=spec)
    t0 = time.perf_counter()
    compiled = engine.grammar.compile(spec) if spec is not None else None
    for i, prompt in enumerate(w.prompts):
        guide = engine.grammar.guide(compiled) if compiled is not None else None
        engine.add_request(f"{tag}-{i}", list(prompt), params, guide=guide)
    first = None
    ids: dict[str, list[int]] = {f"{tag}-{i}": [] for i in range(len(w.prompts))}
    stopped: dict[str, bool] = {}
    while engine.has_unfinished():
        outs = engine.step()
        if outs and first is None:
            first = time.perf_counter() - t0
        for o in outs:
            ids[o.request_id].extend(o.new_token_ids)
            if o.finished:
                stopped[o.request_id] = o.finish_reason == "stop"
    total = time.perf_counter() - t0
    texts = [engine.tokenizer.decode(g) if stopped.get(rid) else None for rid, g in ids.items()]
    runs = RunTimes(first or total, total, w.prompt_tokens, sum(len(g) for g in ids.values()), len(w.prompts))
    return runs, texts


def run(
    model: str | None,
    dtype: str,
    repeats: int,
    names: list[str],
    json_path: str | None,
    engine_options: dict,
    schema_path: str,
) -> dict:
    from traceless.entrypoints.llm import LLM

    schema = json.loads(Path(schema_path).read_text())
    spec = StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(schema))
    engine = LLM(model, dtype=dtype, **engine_options).engine
    m = engine.model
    report: dict = {
        "engine": "traceless",
        "model": engine.model_name,
        "dtype": m.dtype,
        "device": m.device,
        "attention": m.attention,
        "load_format": m.load_format,
        "schema_chars": len(spec.source),
    }
    workloads = offline_workloads()
    for name in names:
        w = workloads[name]
        _run(engine, w, f"{name}-free-warmup", None)
        _run(engine, w, f"{name}-json-warmup", spec)
        free, constrained, texts = [], [], []
        for i in range(repeats):
            free.append(_run(engine, w, f"{name}-free-{i}", None)[0])
            r, t = _run(engine, w, f"{name}-json-{i}", spec)
            constrained.append(r)
            texts += t
        done = [t for t in texts if t is not None]
        valid = sum(1 for t in done if _parses(t))
        f, s = summarize(name, free), summarize(name, constrained)
        report[name] = {
            "description": w.description,
            "free": f,
            "structured": s,
            "structured_over_free": s["output_tokens_per_s"] / f["output_tokens_per_s"],
            "structured_output_tokens_per_request": statistics.mean(r.output_tokens / r.requests for r in constrained),
            "structured_outputs_stopped": len(done),
            "structured_outputs_valid_json": valid,
        }
        if valid != len(done):
            raise RuntimeError(f"{name}: {len(done) - valid} structured output(s) did not parse as JSON")
    engine.check_integrity()
    return finish(report, lambda r: print_table(r, names), json_path)


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def print_table(report: dict, names: list[str]) -> None:
    print(
        f"\ntraceless bench offline --json-schema  model={report['model']}  dtype={report['dtype']}  "
        f"device={report['device']}  load_format={report['load_format']}"
    )
    print(f"{'workload':<9}{'free tok/s':>14}{'json tok/s':>14}{'json/free':>11}{'tok/req':>9}{'valid':>12}")
    for name in names:
        r = report[name]
        print(
            f"{name:<9}{r['free']['output_tokens_per_s']:>14.1f}{r['structured']['output_tokens_per_s']:>14.1f}"
            f"{r['structured_over_free']:>11.3f}{r['structured_output_tokens_per_request']:>9.1f}"
            f"{r['structured_outputs_valid_json']:>6}/{r['structured_outputs_stopped']:<5}"
        )
