"""traceless: LLM inference for private cloud compute.

`from traceless import LLM, SamplingParams` gives the offline API. The names are resolved lazily so
that light modules (the CLI's argument parsing, the privacy library, the benchmark workloads) can
be imported without loading torch.
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "LLM": "traceless.entrypoints.llm",
    "SamplingParams": "traceless.sampling_params",
    "RequestOutput": "traceless.outputs",
    "CompletionOutput": "traceless.outputs",
}

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "__version__"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'traceless' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
