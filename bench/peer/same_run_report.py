"""The markdown table of bench/peer/same_run.py's report (same_run.json -> README.md).

python3 bench/peer/same_run_report.py bench/results/cpu-<date>/same_run.json   # rewrite its README.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NAMES = {"traceless": "traceless", "llamacpp": "llama.cpp", "vllm": "vLLM CPU"}
ROWS = (
    ("W1", "ttft_s", "W1 TTFT (s)"),
    ("W1", "decode_tokens_per_s", "W1 decode tok/s"),
    ("W2", "output_tokens_per_s", "W2 output tok/s"),
    ("W3", "output_tokens_per_s", "W3 output tok/s"),
    ("W3", "total_tokens_per_s", "W3 total tok/s"),
)
# (what, traceless's figure over the peer's, at least): the targets the engine is measured against
TARGETS = (
    ("W1 decode vs llama.cpp", "llamacpp", "W1", "decode_tokens_per_s", 1.2),
    ("W1 TTFT vs llama.cpp (peer's / ours)", "llamacpp", "W1", "ttft_s", 1.0),
    ("W2 output vs vLLM CPU", "vllm", "W2", "output_tokens_per_s", 2.0),
    ("W3 total vs vLLM CPU", "vllm", "W3", "total_tokens_per_s", 1.2),
)


def _fmt(x) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"


def _figure_table(rep: dict) -> list[str]:
    engines = list(rep["figures"])
    head = (
        ["figure"]
        + [NAMES[e] for e in engines]
        + [f"{NAMES[e]} limit" for e in engines]
        + [f"{NAMES[e]} / limit" for e in engines]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w, k, label in ROWS:
        if any(w not in rep["figures"][e] for e in engines):
            continue
        cells = [label]
        for part in ("figures", "limit", "ratio_to_limit"):
            cells += [_fmt(rep["figures"][e][w][part].get(k)) for e in engines]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _targets(rep: dict) -> list[str]:
    figs = rep["figures"]
    lines = ["| target | ratio | wanted | met |", "|---|---|---|---|"]
    for label, peer, w, k, want in TARGETS:
        if "traceless" not in figs or peer not in figs or w not in figs["traceless"]:
            why = "workload not run" if figs and w not in next(iter(figs.values())) else "engine not run"
            lines.append(f"| {label} | - | >= {want} | {why} |")
            continue
        ours, theirs = figs["traceless"][w]["figures"].get(k), figs[peer][w]["figures"].get(k)
        if not ours or not theirs:
            lines.append(f"| {label} | - | >= {want} | figure missing |")
            continue
        ratio = theirs / ours if k == "ttft_s" else ours / theirs
        lines.append(f"| {label} | {ratio:.2f} | >= {want} | {'yes' if ratio >= want else 'no'} |")
    res, gguf = rep.get("resident") or {}, rep["gguf"]
    if res:
        ratio = res["weight_bytes"] / gguf["file_bytes"]
        met = "yes" if ratio <= 1.1 else "no"
        lines.append(
            f"| traceless resident weights / GGUF file ({res['weight_bytes'] / 1e6:.1f} MB / "
            f"{gguf['file_bytes'] / 1e6:.1f} MB) | {ratio:.3f} | <= 1.10 | {met} |"
        )
    return lines


def _machine(rep: dict) -> list[str]:
    m, lim = rep["machine"], rep["limits"]
    per_round = "; ".join(
        f"{x['copy_bytes_per_s'] / 1e9:.1f} GB/s, {x['bf16_flops_per_s'] / 1e9:.0f} / "
        f"{x['int8_ops_per_s'] / 1e9:.0f} GFLOP/s"
        for x in rep["limits_per_round"]
    )
    return [
        f"- CPU: {m['model_name']}, {m['cpus']} CPUs; flags: {' '.join(m['flags'])} "
        f"(absent: {' '.join(m['flags_missing']) or 'none'})",
        f"- Limits (medians over rounds): copy {lim['copy_bytes_per_s'] / 1e9:.1f} GB/s (read + written), "
        f"bf16 matmul {lim['bf16_flops_per_s'] / 1e9:.0f} GFLOP/s, int8 linear "
        f"{lim['int8_ops_per_s'] / 1e9:.0f} GOP/s; per round: {per_round}",
        f"- Bytes one decode step reads: GGUF {rep['gguf']['step_bytes'] / 1e6:.1f} MB "
        f"({', '.join(rep['gguf']['types'])}; file {rep['gguf']['file_bytes'] / 1e6:.1f} MB), bf16 "
        f"{2 * rep['gguf']['step_parameters'] / 1e6:.1f} MB (vLLM)",
    ]


def _greedy(rep: dict) -> list[str]:
    g = rep.get("greedy_agreement")
    if not g:
        return ["Greedy agreement with llama.cpp: not measured (llama.cpp not installed or the step failed)."]
    return [
        f"Greedy agreement on the agreement prompt set ({g['prompts']} prompts; "
        f"{g['positions_teacher_forced']} teacher-forced positions, {g['positions_free']} free-running):",
        "",
        "| | llama.cpp vs traceless (default) | llama.cpp vs traceless float32 | traceless default vs float32 |",
        "|---|---|---|---|",
        f"| teacher-forced top-1 | {g['top1_vs_traceless']:.4f} | {g['top1_vs_traceless_float32']:.4f} | "
        f"{g['traceless_top1_vs_float32']:.4f} |",
        f"| free-running, position by position | {g['free_vs_traceless']:.4f} | "
        f"{g['free_vs_traceless_float32']:.4f} | {g['traceless_free_vs_float32']:.4f} |",
    ]


def _steps(rep: dict) -> list[str]:
    lines = ["| step | wall s | exit | load before | load after |", "|---|---|---|---|---|"]
    for s in rep["steps"]:
        load = [u.split("load average:")[-1].strip() for u in (s["uptime_before"], s["uptime_after"])]
        lines.append(f"| {s['step']} | {s['wall_s']:.0f} | {s['rc']} | {load[0]} | {load[1]} |")
    return lines


def render(rep: dict) -> str:
    versions = ", ".join(f"{NAMES[e]} {f['version']}" for e, f in rep["figures"].items())
    out = [
        f"# Same-run CPU table ({rep['started']})",
        "",
        f"`bench/peer/{rep['command']}`: {rep['rounds']} round(s), {rep['repeats']} timed run(s) per workload "
        f"per engine; figures are medians. Threads: {rep.get('threads') or 'each engine default'}. "
        f"{versions}. Model: SmolLM2-135M-Instruct, `{Path(rep['gguf_path']).name}`"
        " (traceless and llama.cpp on the file itself, vLLM on its float32 conversion run in bfloat16).",
        "",
        *_machine(rep),
        "",
    ]
    if rep.get("skipped"):
        out += [f"- Not run: {', '.join(f'{NAMES[e]} ({why})' for e, why in rep['skipped'].items())}", ""]
    out += [
        *_figure_table(rep),
        "",
        "Limit: decode = bandwidth / bytes per step; TTFT and throughput = the "
        "slower of reading the weights once per step and the matmul work at the faster of the bf16 and "
        "int8 rates (attention left out); ratio = figure / limit (TTFT: limit / figure).",
        "",
        *_targets(rep),
        "",
        *_greedy(rep),
        "",
        "Load average (1/5/15 min) around each step (a shared machine):",
        "",
        *_steps(rep),
        "",
    ]
    return "\n".join(out)


def write_report(rep: dict, path: Path) -> None:
    path.write_text(render(rep))


if __name__ == "__main__":
    src = Path(sys.argv[1])
    write_report(json.loads(src.read_text()), src.parent / "README.md")
