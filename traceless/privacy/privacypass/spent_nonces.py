"""Bounded, expiring record of redeemed token nonces: double-spend prevention.

Why it is safe to forget a nonce
--------------------------------
An entry may be dropped only when the token it records can no longer be accepted for some
other reason. The verifier gives every nonce the expiry of the acceptance window of the
challenge its token answers (`RedemptionSchedule`): from that instant on, the token's
challenge_digest matches no accepted challenge, so a replay is refused by the challenge
check and the entry is dead weight. Expiry is compared against the same `now` the verifier
used for the challenge check, so there is no gap between the two.

Why it fails closed
-------------------
When every slot holds an unexpired nonce, add() raises SpentSetFullError and the new
token is refused (HTTP 503; it was not recorded, so the client can retry). Evicting an
unexpired nonce instead would let that token be spent again. `max_ttl` bounds how long any
entry can live, so capacity planning is: max_entries >= peak redemptions per max_ttl.
Memory is roughly 200 bytes per entry (1,000,000 entries ~ 200 MB).

The set lives in process memory. Its lifetime must cover every challenge it vouches for;
`RedemptionSchedule` gets that by deriving challenges from a per-process secret, so a
restarted verifier accepts no token issued for its predecessor's challenges.
"""

from __future__ import annotations

import heapq
import threading

from traceless.privacy.privacypass.errors import DoubleSpendError, SpentSetFullError


class SpentNonceSet:
    """Nonces of redeemed tokens, each kept until its token's acceptance window closes.

    Invariant (checked by check_integrity): `_expiry` and `_heap` hold the same
    (nonce, expires_at) pairs, and after purge(now) every held entry expires after now.
    """

    __slots__ = ("max_entries", "max_ttl", "_expiry", "_heap", "_lock")

    def __init__(self, *, max_entries: int, max_ttl: float) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if not max_ttl > 0:
            raise ValueError("max_ttl must be positive")
        self.max_entries = max_entries
        self.max_ttl = max_ttl
        self._expiry: dict[bytes, float] = {}  # nonce -> expires_at
        self._heap: list[tuple[float, bytes]] = []  # (expires_at, nonce), earliest first
        self._lock = threading.Lock()

    def add(self, nonce: bytes, expires_at: float, now: float) -> None:
        """Record nonce as spent until expires_at; raises if already spent or if full.

        Nothing is recorded when it raises.
        """
        if expires_at <= now:
            raise ValueError("expires_at must be after now")
        if expires_at > now + self.max_ttl:
            raise ValueError("expires_at is beyond max_ttl; entry lifetime must be bounded")
        with self._lock:
            self._purge(now)
            if nonce in self._expiry:
                raise DoubleSpendError("token nonce already redeemed")
            if len(self._expiry) >= self.max_entries:
                raise SpentSetFullError("spent-nonce set is full of unexpired entries")
            self._expiry[nonce] = expires_at
            heapq.heappush(self._heap, (expires_at, nonce))

    def purge(self, now: float) -> int:
        """Drop entries whose window has closed; returns how many remain."""
        with self._lock:
            self._purge(now)
            return len(self._expiry)

    def __len__(self) -> int:
        return len(self._expiry)

    def __contains__(self, nonce: object) -> bool:
        return nonce in self._expiry

    def check_integrity(self) -> None:
        with self._lock:
            pairs = {(nonce, at) for at, nonce in self._heap}
            if pairs != set(self._expiry.items()) or len(self._heap) != len(self._expiry):
                raise RuntimeError("spent-nonce heap and map disagree")

    def _purge(self, now: float) -> None:
        # Expiries are not in insertion order (two challenge windows overlap), hence a heap.
        while self._heap and self._heap[0][0] <= now:
            _, nonce = heapq.heappop(self._heap)
            del self._expiry[nonce]  # a nonce is re-added only after its old entry is gone
