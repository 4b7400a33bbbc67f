"""The trusted core's command line (`python -m traceless.cli`): `serve`, `node` and `measure`,
what a node image runs. Every argument parser and `register()` lives in this package, one module
per command group (parser.py lists them); handlers import what they run lazily, so that parsing
arguments never loads torch. The `traceless` console script is `traceless_tools.cli`: these
commands and the tools'."""

from __future__ import annotations

from traceless.cli.parser import main

__all__ = ["main"]
