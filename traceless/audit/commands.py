"""`traceless attack ...` and `traceless audit ...` (argument parsing only)."""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    attack = sub.add_parser("attack", help="run published attacks against live services")
    attack_sub = attack.add_subparsers(dest="attack_command", metavar="ATTACK", required=True)
    pt = attack_sub.add_parser("prefix-timing", help="prefix-cache timing attack: global vs isolated cache")
    pt.add_argument("--trials", type=int, default=40, help="probes per cache mode")
    pt.add_argument("--prefix-tokens", type=int, default=512, help="length of the victim's secret prefix")
    pt.add_argument("--model", default=None)
    pt.add_argument("--seed", type=int, default=0)
    pt.add_argument("--json", metavar="FILE")
    pt.add_argument("--plot", metavar="PNG")
    pt.set_defaults(handler=_prefix_timing)


def _prefix_timing(args: argparse.Namespace) -> int:
    from traceless.audit.prefix_timing import AttackConfig, run

    if args.trials < 4 or args.prefix_tokens < 16:
        raise SystemExit("traceless attack prefix-timing: use at least 4 trials and a 16-token prefix")
    run(AttackConfig(args.trials, args.prefix_tokens, args.model, args.seed), args.json, args.plot)
    return 0
