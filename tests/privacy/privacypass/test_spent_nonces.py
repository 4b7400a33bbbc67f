"""The bounded, expiring spent-nonce set: double spends, expiry, fail-closed capacity."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from traceless.privacy.privacypass.errors import DoubleSpendError, SpentSetFullError
from traceless.privacy.privacypass.spent_nonces import SpentNonceSet


def _nonce(i: int) -> bytes:
    return i.to_bytes(32, "big")


def test_second_add_is_a_double_spend_until_expiry():
    spent = SpentNonceSet(max_entries=10, max_ttl=100)
    spent.add(_nonce(1), expires_at=50, now=0)
    with pytest.raises(DoubleSpendError):
        spent.add(_nonce(1), expires_at=60, now=49.9)
    assert _nonce(1) in spent
    spent.add(_nonce(1), expires_at=120, now=50)  # expired at 50: the slot is free again
    assert len(spent) == 1


def test_full_set_fails_closed_and_keeps_unexpired_entries():
    spent = SpentNonceSet(max_entries=2, max_ttl=100)
    spent.add(_nonce(1), expires_at=30, now=0)
    spent.add(_nonce(2), expires_at=90, now=0)
    with pytest.raises(SpentSetFullError):
        spent.add(_nonce(3), expires_at=90, now=10)
    assert _nonce(3) not in spent  # a refused token is not recorded
    assert {_nonce(1), _nonce(2)} == {n for n in (_nonce(1), _nonce(2)) if n in spent}
    spent.add(_nonce(3), expires_at=90, now=30)  # nonce 1 expired: capacity is back
    assert _nonce(1) not in spent and _nonce(2) in spent and _nonce(3) in spent
    with pytest.raises(DoubleSpendError):
        spent.add(_nonce(2), expires_at=90, now=31)


def test_expiries_out_of_insertion_order_purge_correctly():
    spent = SpentNonceSet(max_entries=10, max_ttl=100)
    spent.add(_nonce(1), expires_at=80, now=0)
    spent.add(_nonce(2), expires_at=20, now=0)
    assert spent.purge(now=20) == 1
    assert _nonce(1) in spent and _nonce(2) not in spent
    assert spent.purge(now=80) == 0
    spent.check_integrity()


@pytest.mark.parametrize("expires_at", [10, 5, 111])
def test_entry_lifetime_must_be_inside_max_ttl(expires_at):
    spent = SpentNonceSet(max_entries=10, max_ttl=100)
    with pytest.raises(ValueError):
        spent.add(_nonce(1), expires_at=expires_at, now=10)
    assert len(spent) == 0


def test_constructor_checks():
    with pytest.raises(ValueError):
        SpentNonceSet(max_entries=0, max_ttl=1)
    with pytest.raises(ValueError):
        SpentNonceSet(max_entries=1, max_ttl=0)


@given(ops=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 50), st.integers(0, 5)), max_size=60))
def test_model_based(ops):
    """Against a plain-dict model: same accept/reject decisions, never over capacity."""
    spent = SpentNonceSet(max_entries=3, max_ttl=50)
    model: dict[int, float] = {}
    now = 0.0
    for nonce, lifetime, step in ops:
        now += step
        model = {n: t for n, t in model.items() if t > now}
        if nonce in model:
            with pytest.raises(DoubleSpendError):
                spent.add(_nonce(nonce), now + lifetime, now)
        elif len(model) >= 3:
            with pytest.raises(SpentSetFullError):
                spent.add(_nonce(nonce), now + lifetime, now)
        else:
            spent.add(_nonce(nonce), now + lifetime, now)
            model[nonce] = now + lifetime
        assert len(spent) <= 3
        spent.check_integrity()
