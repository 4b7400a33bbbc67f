"""`traceless bench ...` commands (argument parsing only; work is imported in the handlers)."""
from __future__ import annotations

import argparse

from traceless.entrypoints.engine_args import add_engine_args, engine_options


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print tables and write JSON")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCH", required=True)

    offline = bench_sub.add_parser("offline", help="W1 single stream, W2 batch, W3 long prompts on the offline engine")
    add_engine_args(offline)
    offline.add_argument("--repeats", type=int, default=3, help="timed runs per workload (median reported)")
    offline.add_argument("--workloads", default="W1,W2,W3", help="comma-separated subset of W1,W2,W3")
    offline.add_argument("--json", metavar="FILE", help="write the report as JSON")
    offline.set_defaults(handler=_offline)


def _offline(args: argparse.Namespace) -> int:
    from traceless.bench import offline

    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = set(names) - {"W1", "W2", "W3"}
    if unknown or args.repeats < 1:
        raise SystemExit(f"traceless bench offline: unknown workloads {sorted(unknown)} or repeats < 1")
    offline.run(args.model, args.dtype, args.repeats, names, args.json, engine_options(args))
    return 0
