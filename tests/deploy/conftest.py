"""Rendering the Kustomize overlays: kubectl (with Kustomize v5) is needed, else the tests skip."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy._dockerfile import REPO

K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("dev", "confidential", "relay")


def kubectl() -> str | None:
    """A kubectl whose built-in Kustomize is v5 or newer (Debian 12's kubernetes-client is too old)."""
    for candidate in (shutil.which("kubectl"), shutil.which("kubectl", path=str(Path(sys.executable).parent))):
        if candidate is None:
            continue
        out = subprocess.run([candidate, "version", "--client", "-o", "json"], capture_output=True, text=True)
        version = json.loads(out.stdout or "{}").get("kustomizeVersion", "v0")
        if int(version.lstrip("v").split(".")[0] or 0) >= 5:
            return candidate
    return None


@pytest.fixture(scope="session")
def render():
    """render(overlay) -> the rendered objects (list of dicts), cached per overlay."""
    tool = kubectl()
    if tool is None:
        pytest.skip("kubectl with Kustomize v5 is not installed (.ci/run installs it)")
    cache: dict[str, list[dict]] = {}

    def _render(overlay: str) -> list[dict]:
        if overlay not in cache:
            out = subprocess.run(
                [tool, "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True, check=True
            ).stdout
            cache[overlay] = [doc for doc in yaml.safe_load_all(out) if doc]
        return cache[overlay]

    return _render
