"""The issuance service: API-key auth, per-user quotas with window reset, batches, and
that nothing stored links a token to its user."""

from __future__ import annotations

import json

import pytest

from traceless.privacy.privacypass import protocol as pp
from traceless.privacy.privacypass.batch_issuance import ApiKeyStore, TokenIssuanceService
from traceless.privacy.privacypass.errors import (
    AuthenticationError,
    BatchSizeError,
    BatchTooLargeError,
    DecodeError,
    InvalidInputError,
    RateLimitExceededError,
    UnknownTokenKeyError,
    UnsupportedTokenTypeError,
)
from traceless.privacy.privacypass.rate_limit import RateLimit
from traceless.privacy.privacypass.redemption_schedule import RedemptionSchedule
from traceless.privacy.privacypass.verifier import Verifier
from traceless.privacy.privacypass.wire import TokenRequest, TokenResponse

ALICE_KEY = "alice-key-0123456789abcdef"
BOB_KEY = "bob-key-0123456789abcdefgh"
KEYS = {"alice": ALICE_KEY, "bob": BOB_KEY}
SCHEDULE = RedemptionSchedule("issuer.example", "gateway.example", 3600.0, 600.0)
T0 = 7200.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def issuer() -> pp.Issuer:
    return pp.Issuer.generate()


def _service(issuer, clock, tokens=5, window=60.0, max_batch=4) -> TokenIssuanceService:
    return TokenIssuanceService(issuer, ApiKeyStore(KEYS), RateLimit(tokens, window, max_batch), clock=clock)


def _requests(issuer, n):
    challenge = SCHEDULE.current(T0).challenge
    pairs = [pp.begin(challenge, issuer.public_key) for _ in range(n)]
    return [req.encode() for req, _ in pairs], [state for _, state in pairs]


def test_batch_issuance_yields_tokens_the_verifier_accepts(issuer):
    service = _service(issuer, Clock(T0))
    raw_requests, states = _requests(issuer, 3)
    responses = service.issue_batch(ALICE_KEY, raw_requests)
    assert len(responses) == 3
    verifier = Verifier([service.issuer_key], SCHEDULE, clock=Clock(T0 + 1))
    for state, raw in zip(states, responses):
        verifier.redeem(pp.finalize(state, TokenResponse.decode(raw)))
    assert len(verifier.spent) == 3


def test_rate_limit_is_per_user_and_resets_after_the_window(issuer):
    clock = Clock(T0)
    service = _service(issuer, clock, tokens=5, window=60.0)
    service.issue_batch(ALICE_KEY, _requests(issuer, 4)[0])
    assert service.remaining(ALICE_KEY) == 1
    with pytest.raises(RateLimitExceededError) as err:
        service.issue_batch(ALICE_KEY, _requests(issuer, 2)[0])  # all or nothing
    assert err.value.http_status == 429
    assert err.value.retry_after == pytest.approx(60.0)
    assert service.remaining(ALICE_KEY) == 1
    assert len(service.issue_batch(BOB_KEY, _requests(issuer, 4)[0])) == 4  # bob's own quota
    service.issue_batch(ALICE_KEY, _requests(issuer, 1)[0])
    with pytest.raises(RateLimitExceededError):
        service.issue_batch(ALICE_KEY, _requests(issuer, 1)[0])
    clock.now = T0 + 59.9
    with pytest.raises(RateLimitExceededError) as err:
        service.issue_batch(ALICE_KEY, _requests(issuer, 1)[0])
    assert err.value.retry_after == pytest.approx(0.1)
    clock.now = T0 + 60.0
    assert service.remaining(ALICE_KEY) == 5
    assert len(service.issue_batch(ALICE_KEY, _requests(issuer, 4)[0])) == 4


def test_authentication(issuer):
    service = _service(issuer, Clock(T0))
    for bad in ("", "alice", ALICE_KEY + "x", ALICE_KEY.upper(), None):
        with pytest.raises(AuthenticationError) as err:
            service.issue_batch(bad, _requests(issuer, 1)[0])
        assert err.value.http_status == 401
        assert ALICE_KEY not in str(err.value)
    assert service.rate_limiter.snapshot() == {}


def test_batch_size_limits(issuer):
    service = _service(issuer, Clock(T0), max_batch=4)
    with pytest.raises(BatchSizeError):
        service.issue_batch(ALICE_KEY, [])
    with pytest.raises(BatchTooLargeError) as err:
        service.issue_batch(ALICE_KEY, _requests(issuer, 5)[0])
    assert err.value.http_status == 413
    assert service.remaining(ALICE_KEY) == 5


def test_a_bad_request_anywhere_in_a_batch_issues_nothing_and_costs_nothing(issuer):
    service = _service(issuer, Clock(T0))
    good = _requests(issuer, 2)[0]
    other = pp.Issuer.generate()
    while other.public_key.truncated_token_key_id == issuer.public_key.truncated_token_key_id:
        other = pp.Issuer.generate()
    foreign = _requests(other, 1)[0][0]
    n = issuer.public_key.public_key.public_numbers().n
    out_of_range = TokenRequest(2, issuer.public_key.truncated_token_key_id, n.to_bytes(256, "big"))
    cases = [
        (good + [good[0][:-1]], DecodeError),
        (good + [b"\x00\x01" + good[0][2:]], UnsupportedTokenTypeError),
        (good + [foreign], UnknownTokenKeyError),
        (good + [out_of_range.encode()], InvalidInputError),  # refused while signing: refunded
    ]
    for batch, error in cases:
        with pytest.raises(error):
            service.issue_batch(ALICE_KEY, batch)
        assert service.remaining(ALICE_KEY) == 5


def test_nothing_stored_links_tokens_to_users(issuer):
    service = _service(issuer, Clock(T0))
    raw_requests, states = _requests(issuer, 3)
    responses = service.issue_batch(ALICE_KEY, raw_requests)
    assert service.rate_limiter.snapshot() == {"alice": (int(T0 // 60), 3)}
    stored = _all_bytes(service)
    for value in raw_requests + responses:
        assert not any(value[3:35] in blob or value[:32] in blob for blob in stored)


def _all_bytes(root: object) -> list[bytes]:
    """Every bytes value reachable from root through slots, dicts, tuples and lists."""
    seen, out, stack = set(), [], [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (bytes, bytearray)):
            out.append(bytes(obj))
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        else:
            for name in getattr(type(obj), "__slots__", ()):
                if hasattr(obj, name):
                    stack.append(getattr(obj, name))
    return out


def test_api_key_store_validation_and_file_loading(tmp_path):
    with pytest.raises(ValueError):
        ApiKeyStore({})
    with pytest.raises(ValueError):
        ApiKeyStore({"alice": "short"})
    with pytest.raises(ValueError):
        ApiKeyStore({"alice": ALICE_KEY, "mallory": ALICE_KEY})
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(KEYS))
    store = ApiKeyStore.from_file(path)
    assert store.authenticate(BOB_KEY) == "bob"
    assert ALICE_KEY not in repr(store) and "users=2" in repr(store)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError):
        ApiKeyStore.from_file(path)
    path.write_text("{not json")
    with pytest.raises(ValueError):
        ApiKeyStore.from_file(path)


def test_rate_limit_config_validation():
    for args in [(0, 1.0), (1, 0.0), (1, 1.0, 0)]:
        with pytest.raises(ValueError):
            RateLimit(*args)
