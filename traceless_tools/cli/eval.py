"""`traceless eval`: lm-evaluation-harness on the project's task sets against a running server."""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a running server with lm-evaluation-harness on the bundled tasks")
    p.add_argument(
        "--base-url",
        default="http://127.0.0.1:8000",
        help="the server's root URL (traceless serve, or the local proxy of the private path)",
    )
    p.add_argument(
        "--tasks",
        default="traceless_mc,traceless_gen",
        help="comma-separated bundled tasks (traceless_mc: multiple choice; traceless_gen: generation)",
    )
    p.add_argument("--model", default=None, help="model name (default: the server's)")
    p.add_argument("--limit", type=int, default=None, help="questions per task (default: all)")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight")
    p.add_argument("--output-json", default=None, help="also write the figures here as JSON")
    p.set_defaults(handler=_eval)


def _eval(args: argparse.Namespace) -> int:
    from traceless_tools.eval.harness import EvalConfig, EvalError, run_eval, summary

    tasks = tuple(t for t in args.tasks.split(",") if t)
    try:
        figures = summary(run_eval(EvalConfig(args.base_url, tasks, args.model, args.limit, args.concurrency)))
    except EvalError as exc:
        print(f"traceless eval: {exc}", file=sys.stderr)
        return 2
    for task, metrics in figures.items():
        print(task + ": " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items())))
    print(json.dumps(figures, sort_keys=True))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(figures, f, indent=2, sort_keys=True)
    return 0
