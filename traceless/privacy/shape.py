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
                 the next tick (the cadence stays steady). The response head and the first chunk
                 leave on a tick, and not before the request's prefill budget (a fixed delay per
                 request bucket) has passed; after the last content the stream runs on with filler
                 chunks to its decode budget (max_tokens x a budget per token), or, without
                 max_tokens or past the budget, to a power-of-two number of ticks.

The bucket table (plaintext bytes; the same on both sides):

    1 KiB, 2 KiB, 4 KiB, ... 16 MiB   (powers of two; nothing larger fits a request)

What stays visible: the bucket (a length to within a factor of two); max_tokens, through the
stream's length; the answer's length to within a factor of two when there is no max_tokens or
generation ran past its budget; a first tick later than the budget when prefill took longer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from traceless.modes import as_mode
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
# The prefill budget: a stream's first tick comes no sooner than this many milliseconds per KiB of
# the request's bucket after the request arrived (the built-in model prefills a KiB of prompt in
# well under this on a 2-core CPU, with room for a loaded machine).
DEFAULT_PREFILL_MS_PER_KIB = 500
# The decode budget: a stream whose request sets max_tokens runs for max_tokens x this many
# milliseconds (the built-in model decodes a token in well under this on a loaded 2-core CPU),
# unless that is longer than MAX_BUDGET_S.
DEFAULT_DECODE_MS_PER_TOKEN = 200
MAX_BUDGET_S = 120
STREAM_TICKS = "decode-budget|pow2"  # stream lengths: the measured name of the rule in padded_ticks


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


class ShapePadding(Enum):
    BUCKETS = "buckets"  # every size padded to its bucket, streams on a steady cadence (the default)
    OFF = "off"  # lengths and timings as they are: measurements only


@dataclass(frozen=True, slots=True)
class ShapePolicy:
    """A node's shape hiding: `buckets` pads everything (the default); `off` sends lengths as they are.
    `tick_ms` is the stream cadence (0: one chunk per SSE event, each padded to a bucket)."""

    padding: ShapePadding = ShapePadding.BUCKETS  # or its word ("off"), converted on construction
    tick_ms: int = DEFAULT_TICK_MS
    prefill_ms_per_kib: int = DEFAULT_PREFILL_MS_PER_KIB  # with a tick: the first tick's earliest time
    decode_ms_per_token: int = DEFAULT_DECODE_MS_PER_TOKEN  # with a tick: how long a stream runs
    ballast: bool = True  # with a tick: the engine decodes for no one while a stream is open and it is idle

    def __post_init__(self) -> None:
        object.__setattr__(self, "padding", as_mode("shape padding", ShapePadding, self.padding))
        if not 0 <= self.tick_ms <= 1000:
            raise ValueError("the stream tick must be 0 to 1000 milliseconds")
        if not 0 <= self.prefill_ms_per_kib <= 60_000:
            raise ValueError("the prefill budget must be 0 to 60000 milliseconds per KiB")
        if not 0 <= self.decode_ms_per_token <= 60_000:
            raise ValueError("the decode budget must be 0 to 60000 milliseconds per token")

    @property
    def on(self) -> bool:
        return self.padding is ShapePadding.BUCKETS

    def measured(self) -> dict:
        """What enters the node's measured configuration (so a client's policy can require it)."""
        paced = self.on and self.tick_ms > 0
        return {
            "shape_padding": self.padding.value,
            "shape_buckets": BUCKET_TABLE if self.on else None,
            "stream_chunk": STREAM_CHUNK if self.on else None,
            "stream_tick_ms": self.tick_ms if self.on else None,
            "prefill_ms_per_kib": self.prefill_ms_per_kib if paced else None,
            "decode_ms_per_token": self.decode_ms_per_token if paced else None,
            "stream_ticks": STREAM_TICKS if paced else None,
            "stream_ballast": self.ballast if paced else None,
        }

    @property
    def paced(self) -> bool:
        return self.on and self.tick_ms > 0

    def prefill_budget_s(self, request_bytes: int, max_bytes: int) -> float:
        """How long after a request arrives its stream may start: the budget for its bucket, the
        bucket taken at most as large as `max_bytes` (no longer prompt can be prefilled)."""
        kib = bucket_for(min(request_bytes, max_bytes)) / MIN_BUCKET
        return self.prefill_ms_per_kib * kib / 1000

    def decode_budget_ticks(self, max_tokens: int | None) -> int | None:
        """A stream's length in ticks when its answer ends within max_tokens x the per-token budget;
        None without max_tokens or when that is past MAX_BUDGET_S (then powers of two)."""
        if max_tokens is None or not self.tick_ms:
            return None
        ticks = math.ceil(max_tokens * self.decode_ms_per_token / self.tick_ms)
        return ticks if ticks * self.tick_ms <= MAX_BUDGET_S * 1000 else None


OFF = ShapePolicy(ShapePadding.OFF, 0)


def first_tick(arrived: float, now: float, tick_s: float, budget_s: float) -> float:
    """The time of a stream's first tick: on the grid that starts at the request's arrival, the
    first point at least one tick and `budget_s` after arrival and not before `now`."""
    k = max(1, math.ceil(round(budget_s / tick_s, 9)), math.ceil(round((now - arrived) / tick_s, 9)))
    return arrived + k * tick_s


def padded_ticks(ticks: int, budget_ticks: int | None) -> int:
    """How many ticks a stream whose content ended at tick `ticks` runs to: its decode budget
    (max_tokens x the budget per token, in ticks) when it ended within it, so an answer that ends
    early looks like one that ran to the limit; otherwise (no max_tokens, a budget past
    MAX_BUDGET_S, a generation slower than its budget) the next power of two."""
    if budget_ticks is not None and ticks <= budget_ticks:
        return budget_ticks
    return 1 << max(0, ticks - 1).bit_length()


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
