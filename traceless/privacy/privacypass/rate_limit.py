"""Per-user token quotas for the issuer: fixed windows, counters only.

The issuer knows who its users are (it authenticates them) but must keep nothing that
could later tie a token to a user. A fixed-window counter is the smallest state that
enforces a quota: for each user, the index of the current window and how many tokens were
issued in it. No timestamps of individual issuances, no request contents.

Fixed windows allow a burst of up to 2x the quota across a window boundary; that is the
price of storing one counter instead of a per-issuance log.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from traceless.privacy.privacypass.errors import RateLimitExceededError


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most tokens_per_window tokens per user per window, and max_batch per call."""

    tokens_per_window: int
    window_seconds: float
    max_batch: int = 100

    def __post_init__(self) -> None:
        if self.tokens_per_window < 1:
            raise ValueError("tokens_per_window must be at least 1")
        if not self.window_seconds > 0:
            raise ValueError("window_seconds must be positive")
        if self.max_batch < 1:
            raise ValueError("max_batch must be at least 1")


class TokenRateLimiter:
    """user_id -> (window index, tokens issued in that window); thread-safe."""

    __slots__ = ("limit", "_counters", "_lock")

    def __init__(self, limit: RateLimit) -> None:
        self.limit = limit
        self._counters: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def reserve(self, user_id: str, count: int, now: float) -> None:
        """Count `count` tokens against the user's window, or raise without counting."""
        if count < 1:
            raise ValueError("count must be at least 1")
        window = self._window(now)
        with self._lock:
            used = self._used(user_id, window)
            if used + count > self.limit.tokens_per_window:
                retry_after = (window + 1) * self.limit.window_seconds - now
                raise RateLimitExceededError("token quota for this window exceeded", retry_after=retry_after)
            self._counters[user_id] = (window, used + count)

    def refund(self, user_id: str, count: int, now: float) -> None:
        """Give back tokens reserved at `now` that were not issued after all.

        Only the window they were reserved in is credited: once the user's counter has
        moved on to a later window, the refund is moot and must not touch the new count.
        """
        window = self._window(now)
        with self._lock:
            stored = self._counters.get(user_id)
            if stored is not None and stored[0] == window:
                self._counters[user_id] = (window, max(0, stored[1] - count))

    def remaining(self, user_id: str, now: float) -> int:
        with self._lock:
            return self.limit.tokens_per_window - self._used(user_id, self._window(now))

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """A copy of everything stored (for audits and tests)."""
        with self._lock:
            return dict(self._counters)

    def _window(self, now: float) -> int:
        return math.floor(now / self.limit.window_seconds)

    def _used(self, user_id: str, window: int) -> int:
        stored = self._counters.get(user_id)
        return stored[1] if stored is not None and stored[0] == window else 0
