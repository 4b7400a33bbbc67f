"""Environment defaults of the commands' options (traceless/cli/env.py)."""

import pytest

from traceless.cli.env import VARIABLES, describe, env_value
from traceless_tools.cli import build_parser


def test_a_variable_fills_a_required_option(monkeypatch):
    monkeypatch.setenv("TRACELESS_GATEWAY_URL", "http://gateway.internal:8092")
    args = build_parser().parse_args(["relay"])
    assert args.gateway == "http://gateway.internal:8092"


def test_the_command_line_wins_over_the_variable(monkeypatch):
    monkeypatch.setenv("TRACELESS_GATEWAY_URL", "http://from-env")
    assert build_parser().parse_args(["relay", "--gateway", "http://from-flag"]).gateway == "http://from-flag"


def test_without_the_variable_a_required_option_is_still_required(monkeypatch, capsys):
    monkeypatch.delenv("TRACELESS_GATEWAY_URL", raising=False)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["relay"])
    assert "--gateway" in capsys.readouterr().err


def test_an_empty_variable_counts_as_unset(monkeypatch):
    monkeypatch.setenv("TRACELESS_ISSUER_URL", "")
    assert build_parser().parse_args(["gateway"]).issuer is None
    assert env_value("TRACELESS_ISSUER_URL") is None


def test_typed_options_convert_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACELESS_LOG_DIR", str(tmp_path))
    args = build_parser().parse_args(["log", "serve"])
    assert args.dir == tmp_path


def test_node_and_secret_variables(monkeypatch):
    monkeypatch.setenv("TRACELESS_PUBLIC_URL", "http://traceless-node-0.traceless-node:8100")
    monkeypatch.setenv("TRACELESS_REGISTER_SECRET", "s3cret-value")
    parser = build_parser()
    assert parser.parse_args(["node"]).public_url == "http://traceless-node-0.traceless-node:8100"
    assert parser.parse_args(["gateway"]).register_secret == "s3cret-value"
    # The help text names the variable, never its value.
    assert "s3cret-value" not in parser.format_help()


def test_unknown_variables_are_refused_and_every_variable_is_documented():
    with pytest.raises(KeyError):
        env_value("TRACELESS_NOT_A_VARIABLE")
    table = describe()
    assert all(name in table for name in VARIABLES)


def test_the_api_key_comes_from_traceless_or_vllm_variables(monkeypatch):
    monkeypatch.delenv("TRACELESS_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert build_parser().parse_args(["serve"]).api_key is None
    monkeypatch.setenv("VLLM_API_KEY", "from-vllm")
    assert build_parser().parse_args(["serve"]).api_key == "from-vllm"
    monkeypatch.setenv("TRACELESS_API_KEY", "from-traceless")
    assert build_parser().parse_args(["serve"]).api_key == "from-traceless"
    assert build_parser().parse_args(["serve", "--api-key", "flag"]).api_key == "flag"
