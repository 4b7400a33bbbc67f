"""`traceless node` shape flags: each applies to the shape mode it names, or the node refuses to start.

With `--shape buckets` every size the hops see is fixed by the node's framing (whole responses and
untimed chunks padded to a size bucket, timed chunks all STREAM_CHUNK bytes), so `--stream-padding`
has nothing left to pad; the cadence flags mean nothing without a cadence."""

from __future__ import annotations

import pytest

from traceless.cli.parser import build_parser, check
from traceless.node.settings import NodeSettings
from traceless.privacy.shape import OFF, ShapePolicy
from traceless.server.stream_shape import StreamShape


def _check(*argv: str) -> None:
    check(build_parser().parse_args(["node", "--model", "/nonexistent/model", *argv]))


@pytest.mark.parametrize(
    "argv,flag",
    [
        (("--stream-padding", "256"), "--stream-padding"),  # buckets is the default
        (("--shape", "buckets", "--stream-padding", "256"), "--stream-padding"),
        (("--stream-tick", "0", "--stream-padding", "256"), "--stream-padding"),
        (("--shape", "off", "--stream-tick", "50"), "--stream-tick"),
        (("--shape", "off", "--prefill-budget", "100"), "--prefill-budget"),
        (("--shape", "off", "--decode-budget", "100"), "--decode-budget"),
        (("--stream-tick", "0", "--decode-budget", "100"), "--decode-budget"),
        (("--stream-tick", "0", "--prefill-budget", "100"), "--prefill-budget"),
        (("--shape", "off", "--ballast", "on"), "--ballast"),
        (("--stream-tick", "0", "--ballast", "off"), "--ballast"),
    ],
)
def test_a_flag_the_shape_mode_cannot_apply_is_refused_at_start(argv, flag):
    with pytest.raises(SystemExit, match=f"traceless node: {flag} "):
        _check(*argv)


@pytest.mark.parametrize(
    "argv",
    [
        (),
        ("--shape", "off", "--stream-padding", "256"),
        ("--stream-tick", "0"),
        ("--stream-tick", "50", "--prefill-budget", "100", "--decode-budget", "10"),
        ("--stream-interval", "4"),
        ("--shape", "off", "--stream-interval", "4"),
        ("--stream-tick", "0", "--stream-interval", "4"),
        ("--ballast", "off"),
        ("--stream-tick", "50", "--ballast", "on"),
    ],
)
def test_flags_that_apply_are_taken(argv):
    _check(*argv)


def test_the_ballast_is_on_by_default_and_measured():
    from traceless.cli.node import shape_policy

    args = build_parser().parse_args(["node", "--model", "/nonexistent/model"])
    assert shape_policy(args).ballast and shape_policy(args).measured()["stream_ballast"] is True
    off = shape_policy(build_parser().parse_args(["node", "--model", "/nonexistent/model", "--ballast", "off"]))
    assert not off.ballast and off.measured()["stream_ballast"] is False
    assert OFF.measured()["stream_ballast"] is None


def test_node_settings_refuse_event_padding_under_size_buckets():
    with pytest.raises(ValueError, match="stream padding"):
        NodeSettings("tiny", stream_shape=StreamShape(256), shape=ShapePolicy())
    with pytest.raises(ValueError, match="stream padding"):
        NodeSettings("tiny", stream_shape=StreamShape(256), shape=ShapePolicy(tick_ms=0))
    assert NodeSettings("tiny", stream_shape=StreamShape(256), shape=OFF).stream_shape.padding == 256
