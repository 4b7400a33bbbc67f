"""The rendered Kustomize overlays: schemas, a scanner, and the properties the deployment's
guarantees rest on, asserted object by object so a later edit cannot quietly drop one."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.conftest import OVERLAYS, REPO

KUBERNETES_VERSION = "1.33"
WORKLOADS = ("Deployment", "StatefulSet")


def _objects(objs, kind, name=None):
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def _one(objs, kind, name):
    found = _objects(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}"
    return found[0]


def _component(obj) -> str:
    return obj["metadata"]["labels"]["app.kubernetes.io/component"]


def _pod_spec(obj) -> dict:
    return obj["spec"]["template"]["spec"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schemas(render, overlay):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    checked = 0
    for obj in render(overlay):
        if obj["kind"] == "ServiceMonitor":  # a Prometheus Operator CRD: not in the core schemas
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        checked += 1
    assert checked >= 5


def test_a_wrong_field_fails_schema_validation(render):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    node = json.loads(json.dumps(_one(render("dev"), "StatefulSet", "traceless-node")))
    _pod_spec(node)["containers"][0]["securityContext"]["readOnlyRootFs"] = True  # misspelt
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(node, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_is_restricted(render, overlay):
    workloads = [o for o in render(overlay) if o["kind"] in WORKLOADS]
    assert workloads
    for obj in workloads:
        spec = _pod_spec(obj)
        name = obj["metadata"]["name"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] >= 10000, name
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert spec["automountServiceAccountToken"] is False, name
        assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), name
        for volume in spec.get("volumes", []):
            assert "hostPath" not in volume, name
        for container in spec["containers"] + spec.get("initContainers", []):
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] is True, name
            assert ctx["allowPrivilegeEscalation"] is False, name
            assert ctx.get("privileged", False) is False, name
            assert ctx["capabilities"]["drop"] == ["ALL"] and not ctx["capabilities"].get("add"), name
            assert "limits" in container["resources"], name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_namespaces_enforce_pod_security_restricted(render, overlay):
    namespaces = _objects(render(overlay), "Namespace")
    assert namespaces
    for ns in namespaces:
        assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize("overlay", ("dev", "confidential"))
def test_node_statefulset_reads_health_and_writes_only_to_memory(render, overlay):
    node = _one(render(overlay), "StatefulSet", "traceless-node")
    container = _pod_spec(node)["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    for mount in container["volumeMounts"]:
        volume = next(v for v in _pod_spec(node)["volumes"] if v["name"] == mount["name"])
        assert volume["emptyDir"]["medium"] == "Memory", "a node writes nothing to a disk"
    assert "volumeClaimTemplates" not in node["spec"]


@pytest.mark.parametrize("overlay", ("dev", "confidential"))
def test_network_policies_are_as_documented(render, overlay):
    objs = render(overlay)
    deny = _one(objs, "NetworkPolicy", "default-deny")
    assert deny["spec"]["podSelector"] == {} and set(deny["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    node = _one(objs, "NetworkPolicy", "traceless-node")["spec"]
    # Nodes accept the request port only from the gateway, the metrics port only from monitoring.
    by_port = {rule["ports"][0]["port"]: rule["from"] for rule in node["ingress"]}
    assert set(by_port) == {8100, 9100}
    assert by_port[8100] == [
        {
            "podSelector": {
                "matchLabels": {"app.kubernetes.io/name": "traceless", "app.kubernetes.io/component": "gateway"}
            }
        }
    ]
    assert by_port[9100] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    # The gateway reaches the issuer's directory port and never its signing port.
    gateway = _one(objs, "NetworkPolicy", "traceless-gateway")["spec"]
    issuer_rules = [
        r
        for r in gateway["egress"]
        if any(
            t.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") == "issuer"
            for t in r.get("to", [])
        )
    ]
    assert [p["port"] for r in issuer_rules for p in r["ports"]] == [8094]
    assert all(r.get("to") for r in gateway["egress"]), "a gateway egress rule without destinations allows all"
    issuer_ports = {
        p["containerPort"]: p["name"]
        for p in _pod_spec(_one(objs, "StatefulSet", "traceless-issuer"))["containers"][0]["ports"]
    }
    assert issuer_ports == {8091: "http", 8094: "directory"}
    assert "--directory-port=8094" in _pod_spec(_one(objs, "StatefulSet", "traceless-issuer"))["containers"][0]["args"]
    endpoints = _one(objs, "ConfigMap", "traceless-endpoints")["data"]
    assert endpoints["TRACELESS_ISSUER_URL"].endswith(":8094")
    for name in ("traceless-issuer", "traceless-log"):
        assert _one(objs, "NetworkPolicy", name)["spec"]["egress"] == []


def test_no_exec_or_attach_into_node_pods(render):
    objs = render("dev")
    policy = _one(objs, "ValidatingAdmissionPolicy", "traceless-no-exec-into-nodes")
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    connect = {r for rule in rules if rule["operations"] == ["CONNECT"] for r in rule["resources"]}
    update = {r for rule in rules if rule["operations"] == ["UPDATE"] for r in rule["resources"]}
    assert {"pods/exec", "pods/attach", "pods/portforward", "pods/proxy", "services/proxy", "nodes/proxy"} <= connect
    assert "pods/ephemeralcontainers" in update  # kubectl debug
    assert all(rule["apiGroups"] == [""] for rule in rules)
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert "namespace" not in policy["metadata"]
    expression = policy["spec"]["validations"][0]["expression"]
    assert "startsWith('traceless-node')" in expression and "request.namespace == 'traceless'" in expression
    assert "request.resource.resource != 'nodes'" in expression  # the kubelet proxy, for every node
    binding = _one(objs, "ValidatingAdmissionPolicyBinding", "traceless-no-exec-into-nodes")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    node = _one(objs, "StatefulSet", "traceless-node")
    assert node["metadata"]["namespace"] == "traceless" and node["metadata"]["name"] == "traceless-node"


def test_confidential_overlay_runs_nodes_in_confidential_containers_on_gpus(render):
    node = _one(render("confidential"), "StatefulSet", "traceless-node")
    spec = _pod_spec(node)
    assert spec["runtimeClassName"] == "kata-qemu-snp"
    assert spec["nodeSelector"] == {"traceless.dev/tee": "sev-snp"}
    assert {"key": "traceless.dev/tee", "operator": "Equal", "value": "sev-snp", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    resources = spec["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == "1"
    assert "--device=cuda" in spec["containers"][0]["args"]
    assert not [o for o in render("confidential") if o["kind"] == "ConfigMap" and "params" in o["metadata"]["name"]]
    dev = _pod_spec(_one(render("dev"), "StatefulSet", "traceless-node"))
    assert "runtimeClassName" not in dev and "nvidia.com/gpu" not in dev["containers"][0]["resources"]["limits"]


def test_secrets_come_from_secrets_never_from_config_maps(render):
    objs = render("dev")
    for cm in _objects(objs, "ConfigMap"):
        for key in cm.get("data", {}):
            assert not any(w in key.upper() for w in ("SECRET", "PASSWORD", "API_KEY=")), key
    assert not _objects(objs, "Secret"), "secret values are never in the manifests; the operator creates them"
    issuer = _pod_spec(_one(objs, "StatefulSet", "traceless-issuer"))
    api_keys = next(v for v in issuer["volumes"] if v["name"] == "api-keys")
    assert api_keys["secret"]["secretName"] == "traceless-issuer-api-keys"


def test_gateway_scales_with_an_hpa_and_prometheus_scrapes_only_the_metrics_port(render):
    objs = render("dev")
    hpa = _one(objs, "HorizontalPodAutoscaler", "traceless-gateway")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "traceless-gateway"}
    monitor = _one(objs, "ServiceMonitor", "traceless-node")
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    service = _one(objs, "Service", "traceless-node")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"http": 8100, "metrics": 9100}


def test_relay_overlay_is_alone_in_its_namespace(render):
    objs = render("relay")
    assert {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"} == {"traceless-relay"}
    assert {_component(o) for o in objs if o["kind"] in WORKLOADS} == {"relay"}
    env = _one(objs, "ConfigMap", next(o["metadata"]["name"] for o in objs if o["kind"] == "ConfigMap"))
    assert "TRACELESS_GATEWAY_URL" in env["data"]


def _checkov() -> str | None:
    for path in (shutil.which("checkov"), str(REPO / ".venv-checkov" / "bin" / "checkov")):
        if path and Path(path).is_file():
            return path
    return None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_checkov_passes_with_every_skip_justified(render, overlay, tmp_path):
    checkov = _checkov()
    if checkov is None:
        pytest.skip("checkov is not installed (.ci/run installs it into .venv-checkov)")
    import yaml

    rendered = tmp_path / f"{overlay}.yaml"
    rendered.write_text(yaml.safe_dump_all(render(overlay)))
    result = subprocess.run(
        [
            checkov,
            "--quiet",
            "--compact",
            "--skip-download",
            "--framework",
            "kubernetes",
            "-o",
            "json",
            "-f",
            str(rendered),
        ],
        capture_output=True,
        text=True,
    )
    report = json.loads(result.stdout)
    report = report[0] if isinstance(report, list) else report
    assert report["summary"]["failed"] == 0, [c["check_id"] for c in report["results"]["failed_checks"]]
    assert report["summary"]["passed"] > 50
    for skipped in report["results"].get("skipped_checks", []):
        assert len(skipped.get("suppress_comment", "")) > 30, f"{skipped['check_id']} skipped without a reason"
    assert result.returncode == 0, result.stderr[-1000:]


@pytest.mark.parametrize("overlay", ("dev", "confidential"))
def test_the_log_runs_with_its_witness_and_nodes_with_their_metrics_port(render, overlay):
    """The witness runs the real command (no listener, nothing may connect), the log takes its
    cosignatures, and the node's metrics are on their own port: clients refuse an unwitnessed log."""
    objs = render(overlay)
    witness = _pod_spec(_one(objs, "StatefulSet", "traceless-witness"))["containers"][0]
    assert witness["args"][:2] == ["witness", "--dir=/var/lib/traceless/witness"]
    env = {e["name"]: e for e in witness["env"]}
    assert env["TRACELESS_LOG_URL"]["value"] == "http://traceless-log:8090"
    assert env["TRACELESS_LOG_PUBLIC_KEY"]["valueFrom"]["configMapKeyRef"]["name"] == "traceless-log-keys"
    assert "ports" not in witness and "readinessProbe" not in witness
    assert not [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "traceless-witness"]
    policy = _one(objs, "NetworkPolicy", "traceless-witness")["spec"]
    assert "Ingress" in policy["policyTypes"] and not policy.get("ingress")
    log = _pod_spec(_one(objs, "StatefulSet", "traceless-log"))["containers"][0]
    assert "--witness-key=$(TRACELESS_WITNESS_KEY)" in log["args"]
    node = _pod_spec(_one(objs, "StatefulSet", "traceless-node"))["containers"][0]
    assert "--metrics-port=9100" in node["args"]


def _arg(container: dict, flag: str) -> str | None:
    values = [a.split("=", 1)[1] for a in container.get("args", []) if a.startswith(flag + "=")]
    return values[-1] if values else None


def test_the_confidential_overlay_binds_hardware_evidence(render):
    """Confidential nodes attest with their TEE's and every GPU's evidence, and the gateway admits
    them only under an evidence policy: a software-attested node is not admitted there."""
    objs = render("confidential")
    node = _pod_spec(_one(objs, "StatefulSet", "traceless-node"))["containers"][0]
    gpus = int(node["resources"]["limits"]["nvidia.com/gpu"])
    assert _arg(node, "--attestation") == "hardware"
    assert _arg(node, "--gpu-evidence") == str(gpus) and gpus >= 1  # every GPU the pod gets
    gateway_spec = _pod_spec(_one(objs, "Deployment", "traceless-gateway"))
    gateway = gateway_spec["containers"][0]
    policy = _arg(gateway, "--evidence-policy")
    assert policy is not None
    mount = next(m for m in gateway["volumeMounts"] if policy.startswith(m["mountPath"].rstrip("/") + "/"))
    volume = next(v for v in gateway_spec["volumes"] if v["name"] == mount["name"])
    assert "configMap" in volume and mount.get("readOnly") is True
    # the development overlay keeps the development attester
    dev_node = _pod_spec(_one(render("dev"), "StatefulSet", "traceless-node"))["containers"][0]
    assert _arg(dev_node, "--attestation") in (None, "software")


INITDATA_ANNOTATION = "io.katacontainers.config.hypervisor.cc_init_data"


def test_confidential_nodes_launch_with_the_restrictive_agent_policy_the_evidence_binds(render):
    """The confidential runtime starts each node's VM with the initdata shipped beside the overlay
    (gzip + base64 in the pod annotation Kata reads); its agent policy refuses exec and replacing
    the policy, and its digest is what the client's evidence policy pins (`kata_initdata`)."""
    import base64
    import gzip
    import re

    from traceless.privacy.attestation.runtime_policy import initdata_digest

    shipped = (REPO / "deploy/k8s/overlays/confidential/initdata.toml").read_bytes()
    template = _one(render("confidential"), "StatefulSet", "traceless-node")["spec"]["template"]
    annotation = template["metadata"].get("annotations", {}).get(INITDATA_ANNOTATION)
    assert annotation is not None
    assert gzip.decompress(base64.b64decode(annotation, validate=True)) == shipped
    assert len(initdata_digest(shipped, "snp")) == 32
    rules = dict(re.findall(r"^default (\w+) := (true|false)$", shipped.decode(), re.M))
    for denied in ("ExecProcessRequest", "SetPolicyRequest", "WriteStreamRequest", "AllowRequestsFailingPolicy"):
        assert rules.get(denied) == "false", denied
    # containers: only the sandbox and the release's node image (tests/deploy/test_agent_policy.py)
    assert rules.get("CreateContainerRequest") == "false"
    dev = _one(render("dev"), "StatefulSet", "traceless-node")["spec"]["template"]
    assert INITDATA_ANNOTATION not in dev["metadata"].get("annotations", {})
