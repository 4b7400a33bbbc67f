"""House rules on the repository's text: no pointer to an issue tracker's number or to a document
outside the repository, and every threat cited ("threat T7") is one docs/threat-model.md defines."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = (
    "traceless",
    "traceless_tools",
    "tests",
    "docs",
    "bench",
    "deploy",
    "README.md",
    "Makefile",
    "pyproject.toml",
)
SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".c", ".h", ".jinja", ".txt", ""}
# third-party data kept byte for byte (licences, vendor samples) and recorded results
SKIPPED = (ROOT / "tests" / "data", ROOT / "bench" / "results")

# Written in pieces so that this file does not match itself.
ISSUE_NUMBER = re.compile(r"\bissue" + r"s?\s+#?\d+|\bfinding" + r"s?\s+\d+|\b#\d+\s+finding", re.IGNORECASE)
OUTSIDE_DOC = re.compile(r"\bDESIGN" + r"(\.md|\s+(section|invariant))|\.\./shared|\.\./peer/")
THREAT_HEADING = re.compile(r"^### T(\d+)\. ", re.MULTILINE)
THREAT_LINE = re.compile(r"threat", re.IGNORECASE)
THREAT_NUMBER = re.compile(r"\bT(\d+)\b")


def _text_files():
    for name in SCANNED:
        path = ROOT / name
        paths = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for p in paths:
            if p.suffix not in SUFFIXES or any(p.is_relative_to(s) for s in SKIPPED):
                continue
            if "__pycache__" in p.parts or p.name.endswith((".so", ".pyc")):
                continue
            try:
                yield p, p.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue


def _hits(pattern: re.Pattern[str]) -> list[str]:
    return [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p, text in _text_files()
        for n, line in enumerate(text.splitlines(), 1)
        if pattern.search(line)
    ]


def test_no_issue_numbers():
    assert _hits(ISSUE_NUMBER) == [], "point to a threat in docs/threat-model.md, or say it in plain words"


def test_no_documents_outside_the_repository():
    assert _hits(OUTSIDE_DOC) == []


def _defined_threats() -> list[int]:
    return [int(n) for n in THREAT_HEADING.findall((ROOT / "docs" / "threat-model.md").read_text())]


def test_threats_are_numbered_once_in_order():
    defined = _defined_threats()
    assert defined == list(range(1, len(defined) + 1))


def test_every_cited_threat_exists():
    defined = set(_defined_threats())
    missing = [
        f"{p.relative_to(ROOT)}:{n}: T{t}"
        for p, text in _text_files()
        for n, line in enumerate(text.splitlines(), 1)
        if THREAT_LINE.search(line)
        for t in map(int, THREAT_NUMBER.findall(line))
        if t not in defined
    ]
    assert missing == []


def test_the_checks_see_a_reference_when_there_is_one():
    assert ISSUE_NUMBER.search("as issue " + "12 found") and ISSUE_NUMBER.search("(finding " + "5)")
    assert OUTSIDE_DOC.search("see DESIGN" + " invariant 4")
    assert not ISSUE_NUMBER.search("the issuer 2 keys")
    assert THREAT_NUMBER.findall("threats T13 and T14") == ["13", "14"]
