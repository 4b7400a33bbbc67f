"""`traceless attack ...` and `traceless audit ...` (argument parsing only)."""

from __future__ import annotations

import argparse

from traceless.modes import DType, LoadFormat, choices


def register(sub: argparse._SubParsersAction) -> None:
    report = sub.add_parser("report", help="run the benchmarks, attacks and audits (quick) into one HTML page")
    report.add_argument("--output", "-o", default="traceless-report.html", help="the HTML page to write")
    report.add_argument(
        "--only",
        default=None,
        help="comma-separated sections: offline, privacy_tax, prefix_timing, "
        "targeting, residue, prefix_cache, kv_offload",
    )
    report.set_defaults(handler=_report)
    attack = sub.add_parser("attack", help="run published attacks against live services")
    attack_sub = attack.add_subparsers(dest="attack_command", metavar="ATTACK", required=True)
    pt = attack_sub.add_parser("prefix-timing", help="prefix-cache timing attack: global vs isolated cache")
    pt.add_argument("--trials", type=int, default=40, help="probes per cache mode")
    pt.add_argument("--prefix-tokens", type=int, default=512, help="length of the victim's secret prefix")
    pt.add_argument("--model", default=None, help="GGUF file or Hugging Face directory (default: the built-in model)")
    pt.add_argument("--seed", type=int, default=0, help="seed of the prompts and probes")
    pt.add_argument("--json", metavar="FILE", help="write the report as JSON")
    pt.add_argument("--plot", metavar="PNG", help="plot the result to this PNG file")
    pt.set_defaults(handler=_prefix_timing)
    ss = attack_sub.add_parser(
        "stream-shape",
        help="classify prompts from the relay's view of encrypted streams "
        "(Whisper Leak): shape hiding off vs the node's defaults",
    )
    ss.add_argument("--topics", type=int, default=4, help="how many of the built-in topic prompts (2 to 6)")
    ss.add_argument("--trials", type=int, default=12, help="traces per topic and mode")
    ss.add_argument("--max-tokens", type=int, default=32, help="output tokens per answer")
    ss.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of the answers")
    ss.add_argument(
        "--lengths",
        choices=("fixed", "natural", "both"),
        default="both",
        help="answers of a fixed length (EOS ignored), of their natural length (EOS ends them: their "
        "length shows as the stream's duration), or both readings (default)",
    )
    ss.add_argument(
        "--load",
        type=int,
        default=0,
        metavar="N",
        help="run N CPU-bound processes beside the node (a loaded machine; default 0)",
    )
    ss.add_argument("--folds", type=int, default=4, help="cross-validation folds")
    ss.add_argument("--model", default=None, help="GGUF file or Hugging Face directory (default: the built-in model)")
    ss.add_argument("--seed", type=int, default=0, help="seed of the sampling and the classifier")
    ss.add_argument("--json", metavar="FILE", help="write the report as JSON")
    ss.add_argument("--plot", metavar="PNG", help="plot the result to this PNG file")
    ss.set_defaults(handler=_stream_shape)

    audit = sub.add_parser("audit", help="measure the privacy properties of the real code")
    audit_sub = audit.add_subparsers(dest="audit_command", metavar="AUDIT", required=True)
    tg = audit_sub.add_parser(
        "targeting",
        help="P(target's request lands on attacker nodes) vs their "
        "capacity share: ours on the real gateway vs simulated production routers",
    )
    tg.add_argument(
        "--capacities",
        type=_floats,
        default=(1.0, 2.0, 3.0, 4.0),
        help="node capacities, comma-separated (default 1,2,3,4)",
    )
    tg.add_argument(
        "--attacker-nodes",
        type=_ints,
        default=(0, 1),
        help="indices of the attacker's nodes, comma-separated (default 0,1)",
    )
    tg.add_argument("--requests", type=int, default=2000, help="target requests per policy x strategy")
    tg.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed every random source, the gateway's included (default: the gateway's CSPRNG)",
    )
    tg.add_argument(
        "--linking-trials",
        type=int,
        default=30,
        help="attack and honest trials per linking/log attack (unique challenge, issuer key tagging, "
        "log fork; default 30, 0 = skip them)",
    )
    tg.add_argument("--json", metavar="FILE", help="write the report as JSON")
    tg.add_argument("--plot", metavar="PNG", help="plot the result to this PNG file")
    tg.set_defaults(handler=_targeting)
    rs = audit_sub.add_parser("residue", help="send canaries through every path, then look for traces everywhere")
    rs.add_argument("--model", default=None, help="GGUF file or Hugging Face directory (default: the built-in model)")
    rs.add_argument("--ttl", type=float, default=3.0, help="the node's prefix-cache TTL (seconds) during the audit")
    rs.add_argument(
        "--scrub",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the node with freed-memory scrubbing, its default (--no-scrub to see what it removes)",
    )
    rs.add_argument(
        "--load",
        type=int,
        default=0,
        metavar="N",
        help="run N CPU-bound processes beside the audited servers: threads are scheduled late, "
        "so idle scrubbing that relies on timing fails (default 0)",
    )
    rs.add_argument(
        "--device",
        choices=("node", "cuda", "cpu"),
        default="node",
        help="node: canaries through a real node over OHTTP (host memory, files, logs); cuda: an "
        "in-process engine on the GPU, then all free device memory and the KV pool searched for "
        "the canaries' token ids and K/V rows; cpu: the same search on the CPU (its twin)",
    )
    rs.add_argument(
        "--load-format",
        choices=choices(LoadFormat),
        default="auto",
        help="--device cuda/cpu: dummy = random weights of --model's config.json shapes",
    )
    rs.add_argument("--dtype", default="auto", choices=choices(DType), help="--device cuda/cpu: the engine's dtype")
    rs.add_argument("--json", metavar="FILE", help="write the report as JSON")
    rs.set_defaults(handler=_residue)
    fl = audit_sub.add_parser(
        "faults",
        help="kill and stall each component of `traceless up` under load (8 openai "
        "clients through the proxy): failures, statuses, time to recover",
    )
    fl.add_argument(
        "--faults",
        default=None,
        help="comma-separated: node_kill, node_stop, gateway_restart, issuer_restart, relay_restart, "
        "offload_full (default: all; offload_full needs root for its tmpfs)",
    )
    fl.add_argument("--quick", action="store_true", help="only node_kill (and the final kill -9 of up)")
    fl.add_argument("--model", default=None, help="the nodes' model (default: the default model)")
    fl.add_argument("--node-args", default="", help='extra options for every node, e.g. "--dtype float32"')
    fl.add_argument("--stall", type=float, default=20.0, help="seconds a node is stopped (SIGSTOP) in node_stop")
    fl.add_argument(
        "--recover-bound",
        type=float,
        default=90.0,
        help="seconds within which a component must serve again and users stop seeing failures",
    )
    fl.add_argument("--json", metavar="FILE", help="write the report as JSON")
    fl.set_defaults(handler=_faults)


def _prefix_timing(args: argparse.Namespace) -> int:
    from traceless_tools.audit.prefix_timing import AttackConfig, run

    if args.trials < 4 or args.prefix_tokens < 16:
        raise SystemExit("traceless attack prefix-timing: use at least 4 trials and a 16-token prefix")
    run(AttackConfig(args.trials, args.prefix_tokens, args.model, args.seed), args.json, args.plot)
    return 0


def _stream_shape(args: argparse.Namespace) -> int:
    from traceless_tools.audit.stream_shape import TOPICS, StreamAttackConfig, run

    if not 2 <= args.topics <= len(TOPICS):
        raise SystemExit(f"traceless attack stream-shape: --topics must be 2 to {len(TOPICS)}")
    try:
        lengths = ("fixed", "natural") if args.lengths == "both" else (args.lengths,)
        cfg = StreamAttackConfig(
            TOPICS[: args.topics],
            args.trials,
            args.max_tokens,
            args.temperature,
            folds=args.folds,
            model=args.model,
            seed=args.seed,
            lengths=lengths,
            load=args.load,
        )
    except ValueError as exc:
        raise SystemExit(f"traceless attack stream-shape: {exc}") from None
    run(cfg, args.json, args.plot)
    return 0


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated numbers, e.g. 1,2,3,4") from None


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated node indices, e.g. 0,1") from None


def _targeting(args: argparse.Namespace) -> int:
    from traceless_tools.audit.targeting import run
    from traceless_tools.audit.targeting_estimate import Scenario

    if args.requests < 100 or args.linking_trials < 0:
        raise SystemExit(
            "traceless audit targeting: use at least 100 target requests per row and --linking-trials >= 0"
        )
    try:
        scenario = Scenario(args.capacities, frozenset(args.attacker_nodes), args.requests, args.seed)
    except ValueError as exc:
        raise SystemExit(f"traceless audit targeting: {exc}") from None
    run(scenario, args.json, args.plot, linking_trials=args.linking_trials)
    return 0


def _residue(args: argparse.Namespace) -> int:
    if args.device != "node":
        from traceless_tools.audit.gpu_residue import GpuResidueConfig
        from traceless_tools.audit.gpu_residue import run as run_device

        if args.model is None:
            raise SystemExit("traceless audit residue --device cuda/cpu: give --model (a directory with config.json)")
        device_report = run_device(GpuResidueConfig(args.model, args.load_format, args.device, args.dtype), args.json)
        return 0 if device_report["clean"] else 1
    from traceless_tools.audit.residue import ResidueConfig, run

    try:
        cfg = ResidueConfig(args.model, args.ttl, args.scrub, args.load)
    except ValueError as exc:
        raise SystemExit(f"traceless audit residue: {exc}") from None
    report = run(cfg, args.json)
    return 1 if report["failed"] else 0


def _faults(args: argparse.Namespace) -> int:
    from traceless_tools.audit.faults import FAULTS, QUICK_FAULTS, FaultConfig, run

    names = tuple(x.strip() for x in args.faults.split(",")) if args.faults else FAULTS
    try:
        cfg = FaultConfig(
            args.model,
            QUICK_FAULTS if args.quick else names,
            stall_s=args.stall,
            recover_bound_s=args.recover_bound,
            node_args=tuple(args.node_args.split()),
        )
    except ValueError as exc:
        raise SystemExit(f"traceless audit faults: {exc}") from None
    return 0 if run(cfg, args.json)["passed"] else 1


def _report(args: argparse.Namespace) -> int:
    from traceless_tools.report.html import run, sections

    only = [x.strip() for x in args.only.split(",")] if args.only else None
    known = {s.key for s in sections()}
    if only and set(only) - known:
        raise SystemExit(f"traceless report: unknown sections {sorted(set(only) - known)}; known: {sorted(known)}")
    run(args.output, only)
    return 0
