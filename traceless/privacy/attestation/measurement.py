"""The measurement of a traceless node: what code, model and configuration it runs, as digests.

With H = SHA-256 and LP(x) = uint32be(len(x)) || x (every variable-length field length-prefixed, so
no two different inputs encode alike):

    code     = H(LP("traceless/measurement/code/v1")  || for each source file, sorted by path:
                 LP(relative POSIX path, UTF-8) || H(file bytes))
    model    = H(file bytes)                          for a single model file (= `sha256sum FILE`)
             = H(LP("traceless/measurement/model-dir/v1") || for each model file, sorted:
                 LP(relative POSIX path) || H(file bytes))     for a model directory
    config   = H(canonical JSON of the node configuration: sorted keys, no whitespace, UTF-8)
    combined = H(LP("traceless/measurement/v1") || LP("code") || code || LP("model") || model
                 || LP("config") || config)

The code digest covers the `traceless` package's sources: `.py`, plus `.c` and `.h` for the
native kernels. Compiled artifacts (`__pycache__/*.pyc`, `.so`) are left out on purpose: they are
not reproducible (the bytes depend on the compiler and Python versions, flags, build paths and
timestamps), so two honest builds of the same source would measure differently and no one could
recompute a published measurement. The sources are what a reviewer reads and a rebuild starts
from. (Closing the gap between reviewed source and the binary actually loaded is what a
hardware-measured launch image is for; see docs/attestation.md.)
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from traceless.errors import InvalidRequestError, ModelNotFoundError

CODE_SUFFIXES = frozenset({".py", ".c", ".h"})
# Files of a model directory that decide what the model computes: weights, tokenizer, configs.
MODEL_SUFFIXES = frozenset(
    {
        ".gguf",
        ".safetensors",
        ".bin",
        ".pt",
        ".pth",
        ".json",
        ".model",
        ".txt",
        ".tiktoken",
        ".jinja",
    }
)
HASH_SIZE = 32


def _lp(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def _file_sha256(path: Path) -> bytes:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").digest()


def _tree_files(root: Path, suffixes: frozenset[str], skip_hidden: bool) -> list[tuple[str, bytes]]:
    """(relative POSIX path, SHA-256) of the matching files under root, sorted by path bytes."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not (skip_hidden and d.startswith("."))]
        for name in filenames:
            path = Path(dirpath) / name
            if path.suffix in suffixes and not (skip_hidden and name.startswith(".")):
                found.append((path.relative_to(root).as_posix(), _file_sha256(path)))
    return sorted(found, key=lambda item: item[0].encode())


def _list_digest(label: str, files: list[tuple[str, bytes]]) -> bytes:
    h = hashlib.sha256(_lp(label.encode()))
    for rel, digest in files:
        h.update(_lp(rel.encode()) + digest)
    return h.digest()


def package_root() -> Path:
    """The directory of the installed `traceless` package."""
    import traceless

    return Path(traceless.__file__).resolve().parent


def code_files(root: Path | None = None) -> list[tuple[str, bytes]]:
    return _tree_files(root or package_root(), CODE_SUFFIXES, skip_hidden=False)


def code_digest(root: Path | None = None) -> bytes:
    return _list_digest("traceless/measurement/code/v1", code_files(root))


def model_digest(path: str | os.PathLike[str]) -> bytes:
    p = Path(path)
    if p.is_file():
        return _file_sha256(p)
    if p.is_dir():
        files = _tree_files(p, MODEL_SUFFIXES, skip_hidden=True)
        if not files:
            raise ModelNotFoundError("model directory holds no weight, tokenizer or config file")
        return _list_digest("traceless/measurement/model-dir/v1", files)
    raise ModelNotFoundError("model path does not exist")


def canonical_json(obj: object) -> bytes:
    try:
        text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        raise InvalidRequestError("configuration must be JSON data (no NaN or infinity)") from None
    return text.encode("utf-8")


def config_digest(config: Mapping[str, object]) -> bytes:
    if not isinstance(config, Mapping):
        raise InvalidRequestError("configuration must be a JSON object")
    return hashlib.sha256(canonical_json(dict(config))).digest()


def combine(code: bytes, model: bytes, config: bytes) -> bytes:
    if not all(len(d) == HASH_SIZE for d in (code, model, config)):
        raise ValueError("component digests are 32 bytes")
    h = hashlib.sha256(_lp(b"traceless/measurement/v1"))
    for label, digest in ((b"code", code), (b"model", model), (b"config", config)):
        h.update(_lp(label) + digest)
    return h.digest()


@dataclass(frozen=True, slots=True)
class Measurement:
    code: bytes
    model: bytes
    config: bytes

    @property
    def combined(self) -> bytes:
        return combine(self.code, self.model, self.config)

    def to_hex(self) -> dict[str, str]:
        return {
            "code": self.code.hex(),
            "model": self.model.hex(),
            "config": self.config.hex(),
            "combined": self.combined.hex(),
        }


def measure(
    model_path: str | os.PathLike[str], config: Mapping[str, object], code_root: Path | None = None
) -> Measurement:
    """Measure this installation's code (or the package at `code_root`), a model and a config."""
    return Measurement(code_digest(code_root), model_digest(model_path), config_digest(config))
