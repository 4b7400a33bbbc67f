"""`traceless` command line. Each command group registers itself from its own module; modules
listed here must import nothing heavy at module level (torch is imported inside handlers)."""
from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading

# Modules exposing `register(subparsers)`; each adds one or more subcommands.
COMMAND_MODULES = (
    "traceless.cli.generate",
    "traceless.cli.bench",
    "traceless.cli.serve",
    "traceless.cli.node",
    "traceless.cli.proxy",
    "traceless.cli.log",
    "traceless.cli.audit",
    "traceless.cli.cluster",
    "traceless.cli.attest",
    "traceless.cli.eval",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="traceless", description="traceless: LLM inference for private cloud compute")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def check(args: argparse.Namespace) -> None:
    """A command's own requirements that argparse cannot state (options that go together, one
    required unless another is off), as its handler checks them first (raising its CommandError or
    SystemExit): deployment tests run it on every manifest's command line."""
    requirements = getattr(args, "check", None)
    if requirements is not None:
        requirements(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # `kill`, a closed terminal or a service manager's stop take the same clean path as Ctrl-C:
    # commands that start services (up, benches, audits) stop them in their `finally` blocks
    # instead of leaving them orphaned. SIGINT is set too: a shell starts background jobs with
    # it ignored. Servers replace these with uvicorn's own graceful-shutdown handlers.
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, _interrupt)
    try:
        return int(args.handler(args) or 0)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
