"""The confidential node's Kata agent policy, rendered for the release it admits.

    kubectl kustomize deploy/k8s/overlays/confidential | python deploy/kata_policy.py
    kubectl kustomize deploy/k8s/overlays/confidential | python deploy/kata_policy.py --check

A hardware report measures the VM the host launched and the agent policy bound into it (initdata),
not the containers the host then asks the VM's agent to start. The policy is therefore what ties
the attestation to the node's code: it admits the pod's sandbox and one container, the node image
pinned by digest (pulled and checked inside the guest) with the release's exact command line.

This script reads the rendered manifests, takes the node container's image and its whole command
line (the image's ENTRYPOINT from deploy/Dockerfile, or the manifest's `command`, then `args`),
writes them into overlays/confidential/agent-policy.rego's `release` line, and writes the result
as overlays/confidential/initdata.toml and, gzip + base64, into the pod annotation Kata reads
(gpu-node.yaml). An image given by tag, not digest, renders a policy that admits no node
container (and says so): pin the image at release time with
`kustomize edit set image traceless/node=REPOSITORY@sha256:DIGEST`, then run this again. Put the
new initdata.toml under `kata_initdata` in the evidence policy. `--check` changes nothing and
exits 1 when the files are not what the manifests render.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

# the sibling script that reads the node container the same way (run as a script or loaded by path)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from release_manifest import node_container_specs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OVERLAY = ROOT / "deploy" / "k8s" / "overlays" / "confidential"
POLICY, INITDATA, POD_PATCH = OVERLAY / "agent-policy.rego", OVERLAY / "initdata.toml", OVERLAY / "gpu-node.yaml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
ANNOTATION = "io.katacontainers.config.hypervisor.cc_init_data"
RELEASE_LINE = "release := null\n"
PINNED = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")


class PolicyError(Exception):
    """The manifests or the files do not describe a policy this script can render."""


def node_container(documents: list[Any]) -> dict:
    """The one container named `node` of the node StatefulSet."""
    found = node_container_specs(documents)
    if len(found) != 1:
        raise PolicyError(f"expected one node container in the manifests, found {len(found)}")
    return found[0]


def node_entrypoint(dockerfile: Path = DOCKERFILE) -> list[str]:
    """The exec-form ENTRYPOINT of the Dockerfile's `node` stage (its last one wins)."""
    stage = re.split(r"^FROM\s+\S+\s+AS\s+node\s*$", dockerfile.read_text(), flags=re.M | re.I)
    if len(stage) != 2:
        raise PolicyError("deploy/Dockerfile has no single `node` stage")
    entries = re.findall(r"^ENTRYPOINT\s+(\[.*\])\s*$", stage[1].split("\nFROM ")[0], flags=re.M)
    if not entries:
        raise PolicyError("the node stage has no exec-form ENTRYPOINT")
    return json.loads(entries[-1])


def release_of(documents: list[Any]) -> dict | None:
    """{"image", "args"} the policy admits, or None when the image is not pinned by digest."""
    container = node_container(documents)
    image = str(container.get("image", ""))
    if not PINNED.match(image):
        return None
    command = [str(a) for a in container.get("command") or node_entrypoint()]
    return {"image": image, "args": command + [str(a) for a in container.get("args", [])]}


def render_policy(release: dict | None, template: str | None = None) -> str:
    template = POLICY.read_text() if template is None else template
    if template.count(RELEASE_LINE) != 1:
        raise PolicyError(f"{POLICY.name} must hold the line `{RELEASE_LINE.strip()}` once")
    return template.replace(RELEASE_LINE, f"release := {json.dumps(release)}\n")


def render_initdata(policy: str) -> bytes:
    """The initdata document: TOML, the policy as one literal string (it holds no ''')."""
    if "'''" in policy:
        raise PolicyError("the policy may not contain ''' (TOML literal string delimiter)")
    head = (
        "# Rendered by deploy/kata_policy.py from agent-policy.rego and the manifests: do not edit.\n"
        'algorithm = "sha384"\nversion = "0.1.0"\n\n[data]\n'
    )
    return (head + "\"policy.rego\" = '''\n" + policy + "'''\n").encode()


def annotation_value(initdata: bytes) -> str:
    return base64.b64encode(gzip.compress(initdata, compresslevel=9, mtime=0)).decode()


def patched_pod(initdata: bytes, text: str) -> str:
    """gpu-node.yaml with the annotation replaced (the one line that holds it)."""
    pattern = re.compile(rf"^(\s*{re.escape(ANNOTATION)}: )\S*$", re.M)
    if len(pattern.findall(text)) != 1:
        raise PolicyError(f"{POD_PATCH.name} must hold the {ANNOTATION} annotation on one line")
    return pattern.sub(lambda m: m.group(1) + annotation_value(initdata), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rendered", nargs="?", type=Path, help="rendered manifests (default: standard input)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if the files differ")
    args = parser.parse_args(argv)
    text = args.rendered.read_text() if args.rendered else sys.stdin.read()
    try:
        release = release_of(list(yaml.safe_load_all(text)))
        initdata = render_initdata(render_policy(release))
        pod = patched_pod(initdata, POD_PATCH.read_text())
    except PolicyError as e:
        print(f"kata_policy: {e}", file=sys.stderr)
        return 1
    if release is None:
        print(
            "kata_policy: the node image is not pinned by digest: this policy admits no node container", file=sys.stderr
        )
    if args.check:
        stale = [p.name for p, want in ((INITDATA, initdata), (POD_PATCH, pod.encode())) if p.read_bytes() != want]
        if stale:
            print(f"kata_policy: not what the manifests render: {', '.join(stale)}", file=sys.stderr)
            return 1
        return 0
    INITDATA.write_bytes(initdata)
    POD_PATCH.write_text(pod)
    return 0


if __name__ == "__main__":
    sys.exit(main())
