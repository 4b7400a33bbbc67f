"""The `traceless` console script: the core's commands (`serve`, `node`, `measure`) and the
tools' (`up`, `proxy`, `chat`, `run`, `bench`, `audit`, `attack`, `report`, `eval`, `attest`,
`log`, `gateway`, `relay`, `issuer`), one parser."""

from __future__ import annotations

import argparse

from traceless.cli import parser as core
from traceless.cli.parser import COMMAND_MODULES

TOOL_MODULES = (
    "traceless_tools.cli.generate",
    "traceless_tools.cli.bench",
    "traceless_tools.cli.up",
    "traceless_tools.cli.proxy",
    "traceless_tools.cli.log",
    "traceless_tools.cli.audit",
    "traceless_tools.cli.cluster",
    "traceless_tools.cli.attest",
    "traceless_tools.cli.eval",
)
ALL_MODULES = COMMAND_MODULES + TOOL_MODULES


def build_parser() -> argparse.ArgumentParser:
    return core.build_parser(ALL_MODULES)


def main(argv: list[str] | None = None) -> int:
    return core.main(argv, ALL_MODULES)


__all__ = ["ALL_MODULES", "TOOL_MODULES", "build_parser", "main"]
