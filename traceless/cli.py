"""`traceless` command line. Each command group registers itself from its own module; modules
listed here must import nothing heavy at module level (torch is imported inside handlers)."""
from __future__ import annotations

import argparse
import importlib
import sys

# Modules exposing `register(subparsers)`; each adds one or more subcommands.
COMMAND_MODULES = (
    "traceless.entrypoints.commands",
    "traceless.bench.commands",
    "traceless.server.commands",
    "traceless.cluster.node_commands",
    "traceless.client.commands",
    "traceless.cluster.log_commands",
    "traceless.audit.commands",
    "traceless.cluster.commands",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="traceless", description="traceless: LLM inference for private cloud compute")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
