"""What a relay sees of one streamed request to a node, and what the victim sees of it.

The relay reads the request's encrypted length, when the outer HTTP response head arrives, and the
length and arrival time of every encrypted chunk (the OHTTP chunk framing is in the clear). The
victim, apart, decrypts as chunks arrive: when its first token and its last content came.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx

from traceless.privacy.bhttp.stream import ResponseHead, ResponseStreamDecoder
from traceless.privacy.ohttp.call import encapsulate_call
from traceless.privacy.ohttp.chunked import ChunkedClientResponse
from traceless.privacy.ohttp.keys import KeyConfig, decode_ohttp_keys
from traceless.privacy.shape import sse_event
from traceless.privacy.wire import peek_varint

RESPONSE_NONCE = 16  # AES-128-GCM's max(Nn, Nk): the key config's first choice


@dataclass(frozen=True, slots=True)
class Trace:
    """What the relay sees of one request: its length, and each response chunk's length and arrival."""

    request_bytes: int
    sizes: tuple[int, ...]
    times: tuple[float, ...]  # seconds since the request was sent
    head: float = 0.0  # when the outer HTTP response head arrived, seconds since the request was sent
    # the victim's own view (never a feature): first token and last content event, as it decrypts them
    first_token: float = 0.0
    content_end: float = 0.0
    tokens: int = 0
    carried: tuple[bool, ...] = ()  # per chunk: did it carry content (else padding only); the victim's view

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip((0.0, *self.times), self.times)]


def key_config(url: str) -> KeyConfig:
    r = httpx.get(url.rstrip("/") + "/pcc/v1/ohttp-keys", timeout=30)
    r.raise_for_status()
    return decode_ohttp_keys(r.content)[0]


def observe(client: httpx.Client, url: str, config: KeyConfig, path: bytes, body: dict, pad: bool) -> Trace:
    """Send one streamed request to a node and record what a relay would see of it (and, apart, when
    the victim's tokens arrived, for the cost)."""
    call = encapsulate_call(config, path, json.dumps(body).encode(), stream=True, pad=pad)  # as the client sends it
    assert isinstance(call.context, ChunkedClientResponse)
    relay, victim = _RelayView(), _VictimView(call.context.decryptor())
    t0 = time.perf_counter()
    with client.stream(
        "POST", url.rstrip("/") + "/pcc/v1/ohttp", content=call.body, headers={"content-type": call.media_type}
    ) as r:
        head = time.perf_counter() - t0
        if r.status_code != 200:
            raise RuntimeError(f"the node answered HTTP {r.status_code}")
        for piece in r.iter_raw():
            now = time.perf_counter() - t0
            relay.feed(piece, now)
            victim.feed(piece, now)
    relay.finish(time.perf_counter() - t0)
    ok = victim.finish()
    if not ok:
        raise RuntimeError("the node refused the victim's request")
    return Trace(
        len(call.body),
        tuple(relay.sizes),
        tuple(relay.times),
        head,
        victim.first_token,
        victim.content_end,
        victim.tokens,
        tuple(victim.carried),
    )


class _RelayView:
    """Chunk lengths and arrival times from the OHTTP chunk framing, as any hop reads it."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.times: list[float] = []
        self._buf = bytearray()
        self._final = False
        self._nonce_read = False

    def feed(self, piece: bytes, now: float) -> None:
        self._buf += piece
        if not self._nonce_read:
            if len(self._buf) < RESPONSE_NONCE:
                return
            del self._buf[:RESPONSE_NONCE]
            self._nonce_read = True
        while not self._final and (head := peek_varint(self._buf)) is not None:
            length, n = head
            if length == 0:  # the final chunk runs to the end of the body
                self._final = True
                del self._buf[:n]
            elif len(self._buf) >= n + length:
                del self._buf[: n + length]
                self.sizes.append(length)
                self.times.append(now)
            else:
                break

    def finish(self, now: float) -> None:
        if self._final:
            self.sizes.append(len(self._buf))
            self.times.append(now)


class _VictimView:
    """The victim decrypting as chunks arrive: when its first token and its last content came."""

    def __init__(self, decryptor) -> None:
        self._dec, self._parser = decryptor, ResponseStreamDecoder()
        self._text = bytearray()
        self.first_token = self.content_end = 0.0
        self.tokens = 0
        self.status: int | None = None
        self.carried: list[bool] = []

    def _take(self, plains: list[bytes], now: float) -> None:
        for plain in plains:
            content = False
            for item in self._parser.feed(plain):
                if isinstance(item, ResponseHead):
                    self.status = item.status
                    continue
                self._text += item
                content = content or _carries(item)
            self.carried.append(content)
        while (end := self._text.find(b"\n\n")) != -1:
            event = sse_event(bytes(self._text[: end + 2]))
            del self._text[: end + 2]
            if event is None:
                continue
            if event.startswith(b"data: ") and event != b"data: [DONE]\n\n":
                self.tokens += 1
                self.first_token = self.first_token or now
            self.content_end = now

    def feed(self, piece: bytes, now: float) -> None:
        self._take(self._dec.feed(piece), now)

    def finish(self) -> bool:
        self._take([self._dec.finish()], self.content_end)
        self._parser.wipe()
        self._text[:] = bytes(len(self._text))
        return self.status == 200


def _carries(piece: bytes) -> bool:
    """Whether a piece of a shaped body holds content: anything but SSE comment lines, blank lines and
    JSON whitespace (the node's filler sits inside one chunk, so a chunk's filler is never split)."""
    return any(line.strip() and not line.startswith(b":") for line in piece.split(b"\n"))
