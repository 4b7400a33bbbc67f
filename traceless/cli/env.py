"""Environment variables that give command options their defaults: the one place they are listed.

A container platform configures a service through its environment (a Kubernetes manifest sets it,
a Secret can fill it without the value showing in the pod's arguments or in `ps`). An option given
on the command line wins over its variable; a variable that is set but empty counts as unset.
docs/deploy.md shows the table `traceless` prints with `describe()`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

# variable -> (the options it fills, what it holds)
VARIABLES: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "TRACELESS_GATEWAY_URL": ("node --gateway, relay --gateway", "base URL of the gateway"),
        "TRACELESS_PUBLIC_URL": ("node --public-url", "URL the gateway reaches this node at"),
        "TRACELESS_ISSUER_URL": ("gateway --issuer, proxy --issuer", "base URL of the token issuer"),
        "TRACELESS_REGISTER_SECRET": ("gateway --register-secret", "secret nodes present to register"),
        "TRACELESS_API_KEYS_FILE": ("issuer --api-keys", "path of the JSON file {api_key: user_id}"),
        "TRACELESS_RELAY_URL": ("proxy --relay", "base URL of the OHTTP relay"),
        "TRACELESS_LOG_URL": ("proxy --log, log witness --log", "base URL of the transparency log"),
        "TRACELESS_LOG_PUBLIC_KEY": (
            "proxy --log-public-key, log witness --log-public-key",
            "the log's Ed25519 public key, base64",
        ),
        "TRACELESS_LOG_DIR": ("log serve --dir, log append --dir", "directory of the transparency log"),
        "TRACELESS_API_KEY": ("serve --api-key", "bearer token every request but /health must carry"),
        "VLLM_API_KEY": ("serve --api-key", "vLLM's name for it (TRACELESS_API_KEY wins)"),
    }
)


def env_value(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable's value, or None when it is unset or empty."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not one of traceless's environment variables")
    value = (os.environ if environ is None else environ).get(name, "")
    return value or None


def add_env_argument(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str, variable: str, **kwargs: Any
) -> argparse.Action:
    """parser.add_argument(flag, ...) whose default comes from `variable`; `required=True` then
    means: required unless the variable is set. The help text names the variable."""
    value = env_value(variable)
    required = bool(kwargs.pop("required", False)) and value is None
    default = value if value is not None else kwargs.pop("default", None)
    kwargs.pop("default", None)
    help_text = str(kwargs.pop("help", "")).rstrip()
    help_text = f"{help_text} (env {variable})" if help_text else f"env {variable}"
    return parser.add_argument(flag, default=default, required=required, help=help_text, **kwargs)


def describe() -> str:
    """The table of variables, for docs and `--help` epilogs."""
    width = max(len(name) for name in VARIABLES)
    return "\n".join(f"{name:<{width}}  {options}: {what}" for name, (options, what) in VARIABLES.items())
