"""Epoch-bound public challenges: offered and accepted windows, the max-window bound, and one
challenge per epoch for everyone (anyone can derive it)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from traceless.privacy.privacypass.redemption_schedule import RedemptionSchedule, epoch_context


def _schedule(epoch=100.0, grace=30.0, early=0.0) -> RedemptionSchedule:
    return RedemptionSchedule("issuer.example", "gateway.example", epoch, grace, early)


def test_challenge_is_per_epoch_and_public():
    s = _schedule()
    a, b = s.current(100.0), s.current(199.9)
    assert a == b
    assert s.current(200.0).challenge != a.challenge
    assert len(a.challenge.redemption_context) == 32
    assert a.challenge.redemption_context == epoch_context("issuer.example", "gateway.example", 100.0, 1)
    assert a.challenge.issuer_name == "issuer.example"
    assert a.challenge.origin_info == "gateway.example"
    assert a.digest == a.challenge.digest()
    assert a.not_after == 230.0


def test_every_schedule_of_the_same_issuer_and_epoch_length_agrees():
    """A restarted gateway (or another replica) offers the same challenge; another epoch length or
    issuer gives another one."""
    assert _schedule().current(1000.0) == _schedule().current(1000.0)
    assert _schedule(epoch=50.0, grace=0.0).current(1000.0).challenge != _schedule().current(1000.0).challenge
    other = RedemptionSchedule("other.example", "gateway.example", 100.0, 30.0)
    ours = _schedule().current(1000.0).challenge
    assert other.current(1000.0).challenge.redemption_context != ours.redemption_context


def test_previous_epoch_is_accepted_only_during_grace():
    s = _schedule()
    c1 = s.challenge_for_epoch(1)
    assert [x.challenge for x in s.accepted(210.0)] == [s.current(210.0).challenge, c1.challenge]
    assert c1 not in s.accepted(230.0)
    assert len(s.accepted(230.0)) == 1


def test_the_next_epoch_is_accepted_early_only_within_early_seconds():
    s = _schedule(early=10.0)
    upcoming = s.challenge_for_epoch(3).challenge
    assert upcoming not in [x.challenge for x in s.accepted(285.0)]
    assert upcoming in [x.challenge for x in s.accepted(292.0)]
    assert [x.challenge for x in s.plausible(295.0, 10.0)] == [s.challenge_for_epoch(2).challenge, upcoming]
    assert [x.challenge for x in s.plausible(250.0, 10.0)] == [s.challenge_for_epoch(2).challenge]


@pytest.mark.parametrize("args", [(0.0, 0.0), (10.0, 11.0), (10.0, -1.0), (10.0, 1.0, 11.0), (10.0, 1.0, -1.0)])
def test_bad_configuration_is_refused(args):
    with pytest.raises(ValueError):
        RedemptionSchedule("issuer.example", "", *args)


@given(
    now=st.floats(min_value=0, max_value=4e9),
    epoch=st.sampled_from([0.5, 7.0, 3600.0]),
    early=st.sampled_from([0.0, 0.25]),
)
def test_every_accepted_window_is_open_and_bounded(now, epoch, early):
    """The spent-set TTL argument: each accepted challenge is still open at `now`
    and closes no later than early + one epoch + grace after it (within the verifier's 1 s
    float-rounding slack on the spent set's max_ttl)."""
    s = _schedule(epoch=epoch, grace=epoch / 2, early=early * epoch)
    for accepted in s.accepted(now):
        assert now < accepted.not_after
        assert accepted.not_after - now <= s.max_window_seconds + 1.0
