"""Decode speed while other processes want the CPUs: traceless (each TRACELESS_CPU_TEAM setting) and
llama.cpp (all CPUs' threads), with 0, 1 and 2 busy processes beside them.

    /work/main/.venv/bin/python bench/peer/contention.py [--hogs 0,1,2] [--tokens 256] [--repeats 2]
        [--llamacpp-python /work/llamacpp-venv/bin/python] [--json FILE]

Each figure is one process that loads the built-in model, warms up, then times `--tokens` greedy
tokens of one stream (prefill included) after a short prompt; the busy processes are `while 1: pass`
loops started before and killed after each hog level. Prints a table of medians and the load
average seen; --json writes every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "Tell me a story about a dragon."

TRACELESS = f"""
import sys, time
from traceless import LLM, SamplingParams
llm = LLM()
p = SamplingParams(max_tokens=int(sys.argv[1]), temperature=0.0, ignore_eos=True)
llm.generate([{PROMPT!r}], SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)
t = time.perf_counter()
n = len(llm.generate([{PROMPT!r}], p, use_tqdm=False)[0].outputs[0].token_ids)
print(n / (time.perf_counter() - t))
"""

LLAMACPP = f"""
import os, sys, time
from llama_cpp import Llama
n = int(sys.argv[1])
llm = Llama(model_path=sys.argv[2], n_ctx=1024, verbose=False, seed=0, n_threads=os.cpu_count(),
            n_threads_batch=os.cpu_count())
def run(n):
    llm.reset()
    c = 0
    for _ in llm.generate(llm.tokenize({PROMPT!r}.encode()), temp=0.0):
        c += 1
        if c >= n:
            return c
run(8)
t = time.perf_counter()
print(run(n) / (time.perf_counter() - t))
"""


def _one(cmd: list[str], env: dict) -> float | None:
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=True).stdout
        return float(out.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hogs", default="0,1,2")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--llamacpp-python", default="/work/llamacpp-venv/bin/python")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    from traceless.model.loader import default_model_path

    gguf = str(default_model_path())
    engines = {
        f"traceless {m}": ([sys.executable, "-c", TRACELESS, str(args.tokens)], {"TRACELESS_CPU_TEAM": m})
        for m in ("auto", "all", "one")
    }
    if Path(args.llamacpp_python).exists():
        engines["llama.cpp"] = ([args.llamacpp_python, "-c", LLAMACPP, str(args.tokens), gguf], {})
    runs = []
    for hogs in (int(h) for h in args.hogs.split(",")):
        busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(hogs)]
        time.sleep(1)
        try:
            for _ in range(args.repeats):
                for name, (cmd, extra) in engines.items():
                    tps = _one(cmd, {**os.environ, **extra})
                    runs.append({"hogs": hogs, "engine": name, "tokens_per_s": tps, "load1": os.getloadavg()[0]})
                    print(f"hogs={hogs} {name}: {tps if tps is None else round(tps, 1)} tok/s", file=sys.stderr)
        finally:
            for b in busy:
                b.kill()
                b.wait()
    levels = sorted({r["hogs"] for r in runs})
    print("| engine | " + " | ".join(f"{h} busy: tok/s" for h in levels) + " |")
    print("|---" * (len(levels) + 1) + "|")
    for name in engines:
        cells = []
        for h in levels:
            vals = [r["tokens_per_s"] for r in runs if r["engine"] == name and r["hogs"] == h and r["tokens_per_s"]]
            cells.append(f"{statistics.median(vals):.1f} ({', '.join(f'{v:.0f}' for v in vals)})" if vals else "-")
        print(f"| {name} | " + " | ".join(cells) + " |")
    loads = [r["load1"] for r in runs]
    print(f"\nload average (1 min) seen: {min(loads):.2f}-{max(loads):.2f}; CPUs: {os.cpu_count()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"tokens": args.tokens, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
