"""The node's return leg: one framer per shape mode, chosen once from the node's settings.

    ShapePolicy off                  PlainFramer   (framing/plain.py: optional fixed-size padding)
    ShapePolicy buckets, tick 0      BucketFramer  (framing/buckets.py)
    ShapePolicy buckets, tick > 0    PacedFramer   (framing/paced.py: the default)

A setting that one mode cannot apply is refused here (ShapeConflictError), never ignored: the
server's per-event stream padding pads chunks only when nothing else fixes their sizes (shape off).
"""

from __future__ import annotations

from collections.abc import Callable

from traceless.node.framing.base import Arrival, Framer, Inner
from traceless.node.framing.buckets import BucketFramer
from traceless.node.framing.paced import PacedFramer
from traceless.node.framing.plain import PlainFramer
from traceless.privacy.shape import ShapePolicy

__all__ = ["Arrival", "Framer", "Inner", "ShapeConflictError", "check_compatible", "framer_for"]


class ShapeConflictError(ValueError):
    """Two shape settings of which the chosen mode cannot apply one."""


def check_compatible(policy: ShapePolicy, stream_padding: int) -> None:
    if stream_padding and policy.on:
        raise ShapeConflictError(
            "stream padding applies with shape off only: with size buckets every whole response and "
            "every chunk already has a size fixed by the bucket table, so there is nothing left to pad"
        )


def framer_for(
    policy: ShapePolicy, stream_padding: int, max_model_len: int, defer_idle: Callable[[float], None] | None = None
) -> Framer:
    """The framer of `policy` (and, with shape off, the server's stream padding in bytes);
    `defer_idle` holds the engine's idle work off while a paced stream is open."""
    check_compatible(policy, stream_padding)
    if not policy.on:
        return PlainFramer(stream_padding)
    if policy.tick_ms == 0:
        return BucketFramer()
    return PacedFramer(policy, max_model_len, defer_idle)
