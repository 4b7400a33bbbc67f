"""The `traceless` command line: every argument parser and `register()` lives in this package,
one module per command group (parser.py lists them). Handlers import what they run lazily, so that
parsing arguments never loads torch."""
from __future__ import annotations

from traceless.cli.parser import main

__all__ = ["main"]
