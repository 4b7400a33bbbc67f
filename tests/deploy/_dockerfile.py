"""A small reader of deploy/Dockerfile and .dockerignore, enough to check what the image holds."""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from traceless.cli.isolation import boot_argv

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
# The node image's isolated start: the interpreter's flags and the folder the image copies traceless/ into
NODE_BOOT = boot_argv("/opt/venv/bin/python", "/opt/traceless")


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, keyword: str) -> list[str]:
        return [value for key, value in self.instructions if key == keyword]


@dataclass
class Dockerfile:
    args: dict[str, str]  # global ARGs (before the first FROM) and their defaults
    stages: dict[str, Stage]

    def resolve(self, text: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: self.args.get(m.group(1), m.group(0)), text)

    def env(self, name: str) -> dict[str, str]:
        """The variables a final stage's ENV instructions set (KEY=VALUE pairs, the nearest wins)."""
        out: dict[str, str] = {}
        for stage in reversed(self.lineage(name)):
            for value in stage.values("ENV"):
                out.update(pair.split("=", 1) for pair in value.split())
        return out

    def lineage(self, name: str) -> list[Stage]:
        """The stage and the stages it is built FROM, nearest first."""
        chain = [self.stages[name]]
        while chain[-1].base in self.stages:
            chain.append(self.stages[chain[-1].base])
        return chain


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, rest) per instruction: comments dropped, continuation lines joined."""
    out, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, rest = full.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def parse(path: Path = DOCKERFILE) -> Dockerfile:
    args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for keyword, rest in instructions(path.read_text()):
        if keyword == "FROM":
            parts = rest.split()
            base = parts[0]
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else f"stage{len(stages)}"
            current = stages[name] = Stage(name, base)
        elif current is None and keyword == "ARG":
            key, _, default = rest.partition("=")
            args[key] = default
        elif current is not None:
            current.instructions.append((keyword, rest))
    return Dockerfile(args, stages)


def exec_form(value: str) -> list[str] | None:
    """The JSON array of an exec-form CMD/ENTRYPOINT, or None for shell form."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    return parsed if isinstance(parsed, list) and all(isinstance(p, str) for p in parsed) else None


def _matches(pattern: str, rel: str) -> bool:
    """Docker's rule: a pattern excludes a path when it matches it or one of its parent folders."""
    pattern = pattern.strip("/")
    parts = rel.split("/")
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        if fnmatch.fnmatchcase(prefix, pattern):
            return True
        if pattern.startswith("**/") and any(fnmatch.fnmatchcase("/".join(parts[j:i]), pattern[3:]) for j in range(i)):
            return True
    return False


def context_files(root: Path = REPO) -> list[str]:
    """The files of the build context under the .dockerignore at root (last matching rule wins)."""
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), line.lstrip("!")))
    kept = []
    for path in sorted(_candidates(root, rules)):
        rel = path.relative_to(root).as_posix()
        excluded = False
        for negated, pattern in rules:
            if _matches(pattern, rel):
                excluded = not negated
        if not excluded:
            kept.append(rel)
    return kept


def _candidates(root: Path, rules: list[tuple[bool, str]]) -> list[Path]:
    """Files under the top-level entries the rules can keep (a virtual environment is not walked)."""
    files = []
    for top in root.iterdir():
        excluded = False
        for negated, pattern in rules:
            if _matches(pattern, top.name):
                excluded = not negated
        reincluded = any(negated and pattern.strip("/").split("/")[0] == top.name for negated, pattern in rules)
        if excluded and not reincluded:
            continue
        files.extend([top] if top.is_file() else [p for p in top.rglob("*") if p.is_file()])
    return files
