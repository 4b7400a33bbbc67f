"""The node's OHTTP keys: rotated on a schedule with an overlap window, and a replay cache per key.

    t:      0 ............ rotation_s ............ rotation_s + overlap_s
    key A:  [ newest: clients encrypt to it ][ still accepted ]  gone (and its replay cache)
    key B:                 [ newest .......................................

Every live key is in `ohttp_keys()` (newest first) and so in every attestation; clients use the
newest. A key and its replay cache are memory only and die together: once a key is dropped no
request to it can be opened, so there is nothing left to replay.

The replay cache holds the HPKE `enc` of every request a key has opened. `enc` fixes the request's
HPKE context, so the same `enc` with any ciphertext is the same request (or a forgery that fails
to open). It is bounded: when full the node refuses new requests (503) rather than forget an
entry, which would let that request be replayed. Entries are added only after decapsulation
succeeded, so unauthenticated garbage cannot fill it. Rotation is lazy, on the next use after it
is due, with an injectable clock; the ring lives on the node's event loop (no awaits inside).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from traceless.errors import TracelessError
from traceless.privacy.hpke.kem import KEM_PARAMS, kem_id_from_int
from traceless.privacy.ohttp.gateway import OhttpServer
from traceless.privacy.ohttp.keys import encode_ohttp_keys

HEADER_LEN = 7  # key_id (1) | kem_id (2) | kdf_id (2) | aead_id (2), RFC 9458 section 4.3


class ReplayedRequestError(TracelessError):
    """This encapsulated request was already opened under a key that is still live."""


class ReplayCacheFullError(TracelessError):
    """The replay cache is full; the node takes no new request until a key retires."""


@dataclass(slots=True)
class _LiveKey:
    server: OhttpServer
    created: float
    seen: set[bytes] = field(default_factory=set)  # enc of every request opened under this key


class KeyRing:
    def __init__(
        self,
        rotation_s: float = 3600.0,
        overlap_s: float = 600.0,
        *,
        clock: Callable[[], float] = time.time,
        max_replay_entries: int = 1_000_000,
    ) -> None:
        if not (rotation_s > 0 and 0 <= overlap_s <= rotation_s) or max_replay_entries < 1:
            raise ValueError("need rotation_s > 0, 0 <= overlap_s <= rotation_s and a positive cache size")
        self._rotation_s, self._overlap_s, self._clock = rotation_s, overlap_s, clock
        self._max_entries = max_replay_entries
        self._keys: list[_LiveKey] = [_LiveKey(OhttpServer(key_id=1), clock())]  # newest first

    def _maintain(self) -> None:
        now = self._clock()
        if now - self._keys[0].created >= self._rotation_s:
            key_id = self._keys[0].server.key_config.key_id % 255 + 1  # 1..255, never one still live
            self._keys.insert(0, _LiveKey(OhttpServer(key_id=key_id), now))
        # An older key stays until overlap_s after it was due to be replaced (by the schedule, not by
        # when the lazy rotation noticed: an idle node does not stretch a key's life).
        retire_after = self._rotation_s + self._overlap_s
        self._keys = [self._keys[0]] + [k for k in self._keys[1:] if now - k.created < retire_after]

    @property
    def current(self) -> OhttpServer:
        """The newest key (clients encrypt to it)."""
        self._maintain()
        return self._keys[0].server

    def ohttp_keys(self) -> bytes:
        """The application/ohttp-keys body: every live key, newest first."""
        self._maintain()
        return encode_ohttp_keys([k.server.key_config for k in self._keys])

    def _live(self, enc_request: bytes) -> _LiveKey | None:
        self._maintain()
        key_id = enc_request[0] if enc_request else -1
        return next((k for k in self._keys if k.server.key_config.key_id == key_id), None)

    def server_for(self, enc_request: bytes) -> OhttpServer | None:
        """The live key the request names (its first byte), or None."""
        live = self._live(enc_request)
        return live.server if live is not None else None

    def admit(self, enc_request: bytes) -> None:
        """Record a request that its key has just opened; raise if it was opened before (replay)
        or the cache is full. Call only after decapsulation succeeded."""
        live = self._live(enc_request)
        if live is None:
            raise ReplayedRequestError("the request's key is no longer live")
        enc = _enc(enc_request, live.server)
        if enc in live.seen:
            raise ReplayedRequestError("this request was already received")
        if self.replay_entries() >= self._max_entries:
            raise ReplayCacheFullError("the replay cache is full")
        live.seen.add(enc)

    def replay_entries(self) -> int:
        self._maintain()
        return sum(len(k.seen) for k in self._keys)


def _enc(enc_request: bytes, server: OhttpServer) -> bytes:
    n_enc = KEM_PARAMS[kem_id_from_int(server.key_config.kem_id)].n_enc
    return bytes(enc_request[HEADER_LEN : HEADER_LEN + n_enc])
