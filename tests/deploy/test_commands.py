"""Every container of every rendered overlay starts: its command line (the image's ENTRYPOINT from
deploy/Dockerfile, then the manifest's args, with the container's environment) parses with the
project's own argument parser, with no unknown flag and every required option, and passes the
command's own start-up checks. A manifest can then never ship a command that exits at start."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from tests.deploy._dockerfile import NODE_BOOT, exec_form, parse
from tests.deploy.conftest import OVERLAYS
from traceless.cli.isolation import starts_isolated
from traceless.cli.parser import COMMAND_MODULES, build_parser, check
from traceless.cli.scrubbing import SCRUB_ENV
from traceless_tools.cli import ALL_MODULES

# the node image runs the trusted core's command line; the services images the tools'
CLI_MODULES = {"traceless.cli": COMMAND_MODULES, "traceless_tools.cli": ALL_MODULES}

OPERATOR_VALUE = "b3BlcmF0b3ItcHJvdmlkZWQ="  # what an operator-created Secret or ConfigMap holds (base64)


def _containers(objs):
    for obj in objs:
        if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            spec = obj["spec"]["template"]["spec"]
            for c in spec.get("initContainers", []) + spec["containers"]:
                yield f"{obj['kind']}/{obj['metadata']['name']}/{c['name']}", c


def _environment(container: dict, configmaps: dict[str, dict]) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(configmaps.get(source["configMapRef"]["name"], {}))
    for var in container.get("env", []):
        ref = var.get("valueFrom", {})
        if "value" in var:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), var["value"])
        elif "configMapKeyRef" in ref and ref["configMapKeyRef"]["name"] in configmaps:
            env[var["name"]] = configmaps[ref["configMapKeyRef"]["name"]][ref["configMapKeyRef"]["key"]]
        else:  # a Secret, an operator-created ConfigMap, a field of the pod
            env[var["name"]] = OPERATOR_VALUE
    return env


def _argv(container: dict, env: dict[str, str]) -> tuple[str, list[str]]:
    """(command-line module, what the container runs after `python -m MODULE` or the node's isolated
    boot), $(VAR) expanded as Kubernetes does. The node boots the core's command line."""
    full = _command(container)
    if full[: len(NODE_BOOT)] == NODE_BOOT:
        cli, prefix = "traceless.cli", NODE_BOOT
    else:
        assert full[:2] == ["/opt/venv/bin/python", "-m"] and full[2] in CLI_MODULES, full
        cli, prefix = full[2], full[:3]
    return cli, [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in full[len(prefix) :]]


def _command(container: dict) -> list[str]:
    """The container's whole command line: the image's ENTRYPOINT (or the manifest's command), then args."""
    stages = parse().lineage(_image(container))
    entry = container.get("command") or next(exec_form(v) for st in stages for v in st.values("ENTRYPOINT"))
    return [*entry, *container.get("args", [])]


def _image(container: dict) -> str:
    return container["image"].split("/", 1)[1].split(":")[0]


def start_check(argv: list[str], env: dict[str, str], monkeypatch, cli: str = "traceless_tools.cli") -> str | None:
    """None if the command line parses and passes its command's checks; else why not."""
    with monkeypatch.context() as m:
        for name in [n for n in __import__("os").environ if n.startswith("TRACELESS_")]:
            m.delenv(name)
        for name, value in env.items():
            m.setenv(name, value)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = build_parser(CLI_MODULES[cli]).parse_args(argv)  # options read their environment defaults here
            check(args)
        except SystemExit as exc:
            return err.getvalue().strip().splitlines()[-1] if err.getvalue() else str(exc)
        except Exception as exc:  # a command's CommandError
            return f"{type(exc).__name__}: {exc}"
    return None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_command_line_starts(render, overlay, monkeypatch):
    objs = render(overlay)
    configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
    failures, checked = {}, 0
    for where, container in _containers(objs):
        env = _environment(container, configmaps)
        cli, argv = _argv(container, env)
        problem = start_check(argv, env, monkeypatch, cli)
        checked += 1
        if problem is not None:
            failures[where] = problem
    assert checked and failures == {}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_node_container_starts_isolated(render, overlay):
    """The image's environment and the manifest's together are the isolated state the node's
    measurement records, and its command line has the isolating flags: the first process serves."""
    objs = render(overlay)
    configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
    nodes = [(where, c) for where, c in _containers(objs) if _image(c) == "node"]
    for where, container in nodes:
        env = {**parse().env("node"), **_environment(container, configmaps)}
        assert starts_isolated(_command(container), env, SCRUB_ENV), where
    assert nodes or overlay == "relay"


def test_the_check_catches_an_unknown_flag_and_a_missing_option(monkeypatch):
    assert start_check(["gateway", "--host=0.0.0.0", "--no-such-flag"], {}, monkeypatch) is not None
    env = {"TRACELESS_ISSUER_URL": "http://issuer"}
    assert "--log" in start_check(["gateway"], env, monkeypatch)
    assert start_check(["gateway", "--log=http://log", f"--log-public-key={OPERATOR_VALUE}"], env, monkeypatch) is None
