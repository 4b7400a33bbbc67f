"""Fixed-window per-user token counters."""

from __future__ import annotations

import pytest

from traceless.privacy.privacypass.errors import RateLimitExceededError
from traceless.privacy.privacypass.rate_limit import RateLimit, TokenRateLimiter


def test_reserve_refund_and_window_rollover():
    limiter = TokenRateLimiter(RateLimit(tokens_per_window=3, window_seconds=10.0))
    limiter.reserve("u", 3, now=5.0)
    with pytest.raises(RateLimitExceededError) as err:
        limiter.reserve("u", 1, now=9.0)
    assert err.value.retry_after == pytest.approx(1.0)
    limiter.refund("u", 2, now=9.0)
    assert limiter.remaining("u", now=9.0) == 2
    assert limiter.snapshot() == {"u": (0, 1)}
    assert limiter.remaining("u", now=10.0) == 3  # a new window
    limiter.reserve("u", 3, now=10.0)
    assert limiter.snapshot() == {"u": (1, 3)}


def test_refund_never_goes_negative_and_old_windows_do_not_count():
    limiter = TokenRateLimiter(RateLimit(tokens_per_window=3, window_seconds=10.0))
    limiter.reserve("u", 2, now=1.0)
    limiter.refund("u", 5, now=1.0)
    assert limiter.snapshot() == {"u": (0, 0)}
    limiter.reserve("u", 2, now=1.0)
    limiter.reserve("u", 3, now=12.0)  # the counter moves on to window 1 ...
    limiter.refund("u", 2, now=1.0)  # ... so a late refund for window 0 must not touch it
    assert limiter.snapshot() == {"u": (1, 3)}
    assert limiter.remaining("u", now=12.0) == 0
    with pytest.raises(ValueError):
        limiter.reserve("u", 0, now=12.0)
