"""`traceless bench ...` commands (argument parsing only; work is imported in the handlers)."""
from __future__ import annotations

import argparse

from traceless.entrypoints.engine_args import add_engine_args, engine_options


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print tables and write JSON")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCH", required=True)

    offline = bench_sub.add_parser("offline", help="W1 single stream, W2 batch, W3 long prompts, W4 repetitive on the "
                                                   "offline engine; with --speculative, against plain decoding")
    add_engine_args(offline)
    offline.add_argument("--repeats", type=int, default=3, help="timed runs per workload (median reported)")
    offline.add_argument("--workloads", default="W1,W2,W3", help="comma-separated subset of W1,W2,W3,W4")
    offline.add_argument("--json", metavar="FILE", help="write the report as JSON")
    offline.set_defaults(handler=_offline)

    serve = bench_sub.add_parser("serve", help="online benchmark against any OpenAI-compatible server")
    serve.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    serve.add_argument("--rate", type=float, default=float("inf"), help="requests per second (Poisson); inf = all at once")
    serve.add_argument("--num-prompts", type=int, default=64)
    serve.add_argument("--input-len", type=int, default=128, help="prompt length in tokens")
    serve.add_argument("--output-len", type=int, default=128, help="output tokens per request (EOS ignored)")
    serve.add_argument("--model", default=None, help="model name (default: the server's first model)")
    serve.add_argument("--api-key", default=None)
    serve.add_argument("--seed", type=int, default=0)
    serve.add_argument("--no-ignore-eos", action="store_true", help="for servers without the ignore_eos extension")
    serve.add_argument("--json", metavar="FILE", help="write the report as JSON")
    serve.set_defaults(handler=_serve)


def _offline(args: argparse.Namespace) -> int:
    from traceless.bench import offline

    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = set(names) - {"W1", "W2", "W3", "W4"}
    if unknown or args.repeats < 1:
        raise SystemExit(f"traceless bench offline: unknown workloads {sorted(unknown)} or repeats < 1")
    offline.run(args.model, args.dtype, args.repeats, names, args.json, engine_options(args))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from traceless.bench.serve import BenchConfig, run

    if args.num_prompts < 1 or args.rate <= 0 or args.input_len < 1 or args.output_len < 1:
        raise SystemExit("traceless bench serve: num-prompts, rate, input-len and output-len must be positive")
    cfg = BenchConfig(args.url, args.rate, args.num_prompts, args.input_len, args.output_len, args.seed, args.model,
                      args.api_key, not args.no_ignore_eos)
    rep = run(cfg, args.json)
    return 0 if rep["failed"] == 0 else 1
