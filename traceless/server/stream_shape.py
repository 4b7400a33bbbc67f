"""Streams that do not leak through their shape.

Token boundaries and per-step token counts (speculative decoding emits a varying number of tokens
per step) show through the sizes and timing of streamed chunks, even encrypted; published attacks
fingerprint queries from them. Two knobs:

  interval  emit one SSE event per `interval` generated tokens (plus the final one) instead of
            one per engine step.
  padding   pad every streamed plaintext event to exactly `padding` bytes (or the next multiple of
            it, for an event that does not fit) with an SSE comment line, which SSE clients ignore:

                data: {...}\\n
                : ..........\\n
                \\n
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StreamShape:
    padding: int = 0  # bytes per event; 0 = off
    interval: int = 1  # tokens per event

    def __post_init__(self) -> None:
        if self.padding < 0 or (0 < self.padding < 64):
            raise ValueError("stream padding must be 0 (off) or at least 64 bytes")
        if self.interval < 1:
            raise ValueError("stream interval must be at least 1 token")


COMMENT_OVERHEAD = len(b": \n")


def pad_event(event: bytes, size: int) -> bytes:
    """`event` (an SSE event ending in a blank line) padded to a multiple of `size` bytes."""
    if size <= 0:
        return event
    body = event[:-1] if event.endswith(b"\n\n") else event + b"\n"  # keep one newline, re-add the blank line
    need = len(body) + COMMENT_OVERHEAD + 1
    target = -(-need // size) * size
    return body + b": " + b"." * (target - need) + b"\n\n"


def padding_event(size: int) -> bytes:
    """An SSE event of exactly `size` bytes that carries nothing (a comment)."""
    return b": " + b"." * (size - COMMENT_OVERHEAD - 1) + b"\n\n"
