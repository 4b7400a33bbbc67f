"""The command line as a new user meets it: every option has help that shows its default, there is
a --version, and a usage or configuration error is one line on stderr with exit code 2, never a
traceback."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys

import pytest

import traceless
from traceless_tools.cli import build_parser, main


def _commands(parser: argparse.ArgumentParser, prefix: str = ""):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix}{name}", sub
                yield from _commands(sub, f"{prefix}{name} ")


def test_every_option_of_every_command_has_help():
    missing = [
        f"{name} {'/'.join(a.option_strings)}"
        for name, sub in _commands(build_parser())
        for a in sub._actions
        if a.option_strings and not a.help
    ]
    assert missing == []


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for expected in (
        "--max-num-seqs MAX_NUM_SEQS",
        "(default: 128)",
        "(default: 8000)",
        "(default: 127.0.0.1)",
        "(default: 2048)",
    ):
        assert expected in text, expected
    assert "(default: None)" not in text and "(default: False)" not in text  # no noise for unset options


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"traceless {traceless.__version__}"


def test_ctrl_c_in_any_command_is_one_line_and_status_130(monkeypatch, capsys):
    from traceless_tools.cli import generate

    def interrupted(args):
        raise KeyboardInterrupt  # what main's handlers make of Ctrl-C, SIGTERM and SIGHUP

    monkeypatch.setattr(generate, "_run", interrupted)  # the parser binds handlers when it is built
    assert main(["run"]) == 130
    assert capsys.readouterr().err.strip() == "traceless run: interrupted"


def _run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "traceless_tools.cli", *argv], capture_output=True, text=True, timeout=timeout, env=env
    )


def _one_line_error(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [
        line
        for line in r.stderr.splitlines()  # events are JSON lines; chat says it is loading
        if line.strip() and not line.startswith("{") and line != "loading model ..."
    ]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_a_configuration_error_is_one_line_and_exit_2(tiny_llama_dir):
    r = _run(
        "serve",
        "--model",
        str(tiny_llama_dir),
        "--dtype",
        "float32",
        "--kv-cache-memory",
        "1MiB",
        "--max-model-len",
        "100000",
        "--no-scrub-freed-memory",
        "--port",
        "0",
        "--metrics-port",
        "0",
    )
    _one_line_error(r, "traceless serve:", "max_model_len 100000 exceeds")


def test_a_missing_model_is_one_line_and_exit_2(tmp_path):
    r = _run("chat", "--model", str(tmp_path / "nowhere"))
    _one_line_error(r, "traceless chat:", "does not exist")


def test_a_bad_option_value_is_one_line_and_exit_2():
    r = _run("serve", "--max-num-seqs", "0", "--no-scrub-freed-memory")
    _one_line_error(r, "traceless serve:", "max_num_seqs")


def test_a_state_dir_that_cannot_be_written_is_one_line_and_exit_2(tmp_path):
    """A read-only directory (or, since tests may run as root, a path under a plain file)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    r = _run("up", "--state-dir", str(blocker / "state"), timeout=60)
    _one_line_error(r, "traceless up:", "--state-dir", str(blocker / "state"))


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("option", ["--port", "--metrics-port"])
def test_a_port_in_use_is_named_before_the_model_loads(taken_port, option, tmp_path):
    """Once: `service.started` was logged, then status 3 and no message. The missing model shows
    that the ports are bound before the model loads."""
    other = "--metrics-port" if option == "--port" else "--port"
    r = _run(
        "serve",
        "--model",
        str(tmp_path / "no-model-here"),
        "--no-scrub-freed-memory",
        option,
        str(taken_port),
        other,
        "0",
    )
    _one_line_error(r, "traceless serve:", f"127.0.0.1:{taken_port}", "already in use", option)
    assert "service.started" not in r.stderr


def test_up_refuses_a_proxy_port_in_use_before_starting_anything(taken_port):
    r = _run("up", "--port", str(taken_port), timeout=60)
    _one_line_error(r, "traceless up:", f"127.0.0.1:{taken_port}", "already in use", "--port")
    assert "running" not in r.stdout
