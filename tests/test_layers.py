"""The packages' imports point one way (docs/architecture.md draws the arrows). Every import counts,
lazy ones inside functions included: a forbidden arrow is forbidden wherever it is written. The
trusted core (`traceless`, what a node runs and measures) never imports the tools
(`traceless_tools`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (ROOT / "traceless", ROOT / "traceless_tools")

# the core's serving packages, and the tools that run them
SERVING = (
    "traceless.engine",
    "traceless.runner",
    "traceless.model",
    "traceless.server",
    "traceless.node",
    "traceless.http",
    "traceless.cli",
    "traceless.entrypoints",
    "traceless_tools",
)

# (importing package, forbidden targets, allowed exceptions inside them)
RULES = [
    # the trusted core never imports a tool: a node measures and runs `traceless` alone
    ("traceless", ("traceless_tools",), ()),
    (
        "traceless.engine",
        (
            "torch",
            "traceless.runner",
            "traceless.model",
            "traceless.server",
            "traceless.node",
            "traceless.http",
            "traceless.entrypoints",
        ),
        ("traceless.model.tokenizer",),
    ),
    (
        "traceless.model",
        ("traceless.runner", "traceless.engine", "traceless.server", "traceless.node", "traceless.entrypoints"),
        (),
    ),
    (
        "traceless.runner",
        ("traceless.engine", "traceless.server", "traceless.node", "traceless.entrypoints"),
        ("traceless.engine.step_io",),
    ),
    ("traceless.privacy", SERVING, ()),
    (
        "traceless.http",
        (
            "traceless.engine",
            "traceless.runner",
            "traceless.model",
            "traceless.server",
            "traceless.node",
            "traceless.entrypoints",
        ),
        (),
    ),
    ("traceless.server", ("traceless.node", "traceless.runner", "traceless.model"), ()),
    ("traceless.node", ("traceless.runner", "traceless.model"), ()),
    # the untrusted hops and the client run no engine
    (
        "traceless_tools.cluster",
        (
            "traceless.server",
            "traceless.engine",
            "traceless.runner",
            "traceless.model",
            "traceless.node",
            "traceless_tools.client",
            "torch",
        ),
        (),
    ),
    (
        "traceless_tools.client",
        (
            "traceless.server",
            "traceless.engine",
            "traceless.runner",
            "traceless.model",
            "traceless.node",
            "traceless_tools.cluster",
            "torch",
        ),
        (),
    ),
    ("traceless_tools.audit", ("traceless_tools.bench",), ()),
    ("traceless_tools.bench", ("traceless_tools.audit",), ()),
    # structured outputs: a library under the engine and the server (no torch, nothing that serves)
    ("traceless.structured", ("torch",) + SERVING, ("traceless.model.tokenizer",)),
]


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
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
    for path in sorted(p for package in PACKAGES for p in package.rglob("*.py")):
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


@pytest.mark.parametrize(
    "importer,target",
    [
        ("traceless.node.x", "traceless_tools.client.private_client"),
        ("traceless.cli.x", "traceless_tools.cli.up"),
        ("traceless.engine.x", "torch"),
        ("traceless.runner.x", "traceless.engine.request"),
        ("traceless.privacy.x", "traceless.server.app"),
        ("traceless_tools.cluster.gateway", "traceless.node.app"),
    ],
)
def test_the_rules_catch_a_wrong_arrow(tmp_path, importer, target):
    """The checker itself: a module written with a forbidden import is reported."""
    covering = [(forbidden, allowed) for pkg, forbidden, allowed in RULES if _within(importer, pkg)]
    if not covering:
        pytest.fail("no rule covers " + importer)
    assert any(
        any(_within(target, f) for f in forbidden) and not any(_within(target, a) for a in allowed)
        for forbidden, allowed in covering
    )
    src = tmp_path / "m.py"
    src.write_text(f"def f():\n    import {target}\n")
    assert target in imports_of(src)
