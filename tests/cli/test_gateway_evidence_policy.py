"""`traceless gateway --evidence-policy FILE`: the policy file is loaded into the gateway's admission
(a bad file stops the command before it serves) and the gateway says which policy it runs under."""

from __future__ import annotations

import base64

import pytest

import traceless_tools.cli as cli
from tests.privacy.attestation.fake_hardware import write_policy_file
from tests.privacy.attestation.forge import make_amd_chain

BASE = [
    "gateway",
    "--privacy",
    "off",
    "--log",
    "http://log.invalid",
    "--log-public-key",
    base64.b64encode(bytes(32)).decode(),
    "--port",
    "0",
]


@pytest.fixture
def served(monkeypatch):
    import traceless.events as events
    import traceless.http.serve as serve

    apps = []
    monkeypatch.setattr(serve, "run_uvicorn", lambda app, *a, **kw: apps.append(app))
    # The command would send this process's events to stderr only (propagate off): keep pytest's capture.
    monkeypatch.setattr(events, "configure_logging", lambda *a, **kw: None)
    return apps


def test_the_gateway_admits_under_the_policy_file(served, tmp_path, capsys):
    path = write_policy_file(tmp_path, make_amd_chain(), None, name="fleet")
    assert cli.main([*BASE, "--evidence-policy", str(path)]) == 0
    assert "traceless gateway: evidence policy 'fleet': CPU SNP" in capsys.readouterr().out
    (app,) = served
    admission = app.state.gateway.config.admission
    assert admission.evidence_policy is not None and admission.evidence_policy.name == "fleet"
    assert admission.evidence_policy.cpu == frozenset({"snp"}) and not admission.evidence_policy.allow_software


def test_a_development_policy_file_says_so_and_a_bad_one_stops_the_gateway(served, tmp_path, capsys):
    (tmp_path / "dev.yaml").write_text("development: true\n")
    assert cli.main([*BASE, "--evidence-policy", str(tmp_path / "dev.yaml")]) == 0
    assert "DEVELOPMENT: the software attester is accepted" in capsys.readouterr().out
    (tmp_path / "bad.yaml").write_text("cpu: [snp]\ngpu: maybe\n")
    assert cli.main([*BASE, "--evidence-policy", str(tmp_path / "bad.yaml")]) == 2  # one line on stderr
    assert "traceless gateway: gpu in the policy file must be true or false" in capsys.readouterr().err
    assert len(served) == 1
