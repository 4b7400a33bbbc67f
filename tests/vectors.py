"""The known-answer vectors the tests check the protocol code against, inside the repository.

`tests/data/vectors/` is a byte-for-byte copy of the project's standard vectors (RFC appendices,
transparency-dev probes, vendor attestation evidence); its README gives each file's source and
`SHA256SUMS.txt` their digests (checked by tests/test_vectors.py). Files the shared set lacks sit
beside it in `tests/data/`. A missing file fails the test, never skips it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).resolve().parent / "data"
VECTORS = DATA / "vectors"


def vector_path(relative: str) -> Path:
    path = VECTORS / relative
    if not path.exists():
        pytest.fail(f"known-answer vectors missing: {path}", pytrace=False)
    return path


def load_json(path: Path) -> Any:
    if not path.is_file():
        pytest.fail(f"known-answer vectors missing: {path}", pytrace=False)
    with path.open("rb") as f:
        return json.load(f)


def shared_vectors(relative: str) -> Any:
    """JSON from tests/data/vectors/<relative>."""
    return load_json(VECTORS / relative)


def local_vectors(name: str) -> Any:
    """JSON from tests/data/<name> (vectors the standard set does not hold)."""
    return load_json(DATA / name)
