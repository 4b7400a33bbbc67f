"""Redemption at the gateway: the full header flow, replay, expiry, capacity, bit flips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceless.privacy.privacypass import protocol as pp
from traceless.privacy.privacypass.errors import (
    ChallengeMismatchError,
    DoubleSpendError,
    MalformedTokenError,
    SpentSetFullError,
    TokenKeyError,
    TokenRejectedError,
    TokenSignatureError,
    TokenTypeError,
)
from traceless.privacy.privacypass.http import (
    b64url_encode,
    choose_challenge,
    format_authorization,
    parse_www_authenticate,
)
from traceless.privacy.privacypass.redemption_schedule import RedemptionSchedule
from traceless.privacy.privacypass.verifier import Verifier
from traceless.privacy.privacypass.wire import Token, TokenChallenge

ORIGIN = "gateway.example"
SCHEDULE = RedemptionSchedule("issuer.example", ORIGIN, 100.0, 50.0)
T0 = 1_000_000.0  # start of epoch 10000; epoch 9999's grace runs until T0 + 50


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def issuers() -> tuple[pp.Issuer, pp.Issuer]:
    return pp.Issuer.generate(), pp.Issuer.generate()


def _token(issuer: pp.Issuer, challenge: TokenChallenge) -> Token:
    request, state = pp.begin(challenge, issuer.public_key)
    return pp.finalize(state, issuer.issue(request))


def _verifier(issuer: pp.Issuer, clock: Clock, **kwargs) -> Verifier:
    return Verifier([issuer.public_key], SCHEDULE, clock=clock, **kwargs)


@pytest.fixture(scope="module")
def current_token(issuers) -> Token:
    return _token(issuers[0], SCHEDULE.current(T0).challenge)


def test_header_flow_end_to_end_and_replay(issuers):
    issuer = issuers[0]
    verifier = _verifier(issuer, Clock(T0 + 10))
    challenges = parse_www_authenticate(verifier.www_authenticate())
    assert challenges[0].max_age == 140  # accepted until T0 + 150
    selected = choose_challenge(challenges, ORIGIN, issuer.public_key)
    assert selected is not None
    token = _token(issuer, selected.challenge)
    header = format_authorization(token)
    verifier.redeem_authorization(header)
    assert token.nonce in verifier.spent
    with pytest.raises(DoubleSpendError) as err:
        verifier.redeem_authorization(header)
    assert err.value.http_status == 401


def test_replay_after_expiry_is_still_rejected(issuers, current_token):
    clock = Clock(T0 + 1)
    verifier = _verifier(issuers[0], clock)
    verifier.redeem(current_token)
    clock.now = T0 + 150  # the challenge's window closes: the nonce may be forgotten ...
    assert verifier.spent.purge(clock.now) == 0
    with pytest.raises(ChallengeMismatchError):  # ... because the token is refused anyway
        verifier.redeem(current_token)


def test_previous_epoch_tokens_are_accepted_only_in_grace(issuers):
    old = _token(issuers[0], SCHEDULE.challenge_for_epoch(9999).challenge)
    clock = Clock(T0 + 49)
    _verifier(issuers[0], clock).redeem(old)
    clock.now = T0 + 50
    with pytest.raises(ChallengeMismatchError):
        _verifier(issuers[0], clock).redeem(old)


def test_full_spent_set_fails_closed_then_recovers(issuers):
    issuer = issuers[0]
    old = [_token(issuer, SCHEDULE.challenge_for_epoch(9999).challenge) for _ in range(2)]
    new = _token(issuer, SCHEDULE.current(T0).challenge)
    clock = Clock(T0 + 10)
    verifier = _verifier(issuer, clock, max_spent_entries=2)
    for token in old:
        verifier.redeem(token)
    with pytest.raises(SpentSetFullError) as err:
        verifier.redeem(new)
    assert err.value.http_status == 503
    assert new.nonce not in verifier.spent
    for token in old:  # the full set forgot nothing
        with pytest.raises(DoubleSpendError):
            verifier.redeem(token)
    clock.now = T0 + 50  # epoch 9999's window closes; its two entries expire
    verifier.redeem(new)
    assert len(verifier.spent) == 1


def test_wrong_issuer_and_wrong_challenge_are_rejected(issuers, current_token):
    first, second = issuers
    clock = Clock(T0)
    with pytest.raises(TokenKeyError):
        _verifier(second, clock).redeem(current_token)
    Verifier([second.public_key, first.public_key], SCHEDULE, clock=clock).redeem(current_token)
    other_context = RedemptionSchedule("other.example", ORIGIN, 100.0, 50.0)
    foreign = _token(first, other_context.current(T0).challenge)
    with pytest.raises(ChallengeMismatchError):
        _verifier(first, clock).redeem(foreign)
    t = current_token
    forged = Token(2, b"\x00" * 32, t.challenge_digest, t.token_key_id, t.authenticator)
    verifier = _verifier(first, clock)
    with pytest.raises(TokenSignatureError):
        verifier.redeem(forged)
    assert len(verifier.spent) == 0


@pytest.mark.parametrize(
    ("header", "error"),
    [
        ('Basic realm="x"', MalformedTokenError),
        ('PrivateToken token="AAIA"', MalformedTokenError),  # type 2, truncated
        ("PrivateToken token=AAIAAAAAAA", MalformedTokenError),
        ('PrivateToken token="AAAA"', TokenTypeError),  # type 0
    ],
)
def test_malformed_headers(issuers, header, error):
    with pytest.raises(error):
        _verifier(issuers[0], Clock(T0)).redeem_authorization(header)


def test_other_token_type_in_header(issuers, current_token):
    type1 = b"\x00\x01" + current_token.encode()[2:]
    verifier = _verifier(issuers[0], Clock(T0))
    with pytest.raises(TokenTypeError):
        verifier.redeem_authorization(f'PrivateToken token="{b64url_encode(type1)}"')


@settings(max_examples=80, deadline=None)
@given(bit=st.integers(min_value=0, max_value=(2 + 32 * 3 + 256) * 8 - 1))
def test_any_flipped_bit_in_a_token_is_rejected_without_state_change(issuers, current_token, bit):
    verifier = _verifier(issuers[0], Clock(T0 + 5))
    raw = bytearray(current_token.encode())
    raw[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(TokenRejectedError):
        verifier.redeem_authorization(f'PrivateToken token="{b64url_encode(bytes(raw))}"')
    assert len(verifier.spent) == 0
    verifier.redeem(current_token)  # the genuine token is still good


def test_check_records_nothing_and_spend_records_once(issuers, current_token):
    clock = Clock(T0 + 1)
    verifier = _verifier(issuers[0], clock)
    first = verifier.check(current_token)
    second = verifier.check(current_token)  # two requests racing with one token both pass the check
    assert len(verifier.spent) == 0
    verifier.spend(first)
    assert current_token.nonce in verifier.spent
    with pytest.raises(DoubleSpendError):
        verifier.spend(second)  # ... and only one of them spends it
    with pytest.raises(DoubleSpendError):
        verifier.check(current_token)  # a spent token is refused by the check itself


def test_spend_after_the_window_closed_is_refused(issuers, current_token):
    clock = Clock(T0 + 1)
    verifier = _verifier(issuers[0], clock)
    checked = verifier.check(current_token)
    clock.now = checked.not_after
    with pytest.raises(ChallengeMismatchError):
        verifier.spend(checked)
    assert len(verifier.spent) == 0
