"""`traceless bench ...` commands (argument parsing only; work is imported in the handlers)."""

from __future__ import annotations

import argparse

from traceless.cli.engine_args import add_engine_args, engine_options
from traceless.modes import LoadFormat, choices


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print tables and write JSON")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCH", required=True)

    offline = bench_sub.add_parser(
        "offline",
        help="W1 single stream, W2 batch, W3 long prompts, W4 repetitive on the "
        "offline engine; with --speculative, against plain decoding",
    )
    add_engine_args(offline)
    offline.add_argument("--repeats", type=int, default=3, help="timed runs per workload (median reported)")
    offline.add_argument("--workloads", default="W1,W2,W3", help="comma-separated subset of W1,W2,W3,W4,W5")
    offline.add_argument(
        "--peer",
        choices=("hf",),
        default=None,
        help="also run transformers generate on the same dummy weights and prompts (needs --load-format dummy)",
    )
    offline.add_argument(
        "--json-schema",
        metavar="FILE",
        default=None,
        help="structured decoding: each workload free and constrained by this JSON schema",
    )
    offline.add_argument("--json", metavar="FILE", help="write the report as JSON")
    offline.set_defaults(handler=_offline)

    serve = bench_sub.add_parser("serve", help="online benchmark against any OpenAI-compatible server")
    serve.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    serve.add_argument(
        "--rate", type=float, default=float("inf"), help="requests per second (Poisson); inf = all at once"
    )
    serve.add_argument("--num-prompts", type=int, default=64, help="requests to send")
    serve.add_argument("--input-len", type=int, default=128, help="prompt length in tokens")
    serve.add_argument("--output-len", type=int, default=128, help="output tokens per request (EOS ignored)")
    serve.add_argument("--model", default=None, help="model name (default: the server's first model)")
    serve.add_argument("--api-key", default=None, help="bearer token the server asks for (its --api-key)")
    serve.add_argument("--seed", type=int, default=0, help="seed of the prompts and arrival times")
    serve.add_argument("--no-ignore-eos", action="store_true", help="for servers without the ignore_eos extension")
    serve.add_argument("--json", metavar="FILE", help="write the report as JSON")
    serve.set_defaults(handler=_serve)

    pc = bench_sub.add_parser("prefix-cache", help="TTFT with prefix caching off / isolated / isolated+public / global")
    pc.add_argument(
        "--repeat-system", type=int, default=12, help="length of the long system prompt, in repeats of a paragraph"
    )
    pc.add_argument("--model", default=None, help="GGUF file or Hugging Face directory (default: the built-in model)")
    pc.add_argument("--json", metavar="FILE", help="write the report as JSON")
    pc.set_defaults(handler=_prefix_cache)

    tax = bench_sub.add_parser(
        "privacy-tax",
        help="the private path (traceless up, one node) vs the plaintext server: "
        "tokens/s, requests/s, TTFT, ITL per prompt class",
    )
    tax.add_argument("--classes", default=None, help="comma-separated subset of short,medium,long (default: all)")
    tax.add_argument("--requests", type=int, default=None, help="requests per class, path and repetition (default 10)")
    tax.add_argument("--output-len", type=int, default=None, help="output tokens per request, EOS ignored (default 64)")
    tax.add_argument("--concurrency", type=int, default=None, help="requests in flight (default 4)")
    tax.add_argument("--repeats", type=int, default=None, help="alternating plain/private repetitions (default 4)")
    tax.add_argument("--probes", type=int, default=None, help="sequential 1-token requests per path (default 10)")
    tax.add_argument(
        "--quick", action="store_true", help="a small run: 4 requests, 16 tokens, concurrency 2, 1 repetition"
    )
    tax.add_argument("--model", default=None, help="GGUF file or HF directory (default: the built-in model)")
    tax.add_argument("--device", default=None, help="the engines' device: auto, cpu, cuda (default auto)")
    tax.add_argument(
        "--load-format",
        default=None,
        choices=choices(LoadFormat),
        help="dummy: random weights of --model's config.json shapes (both engines)",
    )
    tax.add_argument(
        "--workdir", default=None, help="keep the services' event logs here (default: a temporary directory)"
    )
    tax.add_argument("--json", metavar="FILE", help="write the report as JSON")
    tax.add_argument("--plot", metavar="PNG", help="plot the overheads per class against the published figures")
    tax.set_defaults(handler=_privacy_tax)

    ko = bench_sub.add_parser("kv-offload", help="throughput under memory pressure: KV offload vs recompute")
    ko.add_argument("--num-prompts", type=int, default=24, help="requests in the batch")
    ko.add_argument("--prompt-len", type=int, default=384, help="prompt length in tokens")
    ko.add_argument("--output-len", type=int, default=192, help="output tokens per request")
    ko.add_argument("--kv-cache-mib", type=int, default=48, help="KV cache size: small, to force preemption")
    ko.add_argument("--model", default=None, help="GGUF file or Hugging Face directory (default: the built-in model)")
    ko.add_argument("--json", metavar="FILE", help="write the report as JSON")
    ko.set_defaults(handler=_kv_offload)


def _offline(args: argparse.Namespace) -> int:
    from traceless_tools.bench import offline

    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = set(names) - {"W1", "W2", "W3", "W4", "W5"}
    if unknown or args.repeats < 1:
        raise SystemExit(f"traceless bench offline: unknown workloads {sorted(unknown)} or repeats < 1")
    try:
        if args.json_schema is not None:
            from traceless_tools.bench import structured

            if args.peer is not None or engine_options(args).get("speculative", "off") != "off":
                raise ValueError("--json-schema runs alone (no --peer, no --speculative)")
            structured.run(
                args.model, args.dtype, args.repeats, names, args.json, engine_options(args), args.json_schema
            )
            return 0
        offline.run(args.model, args.dtype, args.repeats, names, args.json, engine_options(args), args.peer)
    except ValueError as exc:
        raise SystemExit(f"traceless bench offline: {exc}") from None
    return 0


def _serve(args: argparse.Namespace) -> int:
    from traceless_tools.bench.serve import BenchConfig, run

    if args.num_prompts < 1 or args.rate <= 0 or args.input_len < 1 or args.output_len < 1:
        raise SystemExit("traceless bench serve: num-prompts, rate, input-len and output-len must be positive")
    cfg = BenchConfig(
        args.url,
        args.rate,
        args.num_prompts,
        args.input_len,
        args.output_len,
        args.seed,
        args.model,
        args.api_key,
        not args.no_ignore_eos,
    )
    rep = run(cfg, args.json)
    return 0 if rep["failed"] == 0 else 1


def _prefix_cache(args: argparse.Namespace) -> int:
    from traceless_tools.bench.prefix_cache import run

    run(args.repeat_system, args.json, args.model)
    return 0


def _kv_offload(args: argparse.Namespace) -> int:
    from traceless_tools.bench.kv_offload import run

    run(args.num_prompts, args.prompt_len, args.output_len, args.kv_cache_mib, args.json, args.model)
    return 0


def _privacy_tax(args: argparse.Namespace) -> int:
    from traceless_tools.bench.privacy_tax import config_from, run
    from traceless_tools.local.up import StartupError

    classes = tuple(c.strip() for c in args.classes.split(",") if c.strip()) if args.classes else None
    try:
        cfg = config_from(
            args.quick,
            classes=classes,
            requests=args.requests,
            output_len=args.output_len,
            concurrency=args.concurrency,
            repeats=args.repeats,
            probes=args.probes,
            model=args.model,
            workdir=args.workdir,
            device=args.device,
            load_format=args.load_format,
        )
    except ValueError as exc:
        raise SystemExit(f"traceless bench privacy-tax: {exc}") from None
    try:
        rep = run(cfg, args.json, args.plot)
    except StartupError as exc:
        raise SystemExit(f"traceless bench privacy-tax: the private path did not start: {exc}") from None
    return 0 if rep["failed"] == 0 else 1
