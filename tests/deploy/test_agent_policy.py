"""The confidential node's Kata agent policy (deploy/kata_policy.py, overlays/confidential/
agent-policy.rego), evaluated by regorus, the Rego engine the Kata agent itself runs.

The host is the attacker here: it may ask the guest's agent for any container. The policy must
admit the pod's sandbox and the release's node exactly, and refuse every way of running other code
inside the attested VM: another image, the same image from a host-provided root filesystem, another
command line, an injecting variable, an OCI hook, a mount over the image's code, a sidecar, exec."""

from __future__ import annotations

import importlib.util
import json
import tomllib

import pytest

from tests.deploy._dockerfile import NODE_BOOT, REPO

opa_eval = pytest.importorskip("opa_eval")  # in the test extras; regorus through PyO3

IMAGE = "registry.example/traceless/node@sha256:" + "ab" * 32
NODE_ARGS = ["--host=0.0.0.0", "--port=8100", "--attestation=hardware"]


def _script():
    spec = importlib.util.spec_from_file_location("kata_policy", REPO / "deploy" / "kata_policy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _manifests(image: str, args: list[str]) -> list[dict]:
    container = {"name": "node", "image": image, "args": args}
    return [
        {
            "kind": "StatefulSet",
            "metadata": {"name": "traceless-node", "labels": {"app.kubernetes.io/component": "node"}},
            "spec": {"template": {"spec": {"containers": [container]}}},
        }
    ]


class Agent:
    """The policy as the agent evaluates it: one query per request kind."""

    def __init__(self, policy: str, tmp_path):
        self.path = tmp_path / "policy.rego"
        self.path.write_text(policy)
        self._cache: dict[str, object] = {}

    def allows(self, request: str, body: dict) -> bool:
        if request not in self._cache:
            self._cache[request] = opa_eval.OpaEval(str(self.path), query=f"data.agent_policy.{request}")
        return self._cache[request].evaluate_parsed(json.dumps(body)) is True


def _policy_of(initdata: bytes) -> str:
    return tomllib.loads(initdata.decode())["data"]["policy.rego"]


@pytest.fixture
def agent(tmp_path):
    script = _script()
    release = script.release_of(_manifests(IMAGE, NODE_ARGS))
    return Agent(_policy_of(script.render_initdata(script.render_policy(release))), tmp_path)


MOUNTS = [
    "/proc",
    "/dev",
    "/dev/pts",
    "/dev/mqueue",
    "/sys",
    "/sys/fs/cgroup",
    "/dev/shm",
    "/etc/hosts",
    "/etc/hostname",
    "/etc/resolv.conf",
    "/dev/termination-log",
    "/tmp",
]


def _node_request(**change) -> dict:
    oci = {
        "Annotations": {
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.container-name": "node",
            "io.kubernetes.cri.image-name": IMAGE,
        },
        "Process": {
            "Args": [*NODE_BOOT, "node", *NODE_ARGS],
            "Env": [
                "PATH=/usr/bin:/bin",
                "HOME=/tmp",
                "PYTHONMALLOC=malloc",
                "MALLOC_PERTURB_=165",
                "POD_NAME=traceless-node-0",
                "TRACELESS_GATEWAY_URL=http://traceless-gateway:8092",
            ],
        },
        "Root": {"Path": "/run/kata-containers/shared/containers/x/rootfs", "Readonly": True},
        "Mounts": [{"destination": d, "source": d, "type_": "bind", "options": []} for d in MOUNTS],
        "Hooks": None,
    }
    body = {"OCI": oci, "storages": [{"driver": "image_guest_pull", "source": IMAGE, "mount_point": "/x"}]}
    for path, value in change.items():
        *parents, leaf = path.split("__")
        node = body
        for p in parents:
            node = node[p]
        node[leaf] = value
    return body


def _sandbox_request() -> dict:
    return {
        "OCI": {
            "Annotations": {"io.kubernetes.cri.container-type": "sandbox"},
            "Process": {"Args": ["/pause"], "Env": ["PATH=/usr/bin:/bin"]},
            "Root": {"Readonly": True},
            "Mounts": [{"destination": "/dev/shm"}],
        },
        "storages": [],
    }


def test_the_release_and_the_sandbox_are_admitted(agent):
    assert agent.allows("CreateContainerRequest", _node_request())
    assert agent.allows("CreateContainerRequest", _sandbox_request())
    assert agent.allows("ReadStreamRequest", {})  # the node's content-free stdout


@pytest.mark.parametrize(
    "attack,change",
    [
        ("another image", {"OCI__Annotations__io.kubernetes.cri.image-name": IMAGE.replace("ab", "cd", 1)}),
        ("the image by tag", {"OCI__Annotations__io.kubernetes.cri.image-name": "registry.example/traceless/node:1"}),
        ("a host-provided root filesystem", {"storages": []}),
        (
            "a guest pull of another image",
            {"storages": [{"driver": "image_guest_pull", "source": "evil@sha256:" + "0" * 64}]},
        ),
        (
            "another command line",
            {"OCI__Process__Args": [*NODE_BOOT, "node", "--host=0.0.0.0", "--port=8100", "--attestation=software"]},
        ),
        ("an extra argument", {"OCI__Process__Args": [*NODE_BOOT, "node", *NODE_ARGS, "--request-events"]}),
        ("LD_PRELOAD", {"OCI__Process__Env": ["PATH=/usr/bin", "LD_PRELOAD=/tmp/x.so"]}),
        ("LD_LIBRARY_PATH", {"OCI__Process__Env": ["LD_LIBRARY_PATH=/tmp"]}),
        ("PYTHONPATH", {"OCI__Process__Env": ["PYTHONPATH=/tmp"]}),
        ("another allocator setting", {"OCI__Process__Env": ["PYTHONMALLOC=pymalloc"]}),
        ("GLIBC_TUNABLES", {"OCI__Process__Env": ["GLIBC_TUNABLES=glibc.malloc.perturb=0"]}),
        ("a prestart hook", {"OCI__Hooks": {"Prestart": [{"Path": "/bin/sh", "Args": ["sh", "-c", "id"]}]}}),
        ("a mount over the code", {"OCI__Mounts": [{"destination": "/opt/traceless", "source": "/host/evil"}]}),
        ("a mount over the venv", {"OCI__Mounts": [{"destination": "/opt/venv/lib", "source": "/host/evil"}]}),
        ("a writable root", {"OCI__Root__Readonly": False}),
        ("a sidecar of the same image", {"OCI__Annotations__io.kubernetes.cri.container-name": "debug"}),
    ],
)
def test_every_other_container_is_refused(agent, attack, change):
    assert not agent.allows("CreateContainerRequest", _node_request(**change)), attack


def test_a_sandbox_with_another_command_is_refused(agent):
    body = _sandbox_request()
    body["OCI"]["Process"]["Args"] = ["/bin/sh", "-c", "cat /proc/1/mem"]
    assert not agent.allows("CreateContainerRequest", body)


@pytest.mark.parametrize(
    "request_kind",
    [
        "ExecProcessRequest",
        "WriteStreamRequest",
        "CloseStdinRequest",
        "SetPolicyRequest",
        "StartTracingRequest",
        "UpdateEphemeralMountsRequest",
    ],
)
def test_the_host_cannot_reach_into_the_vm(agent, request_kind):
    assert not agent.allows(request_kind, {"container_id": "x", "process": {"Args": ["/bin/sh"]}})


def test_files_are_copied_only_into_the_shared_directory(agent):
    assert agent.allows("CopyFileRequest", {"path": "/run/kata-containers/shared/containers/abc-hosts"})
    assert not agent.allows("CopyFileRequest", {"path": "/opt/traceless/traceless/__init__.py"})
    assert not agent.allows("CopyFileRequest", {"path": "/run/kata-containers/shared/containers/../../../etc/x"})


def test_a_policy_for_an_image_by_tag_admits_no_node(tmp_path):
    script = _script()
    assert script.release_of(_manifests("traceless/node:0.1.0-cu128", NODE_ARGS)) is None
    unpinned = Agent(_policy_of(script.render_initdata(script.render_policy(None))), tmp_path)
    assert not unpinned.allows("CreateContainerRequest", _node_request())
    assert unpinned.allows("CreateContainerRequest", _sandbox_request())


def test_the_command_line_is_the_images_entrypoint_then_the_manifests_args():
    script = _script()
    assert script.node_entrypoint() == [*NODE_BOOT, "node"]
    release = script.release_of(_manifests(IMAGE, NODE_ARGS))
    assert release == {"image": IMAGE, "args": [*NODE_BOOT, "node", *NODE_ARGS]}


def test_the_shipped_initdata_is_what_the_shipped_overlay_renders(render, tmp_path, capsys):
    import yaml

    rendered = tmp_path / "confidential.yaml"
    rendered.write_text(yaml.safe_dump_all(render("confidential")))
    assert _script().main([str(rendered), "--check"]) == 0, capsys.readouterr().err
