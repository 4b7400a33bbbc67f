"""Every service command takes the connection-limit options, with the documented defaults."""

import pytest

from traceless.cli.limits import connection_limits
from traceless.http.limits import ConnectionLimits
from traceless_tools.cli import build_parser

COMMANDS = [
    ["relay", "--gateway", "http://g"],
    ["gateway", "--issuer", "http://i"],
    ["issuer", "--api-keys", "keys.json"],
    [
        "proxy",
        "--issuer",
        "http://i",
        "--api-key",
        "k",
        "--relay",
        "http://r",
        "--log",
        "http://l",
        "--log-public-key",
        "AA==",
        "--attester-key",
        "AA==",
        "--model",
        "m",
        "--witness-key",
        "AA==",
    ],
    ["serve"],
    ["node"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: argv[0])
def test_defaults_and_overrides(argv):
    parser = build_parser()
    assert connection_limits(parser.parse_args(argv)) == ConnectionLimits()
    args = parser.parse_args([*argv, "--max-connections", "64", "--head-timeout", "2.5", "--body-timeout", "7"])
    assert connection_limits(args) == ConnectionLimits(max_connections=64, head_timeout_s=2.5, body_timeout_s=7.0)


@pytest.mark.parametrize("bad", [["--max-connections", "0"], ["--head-timeout", "0"], ["--body-timeout", "-1"]])
def test_nonsense_is_refused(bad):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["relay", "--gateway", "http://g", *bad])
