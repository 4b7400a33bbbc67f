"""Epoch-bound challenges: offered and accepted windows, and the max-window bound."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from traceless.privacy.privacypass.redemption_schedule import RedemptionSchedule

KEY = b"k" * 32


def _schedule(epoch=100.0, grace=30.0, key=KEY) -> RedemptionSchedule:
    return RedemptionSchedule("issuer.example", "gateway.example", epoch, grace, key)


def test_challenge_is_per_epoch_and_keyed():
    s = _schedule()
    a, b = s.current(100.0), s.current(199.9)
    assert a == b
    assert s.current(200.0).challenge != a.challenge
    assert _schedule(key=b"q" * 32).current(100.0).challenge != a.challenge
    assert len(a.challenge.redemption_context) == 32
    assert a.challenge.issuer_name == "issuer.example"
    assert a.challenge.origin_info == "gateway.example"
    assert a.digest == a.challenge.digest()
    assert a.not_after == 230.0


def test_previous_epoch_is_accepted_only_during_grace():
    s = _schedule()
    c1 = s.challenge_for_epoch(1)
    assert [x.challenge for x in s.accepted(210.0)] == [s.current(210.0).challenge, c1.challenge]
    assert c1 not in s.accepted(230.0)
    assert len(s.accepted(230.0)) == 1


def test_default_context_key_is_fresh_and_not_in_repr():
    a = RedemptionSchedule("issuer.example", "", 60.0, 0.0)
    b = RedemptionSchedule("issuer.example", "", 60.0, 0.0)
    assert a.current(1000.0).challenge != b.current(1000.0).challenge
    assert a.context_key.hex() not in repr(a)


@pytest.mark.parametrize(
    "args",
    [(0.0, 0.0, KEY), (10.0, 11.0, KEY), (10.0, -1.0, KEY), (10.0, 1.0, b"short")],
)
def test_bad_configuration_is_refused(args):
    with pytest.raises(ValueError):
        RedemptionSchedule("issuer.example", "", *args)


@given(now=st.floats(min_value=0, max_value=4e9), epoch=st.sampled_from([0.5, 7.0, 3600.0]))
def test_every_accepted_window_is_open_and_bounded(now, epoch):
    """The spent-set TTL argument: each accepted challenge is still open at `now`
    and closes no later than one epoch plus grace after it (within the verifier's 1 s
    float-rounding slack on the spent set's max_ttl)."""
    s = _schedule(epoch=epoch, grace=epoch / 2)
    for accepted in s.accepted(now):
        assert now < accepted.not_after
        assert accepted.not_after - now <= s.max_window_seconds + 1.0
