"""Known-answer vectors for the token tests (RFC 9474, RFC 9577/9578), from tests/data/vectors.
A missing file raises: the tests fail rather than skip when their vectors are not there.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.vectors import VECTORS

VECTORS_DIR = VECTORS
RSABSSA_FILE = VECTORS_DIR / "rsabssa" / "rfc9474-appendix-a.json"
PRIVACYPASS_FILE = VECTORS_DIR / "privacypass" / "rfc9577-rfc9578-appendix-a.json"
HEADERS_FILE = VECTORS_DIR / "privacypass" / "rfc9577-appendix-a-http-headers.txt"

TYPE2_SECTION = "Issuance Protocol 2 - Blind RSA, 2048 {#test-vectors-rsa}"
CHALLENGE_SECTION = "Challenge and Redemption Structure Test Vectors"


def load_json(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"test vectors missing: {path}")
    return json.loads(path.read_text())


def rsabssa_vectors() -> list[dict]:
    return load_json(RSABSSA_FILE)["vectors"]


def type2_issuance_vectors() -> list[dict]:
    return load_json(PRIVACYPASS_FILE)["RFC9578"][TYPE2_SECTION]


def challenge_vectors() -> list[dict]:
    return load_json(PRIVACYPASS_FILE)["RFC9577"][CHALLENGE_SECTION]


def header_vector_blocks() -> list[dict[str, str]]:
    """Parse the RFC 9577 A.2 header file into blocks of {field: value}.

    The file folds long values over several lines with no separator ("line folding is for
    document formatting only"), so continuation lines are joined with nothing in between.
    A field starts at a line `name: value` whose name is a known field; blocks are
    separated by blank lines; lines starting with '#' are comments.
    """
    if not HEADERS_FILE.is_file():
        raise FileNotFoundError(f"test vectors missing: {HEADERS_FILE}")
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    last_field = None
    for line in HEADERS_FILE.read_text().splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            last_field = None
            if "WWW-Authenticate" in current:
                blocks.append(current)
                current = {}
            continue
        name, sep, value = line.partition(": ")
        if sep and _is_field_name(name):
            last_field = name
            current[name] = value
        elif last_field is not None:
            current[last_field] += line
        else:
            raise ValueError("header vector file: continuation line without a field")
    if current:
        blocks.append(current)
    return blocks


def _is_field_name(name: str) -> bool:
    if name == "WWW-Authenticate":
        return True
    base, _, index = name.rpartition("-")
    return index.isdigit() and base in ("token-type", "token-key", "max-age", "token-challenge")
