"""Locate and load the shared known-answer vectors (../shared/vectors from the repository root).

The path is computed from this file, so it works from any checkout at /work/<name>. A missing
file is a test failure, never a skip: the vectors are what the protocol code is checked against.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_VECTORS = REPO_ROOT / ".." / "shared" / "vectors"
LOCAL_DATA = Path(__file__).resolve().parent / "data"


def load_json(path: Path) -> Any:
    if not path.is_file():
        pytest.fail(f"known-answer vectors missing: {path}", pytrace=False)
    with path.open("rb") as f:
        return json.load(f)


def shared_vectors(relative: str) -> Any:
    """JSON from ../shared/vectors/<relative>; fails the test if it is missing."""
    return load_json(SHARED_VECTORS / relative)


def local_vectors(name: str) -> Any:
    """JSON from tests/privacy/data/<name> (vectors not yet in the shared set)."""
    return load_json(LOCAL_DATA / name)
