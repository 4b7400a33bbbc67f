"""Size buckets and a steady cadence: what the hops may learn of a message's shape (docs/shape-hiding.md).

Encryption hides content, not length or timing. Without padding, the relay and the gateway see each
request's length (the prompt's) and each streamed chunk's length and arrival time (the tokens'),
which is what the published "remote keylogging" and Whisper Leak attacks classify. With this
module's defaults on the node and in the client:

  request        the client pads the binary HTTP request (zero padding, RFC 9292 §3.8) to a bucket
  whole response the node pads the binary HTTP response the same way
  stream         the node sends one chunk per tick of a timer, every chunk's plaintext exactly
                 STREAM_CHUNK bytes: the SSE events that arrived since the last tick, filled out with
                 an SSE comment (or, for a JSON body, whitespace); a chunk is sent at every tick,
                 token or not, until the response ends. Output that outpaces the cadence waits for
                 the next tick (the cadence stays steady).

The bucket table (plaintext bytes; the same on both sides):

    1 KiB, 2 KiB, 4 KiB, ... 16 MiB   (powers of two; nothing larger fits a request)

What stays visible: the bucket (a length to within a factor of two), and a stream's duration in
ticks (so its output length in time, to within a tick).
"""
from __future__ import annotations

from dataclasses import dataclass

from traceless.privacy.wire import encode_varint

MIN_BUCKET = 1 << 10
MAX_BUCKET = 1 << 24
BUCKETS: tuple[int, ...] = tuple(MIN_BUCKET << k for k in range((MAX_BUCKET // MIN_BUCKET).bit_length()))
BUCKET_TABLE = "pow2:1KiB-16MiB"  # the table's name in a node's measured configuration
# One streamed chunk of STREAM_CHUNK plaintext bytes every DEFAULT_TICK_MS: 40 KiB/s, ~170 SSE token
# events a second per stream. Fewer, larger chunks cost the hops less than one chunk per token
# (docs/shape-hiding.md: the cost).
STREAM_CHUNK = 4 * MIN_BUCKET
DEFAULT_TICK_MS = 100


class ShapeError(ValueError):
    """A message too large for the bucket table, or a shape that cannot be built."""


def bucket_for(length: int) -> int:
    """The smallest bucket that holds `length` bytes."""
    if length < 0:
        raise ShapeError("a length is never negative")
    for b in BUCKETS:
        if length <= b:
            return b
    raise ShapeError(f"a message of more than {MAX_BUCKET} bytes fits no size bucket")


def bucket_padding(length: int) -> int:
    """Zero bytes to add to a message of `length` bytes to fill its bucket."""
    return bucket_for(length) - length


@dataclass(frozen=True, slots=True)
class ShapePolicy:
    """A node's shape hiding: `buckets` pads everything (the default); `off` sends lengths as they are.
    `tick_ms` is the stream cadence (0: one chunk per SSE event, each padded to a bucket)."""

    padding: str = "buckets"
    tick_ms: int = DEFAULT_TICK_MS

    def __post_init__(self) -> None:
        if self.padding not in ("buckets", "off"):
            raise ValueError("shape padding must be buckets or off")
        if not 0 <= self.tick_ms <= 1000:
            raise ValueError("the stream tick must be 0 to 1000 milliseconds")

    @property
    def on(self) -> bool:
        return self.padding == "buckets"

    def measured(self) -> dict:
        """What enters the node's measured configuration (so a client's policy can require it)."""
        return {"shape_padding": self.padding, "shape_buckets": BUCKET_TABLE if self.on else None,
                "stream_chunk": STREAM_CHUNK if self.on else None, "stream_tick_ms": self.tick_ms if self.on else None}


OFF = ShapePolicy("off", 0)


def content_room(total: int) -> int:
    """L such that one binary HTTP content chunk of L bytes (varint length + L) is exactly `total` bytes."""
    for n in (1, 2, 4, 8):
        if total - n >= 1 and len(encode_varint(total - n)) == n:
            return total - n
    raise ShapeError("no content chunk has exactly this length")


def sse_filler(n: int) -> bytes:
    """`n` bytes that an SSE parser ignores, at an event boundary: a comment line, or blank lines."""
    if n >= 4:
        return b": " + b"." * (n - 4) + b"\n\n"
    return (b"", b"\n", b":\n", b":\n\n")[n]


def json_filler(n: int) -> bytes:
    """`n` bytes of JSON whitespace (after a JSON document, parsers ignore it)."""
    return b" " * n


def pack(pending: bytearray, total: int, filler) -> tuple[bytes, int]:
    """One content chunk of exactly `total` bytes: as much of `pending` as fits, then `filler` if it
    all fits (`pending` always ends at an event boundary, so the filler does too). Returns the chunk
    and how many bytes of `pending` it took."""
    room = content_room(total)
    take = min(room, len(pending))
    with memoryview(pending) as view:
        body = bytes(view[:take])
    if take < room:
        body += filler(room - take)
    return encode_varint(room) + body, take


def sse_event(raw: bytes) -> bytes | None:
    """One SSE event (the text between blank lines) without comment and empty lines, ending in a
    blank line; None when nothing is left (a filler)."""
    lines = [line for line in raw.split(b"\n") if line and not line.startswith(b":")]
    return b"\n".join(lines) + b"\n\n" if lines else None


def split_sse(stream: bytes) -> list[bytes]:
    """A whole SSE stream's events, the padding dropped (as a client reads a shaped stream)."""
    return [e for e in map(sse_event, stream.split(b"\n\n")) if e is not None]
