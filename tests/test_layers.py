"""The package's imports point one way (docs/architecture.md draws the arrows). Every import counts,
lazy ones inside functions included: a forbidden arrow is forbidden wherever it is written."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "traceless"

SERVING = ("traceless.engine", "traceless.runner", "traceless.model", "traceless.server", "traceless.node",
           "traceless.cluster", "traceless.client", "traceless.http", "traceless.cli", "traceless.local",
           "traceless.audit", "traceless.bench", "traceless.report", "traceless.entrypoints")

# (importing package, forbidden targets, allowed exceptions inside them)
RULES = [
    ("traceless.engine", ("torch", "traceless.runner", "traceless.model", "traceless.server", "traceless.node",
                          "traceless.cluster", "traceless.client", "traceless.http", "traceless.entrypoints"),
     ("traceless.model.tokenizer",)),
    ("traceless.model", ("traceless.runner", "traceless.engine", "traceless.server", "traceless.node",
                         "traceless.cluster", "traceless.entrypoints"), ()),
    ("traceless.runner", ("traceless.engine", "traceless.server", "traceless.node", "traceless.cluster",
                          "traceless.entrypoints"), ("traceless.engine.step_io",)),
    ("traceless.privacy", SERVING, ()),
    ("traceless.http", ("traceless.engine", "traceless.runner", "traceless.model", "traceless.server",
                        "traceless.node", "traceless.cluster", "traceless.client", "traceless.entrypoints"), ()),
    ("traceless.server", ("traceless.node", "traceless.cluster", "traceless.client", "traceless.runner",
                          "traceless.model"), ()),
    ("traceless.node", ("traceless.cluster", "traceless.client", "traceless.runner", "traceless.model"), ()),
    ("traceless.cluster", ("traceless.server", "traceless.engine", "traceless.runner", "traceless.model",
                           "traceless.node", "traceless.client", "torch"), ()),
    ("traceless.client", ("traceless.server", "traceless.engine", "traceless.runner", "traceless.model",
                          "traceless.node", "traceless.cluster", "torch"), ()),
    ("traceless.audit", ("traceless.bench",), ()),
    ("traceless.bench", ("traceless.audit",), ()),
    # structured outputs: a library under the engine and the server (no torch, nothing that serves)
    ("traceless.structured", ("torch",) + SERVING, ("traceless.model.tokenizer",)),
]


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module(path)
        for importer, forbidden, allowed in RULES:
            if not _within(module, importer):
                continue
            for name in sorted(imports_of(path)):
                if any(_within(name, a) for a in allowed):
                    continue
                if any(_within(name, f) for f in forbidden):
                    out.append(f"{module} -> {name}")
    return out


def test_imports_point_one_way():
    assert violations() == []


@pytest.mark.parametrize("importer,target", [("traceless.engine.x", "torch"),
                                             ("traceless.runner.x", "traceless.engine.request"),
                                             ("traceless.privacy.x", "traceless.server.app"),
                                             ("traceless.cluster.gateway", "traceless.node.app")])
def test_the_rules_catch_a_wrong_arrow(tmp_path, importer, target):
    """The checker itself: a module written with a forbidden import is reported."""
    for pkg, forbidden, allowed in RULES:
        if _within(importer, pkg):
            assert any(_within(target, f) for f in forbidden) and not any(_within(target, a) for a in allowed)
            break
    else:
        pytest.fail("no rule covers " + importer)
    src = tmp_path / "m.py"
    src.write_text(f"def f():\n    import {target}\n")
    assert target in imports_of(src)
