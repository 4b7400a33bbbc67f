"""`traceless issuer`, `traceless gateway` and `traceless relay` run as a user would: three
processes, a fake node in this one, a token fetched from the issuer and spent through the relay."""

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from tests.support.cluster_services import RELEASE, FakeNode, encrypt_for, running_app
from tests.support.log_service import running_log_service
from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.privacypass import protocol as privacypass
from traceless.privacy.privacypass.http import format_authorization, parse_www_authenticate
from traceless.privacy.privacypass.keys import IssuerPublicKey
from traceless.privacy.privacypass.token_batch import decode_batch, encode_batch
from traceless.privacy.privacypass.wire import TokenChallenge, TokenResponse
from traceless.privacy.translog.log import TransparencyLog
from traceless_tools.cli import main

REPO = Path(__file__).resolve().parents[2]
API_KEY = "demo-key-0123456789abcdef"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _command(args, ready_url, logs):
    """Run `traceless ARGS` until the block ends; wait until ready_url answers. Its stderr
    lines are appended to `logs` after it stops."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "traceless_tools.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, f"{args[0]} did not start"
            try:
                httpx.get(ready_url, timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        logs.extend(err.splitlines())
        # stdout holds nothing but the gateway's statement of its attestation policy
        assert all(line.startswith("traceless gateway: DEVELOPMENT") for line in out.splitlines()), out
        assert proc.returncode == 0, err[-2000:]


def _batch_tokens(issuer_url, challenge, n):
    directory = httpx.get(issuer_url + "/token-issuer-directory").json()
    spki = base64.urlsafe_b64decode(directory["token-keys"][0]["token-key"])
    key = IssuerPublicKey.from_spki(spki)
    pairs = [privacypass.begin(challenge, key) for _ in range(n)]
    response = httpx.post(
        issuer_url + "/token-request-batch",
        content=encode_batch([r.encode() for r, _ in pairs]),
        headers={"authorization": f"Bearer {API_KEY}", "content-type": "application/private-token-batch-request"},
    )
    assert response.status_code == 200
    return [
        format_authorization(privacypass.finalize(state, TokenResponse.decode(item)))
        for (_, state), item in zip(pairs, decode_batch(response.content))
    ]


def _log_args(stack, tmp_path):
    """A log holding the fake nodes' release, served; the gateway's --log arguments."""
    log = TransparencyLog.create(tmp_path / "log")
    log.append(RELEASE.encode())
    url = stack.enter_context(running_log_service(tmp_path / "log"))
    return [
        "--log",
        url,
        "--log-public-key",
        base64.b64encode(log.public_key_bytes()).decode(),
        "--attester-policy",
        "development",
    ]


def test_issuer_gateway_relay_commands(tmp_path):
    keys = tmp_path / "api-keys.json"
    keys.write_text(json.dumps({API_KEY: "demo-user"}))
    issuer, gateway, relay = (f"http://127.0.0.1:{_free_port()}" for _ in range(3))
    logs: list[str] = []
    node = FakeNode()
    with ExitStack() as stack:
        node_url = stack.enter_context(running_app(node.app))
        stack.enter_context(
            _command(
                ["issuer", "--api-keys", str(keys), "--port", issuer.rsplit(":", 1)[1]],
                issuer + "/token-issuer-directory",
                logs,
            )
        )
        stack.enter_context(
            _command(
                [
                    "gateway",
                    "--issuer",
                    issuer,
                    "--port",
                    gateway.rsplit(":", 1)[1],
                    "--health-interval",
                    "0.2",
                    *_log_args(stack, tmp_path),
                ],
                gateway + "/pcc/v1/challenge",
                logs,
            )
        )
        stack.enter_context(
            _command(
                ["relay", "--gateway", gateway, "--port", relay.rsplit(":", 1)[1]], relay + "/pcc/v1/challenge", logs
            )
        )
        node_id = httpx.post(gateway + "/pcc/v1/register", json=node.registration(node_url)).json()["node_id"]
        www = httpx.get(relay + "/pcc/v1/challenge").headers["www-authenticate"]
        challenge = TokenChallenge.decode(parse_www_authenticate(www)[0].challenge)
        first, second = _batch_tokens(issuer, challenge, 2)
        (listed,) = httpx.get(relay + "/pcc/v1/nodes", params={"model": "m"}).json()["nodes"]
        assert listed["node_id"] == node_id
        for token, status in ((first, 200), (first, 403), (second, 200)):
            enc, ctx = encrypt_for(node, b"via the commands")
            response = httpx.post(
                f"{relay}/pcc/v1/ohttp/{node_id}",
                content=enc,
                headers={"content-type": "message/ohttp-req", "authorization": token},
            )
            assert response.status_code == status
        assert bhttp.decode_response(ctx.decapsulate(response.content)).content == b"via the commands"
    events = [json.loads(line) for line in logs]  # stderr holds nothing but schema events
    names = {e["event"] for e in events}
    assert {
        "service.started",
        "service.stopped",
        "gateway.configured",
        "gateway.node_registered",
        "issuer.issued",
        "http.request",
    } <= names
    assert node_id not in "\n".join(logs) and "127.0.0.1" not in "\n".join(logs)


def test_gateway_privacy_off_needs_no_issuer(tmp_path):
    logs: list[str] = []
    gateway = f"http://127.0.0.1:{_free_port()}"
    with (
        ExitStack() as stack,
        _command(
            ["gateway", "--privacy", "off", "--port", gateway.rsplit(":", 1)[1], *_log_args(stack, tmp_path)],
            gateway + "/pcc/v1/nodes?model=m",
            logs,
        ),
    ):
        assert httpx.get(gateway + "/pcc/v1/nodes", params={"model": "m"}).status_code == 404
    (configured,) = [json.loads(x) for x in logs if '"gateway.configured"' in x]
    assert configured["token_check"] is False and configured["issuer_keys"] == 0


def test_command_errors(tmp_path, capsys):
    assert main(["gateway"]) == 1
    assert "--issuer" in capsys.readouterr().err
    assert main(["gateway", "--privacy", "off"]) == 1
    assert "--log" in capsys.readouterr().err
    bad = tmp_path / "keys.json"
    bad.write_text("[]")
    assert main(["issuer", "--api-keys", str(bad)]) == 1
    assert "JSON object" in capsys.readouterr().err
    assert main(["issuer", "--api-keys", str(tmp_path / "absent.json")]) == 1
    assert main(["relay", "--gateway", "gateway.example"]) == 1
    assert "http(s)" in capsys.readouterr().err


def test_services_and_their_commands_do_not_load_torch():
    code = (
        "import sys, traceless_tools.cli, traceless_tools.cli.cluster, traceless_tools.cluster.gateway, "
        "traceless_tools.cluster.relay, traceless_tools.cluster.issuer; traceless_tools.cli.build_parser(); "
        "print(sorted(m for m in ('torch', 'numpy', 'transformers') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
