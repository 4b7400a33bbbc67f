"""`traceless proxy --evidence-policy FILE`: the proxy needs an evidence policy or attester keys, loads
the policy file (refusing a bad one before serving), says which policy it runs under, and its
`GET /status` reports the policy and the attestation kinds of the nodes it verified."""

from __future__ import annotations

import base64
import re

import httpx
import pytest

import traceless_tools.cli as cli
from tests.privacy.attestation.fake_hardware import write_policy_file
from tests.privacy.attestation.forge import make_amd_chain
from tests.support.cluster_services import running_app
from traceless.privacy.ohttp.gateway import OhttpServer
from traceless_tools.client.node_verifier import VerifiedNode

BASE = [
    "proxy",
    "--issuer",
    "http://issuer.invalid",
    "--api-key",
    "k" * 32,
    "--relay",
    "http://relay.invalid",
    "--log",
    "http://log.invalid",
    "--log-public-key",
    base64.b64encode(bytes(32)).decode(),
    "--model",
    "m",
    "--witness-key",
    base64.b64encode(bytes(32)).decode(),
    "--port",
    "0",
]


@pytest.fixture
def served(monkeypatch, tmp_path):
    """Run `traceless proxy ARGS` up to the point it would serve; return its app instead."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))  # the client's saved tree head goes there
    import traceless.events as events
    import traceless.http.serve as serve

    apps = []
    monkeypatch.setattr(serve, "run_uvicorn", lambda app, *a, **kw: apps.append(app))
    # The command would send this process's events to stderr only (propagate off): keep pytest's capture.
    monkeypatch.setattr(events, "configure_logging", lambda *a, **kw: None)
    return apps


def test_the_proxy_needs_an_evidence_policy_or_attester_keys(served, capsys):
    assert cli.main(BASE) == 2  # a usage error: one line on stderr
    assert re.search("give an --evidence-policy FILE .* or the --attester-key", capsys.readouterr().err)
    assert served == []


def test_a_bad_policy_file_stops_the_proxy_before_it_serves(served, tmp_path, capsys):
    (tmp_path / "p.yaml").write_text("cpu: [snp]\nroots: {snp: [absent.der]}\n")
    assert cli.main([*BASE, "--evidence-policy", str(tmp_path / "p.yaml")]) == 2
    assert "traceless proxy: roots.snp: cannot read a certificate file" in capsys.readouterr().err
    assert served == []


def test_status_reports_the_policy_and_the_kinds_of_the_verified_nodes(served, tmp_path, capsys):
    policy = write_policy_file(tmp_path, make_amd_chain(), None, name="prod")
    assert cli.main([*BASE, "--evidence-policy", str(policy)]) == 0
    assert "traceless proxy: evidence policy 'prod': CPU SNP" in capsys.readouterr().out
    (app,) = served
    with running_app(app) as url:
        assert httpx.get(url + "/status").json() == {
            "model": "m",
            "policy": "prod",
            "attestation_kinds": [],
            "nodes": [],
            "refused": {},
            "routing": {"answered": 0, "concentrated": False, "nodes_flagged": 0, "kept_draws": 0},
        }
        client = app.state.private_client
        key = OhttpServer(key_id=1).key_config
        client._verified = [
            VerifiedNode("n1", 2, key, b"\x07" * 32, "kid1", 5.0, "snp+nvidia"),
            VerifiedNode("n2", 1, key, b"\x07" * 32, "kid2", 5.0, "snp"),
        ]
        client.verifier.last_refused = {"evidence_refused": 3}
        status = httpx.get(url + "/status").json()
    assert status["attestation_kinds"] == ["snp", "snp+nvidia"] and status["refused"] == {"evidence_refused": 3}
    assert status["nodes"][0] == {
        "node_id": "n1",
        "attestation_kind": "snp+nvidia",
        "capacity": 2,
        "measurement": "07" * 32,
        "verified_at": 5.0,
    }


def test_attester_keys_alone_run_under_the_attester_policy(served, capsys):
    key = base64.b64encode(bytes(range(32))).decode()
    assert cli.main([*BASE, "--attester-key", key, "--attester-policy", "development"]) == 0
    assert "DEVELOPMENT attestation policy" in capsys.readouterr().out
    (app,) = served
    with running_app(app) as url:
        assert httpx.get(url + "/status").json()["policy"] == "development"
