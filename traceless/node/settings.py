"""A node's settings (what `traceless node` is given)."""

from __future__ import annotations

from dataclasses import dataclass

from traceless.node.framing import check_compatible
from traceless.privacy.shape import ShapePolicy
from traceless.server.stream_shape import StreamShape


@dataclass(frozen=True, slots=True)
class NodeSettings:
    model_name: str
    capacity: int = 1
    max_body_bytes: int = 4 * 2**20
    attestation_ttl_s: int = 300
    gateway_url: str | None = None
    public_url: str | None = None
    register_interval_s: float = 60.0
    stream_shape: StreamShape = StreamShape()
    shape: ShapePolicy = ShapePolicy()  # size buckets and a steady stream cadence (docs/shape-hiding.md)
    request_events: bool = False  # per-request log lines (--request-events: measured, off by default)

    def __post_init__(self) -> None:
        check_compatible(self.shape, self.stream_shape.padding)  # a setting the framing cannot apply
