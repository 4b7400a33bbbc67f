"""No test module imports another test module: what tests share lives in tests/support/ (or a
conftest.py), so running one test file never runs, or depends on, another's module code."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _is_test_module(dotted: str) -> bool:
    parts = dotted.split(".")
    return parts[0] == "tests" and any(p.startswith("test_") for p in parts[1:])


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            found += [f"{node.module}.{a.name}" for a in node.names]  # `from tests.x import test_y`
        elif isinstance(node, ast.ImportFrom) and node.level:
            found.append("tests.<relative>")  # relative imports are not used in tests either
    return found


def test_no_test_module_imports_another():
    offenders = {
        str(p.relative_to(TESTS.parent)): bad
        for p in sorted(TESTS.rglob("*.py"))
        if (bad := [m for m in _imports(p) if _is_test_module(m) or m == "tests.<relative>"])
    }
    assert offenders == {}, offenders


def test_the_check_sees_both_forms():
    assert _is_test_module("tests.node.test_node") and _is_test_module("tests.model.test_families")
    assert not _is_test_module("tests.support.node") and not _is_test_module("tests.conftest")
