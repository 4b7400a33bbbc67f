"""`traceless` command line. Each command group registers itself from its own module; modules
listed here must import nothing heavy at module level (torch is imported inside handlers)."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading

from traceless.errors import ConfigError, ModelLoadError, ModelNotFoundError

# Modules exposing `register(subparsers)`; each adds one or more subcommands. These are the
# trusted core's commands (what a node image runs); `traceless_tools.cli` adds the tools' commands
# to the same parser for the `traceless` console script.
COMMAND_MODULES = (
    "traceless.cli.serve",
    "traceless.cli.node",
    "traceless.cli.measure",
)


USAGE_ERROR = 2  # argparse's own status for a bad command line; configuration errors share it
INTERRUPTED = 130  # a shell's status for a command ended by Ctrl-C (128 + SIGINT)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless the help already says it or there is
    nothing to show (unset, off, empty)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default in (None, False, [], (), "") or action.default is argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


def build_parser(modules: tuple[str, ...] = COMMAND_MODULES) -> argparse.ArgumentParser:
    from traceless import __version__

    parser = argparse.ArgumentParser(
        prog="traceless",
        description="traceless: LLM inference for private cloud compute",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"traceless {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in modules:
        importlib.import_module(name).register(sub)
    _format_all(parser)
    return parser


def _format_all(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.formatter_class = HelpFormatter
                _format_all(sub)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def check(args: argparse.Namespace) -> None:
    """A command's own requirements that argparse cannot state (options that go together, one
    required unless another is off), as its handler checks them first (raising its CommandError or
    SystemExit): deployment tests run it on every manifest's command line."""
    requirements = getattr(args, "check", None)
    if requirements is not None:
        requirements(args)


def main(argv: list[str] | None = None, modules: tuple[str, ...] = COMMAND_MODULES) -> int:
    args = build_parser(modules).parse_args(argv)
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
    except (ConfigError, ModelNotFoundError, ModelLoadError) as exc:
        print(f"traceless {args.command}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        # the commands' own refusals (`raise SystemExit("traceless node: ...")`): one line, status 2
        print(exc.code, file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        # Ctrl-C or a stop signal: the command's `finally` blocks have run; no traceback.
        print(f"traceless {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
