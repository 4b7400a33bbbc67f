"""Token redemption at an origin, here the untrusted gateway (RFC 9577 section 2.2).

The verifier needs no secret to check tokens: issuer keys are public (token type 2 is
publicly verifiable). It learns that *some* client holding a valid token made a request,
not which user the issuer gave the token to.

Checks, in order, on every token; state changes only after all of them pass (`check` runs
1-4 and refuses an already spent nonce without recording anything, so a server can refuse a
bad token before it reads a request body; `spend` then records it):
  1. the token parses and has token type 2             -> MalformedTokenError / TokenTypeError
  2. token_key_id names an accepted issuer key           -> TokenKeyError
  3. challenge_digest is an accepted, unexpired challenge -> ChallengeMismatchError
  4. the authenticator verifies (RSASSA-PSS, SHA-384)    -> TokenSignatureError
  5. the nonce is recorded as spent until the challenge
     expires (redemption_schedule.py, spent_nonces.py)   -> DoubleSpendError / SpentSetFullError
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from traceless.privacy.privacypass.errors import (
    ChallengeMismatchError,
    DecodeError,
    DoubleSpendError,
    MalformedTokenError,
    TokenKeyError,
    TokenTypeError,
    UnsupportedTokenTypeError,
)
from traceless.privacy.privacypass.http import PrivateTokenChallenge, format_www_authenticate, parse_authorization
from traceless.privacy.privacypass.keys import IssuerPublicKey
from traceless.privacy.privacypass.protocol import verify_token
from traceless.privacy.privacypass.redemption_schedule import AcceptedChallenge, RedemptionSchedule
from traceless.privacy.privacypass.spent_nonces import SpentNonceSet
from traceless.privacy.privacypass.wire import Token

DEFAULT_MAX_SPENT_ENTRIES = 1_000_000
# floor(now / E) * E can land an ulp away from now; the slack keeps every window inside
# the spent set's max_ttl despite float rounding.
_TTL_SLACK_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class CheckedToken:
    """A token that passed checks 1-4 and was unspent when checked; `Verifier.spend` records it."""

    nonce: bytes
    not_after: float


class Verifier:
    """Redeems PrivateToken tokens for one RedemptionSchedule and a set of issuer keys.

    The first issuer key is the preferred one (it is offered first in challenges); others
    stay accepted, e.g. during key rotation.
    """

    __slots__ = ("_keys", "_preferred", "_schedule", "_spent", "_clock")

    def __init__(
        self,
        issuer_keys: Sequence[IssuerPublicKey],
        schedule: RedemptionSchedule,
        *,
        max_spent_entries: int = DEFAULT_MAX_SPENT_ENTRIES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not issuer_keys:
            raise ValueError("at least one issuer key is needed")
        self._keys = {key.token_key_id: key for key in issuer_keys}
        self._preferred = tuple(issuer_keys)
        self._schedule = schedule
        self._spent = SpentNonceSet(
            max_entries=max_spent_entries,
            max_ttl=schedule.max_window_seconds + _TTL_SLACK_SECONDS,
        )
        self._clock = clock

    @property
    def spent(self) -> SpentNonceSet:
        return self._spent

    def update_issuer_keys(self, issuer_keys: Sequence[IssuerPublicKey]) -> bool:
        """Take the issuer's current keys (a rotation or an issuer restart), without a restart.

        The new keys become the offered ones; the keys offered until now stay accepted until the
        keys change again, so tokens already issued under them can still be spent.
        True if the offered keys changed.
        """
        if not issuer_keys:
            raise ValueError("at least one issuer key is needed")
        new = tuple(issuer_keys)
        if new == self._preferred:
            return False
        self._keys = {key.token_key_id: key for key in (*new, *self._preferred)}
        self._preferred = new
        return True

    def current_challenge(self) -> AcceptedChallenge:
        return self._schedule.current(self._clock())

    def www_authenticate(self) -> str:
        """The WWW-Authenticate value for a 401: the current challenge once per issuer key."""
        now = self._clock()
        current = self._schedule.current(now)
        max_age = max(0, int(current.not_after - now))
        encoded = current.challenge.encode()
        return format_www_authenticate([PrivateTokenChallenge(encoded, key.spki, max_age) for key in self._preferred])

    def check_authorization(self, header_value: str) -> CheckedToken:
        """Parse `Authorization: PrivateToken token=...` and check the token; records nothing."""
        try:
            token = parse_authorization(header_value)
        except UnsupportedTokenTypeError as exc:
            raise TokenTypeError(f"token type not accepted: {exc}") from exc
        except DecodeError as exc:
            raise MalformedTokenError(f"malformed PrivateToken credential: {exc}") from exc
        return self.check(token)

    def check(self, token: Token) -> CheckedToken:
        """Checks 1-4, and that the nonce is not spent yet; raises a TokenRejectedError
        subclass (401) or DoubleSpendError (403). Records nothing."""
        now = self._clock()
        key = self._keys.get(token.token_key_id)
        if key is None:
            raise TokenKeyError("token_key_id names no accepted issuer key")
        match = self._match_challenge(token.challenge_digest, now)
        verify_token(token, key)
        if token.nonce in self._spent:
            raise DoubleSpendError("token nonce already redeemed")
        return CheckedToken(token.nonce, match.not_after)

    def spend(self, checked: CheckedToken) -> None:
        """Record a checked token as spent: DoubleSpendError when another request spent it since
        the check, ChallengeMismatchError (401) when its challenge expired since the check,
        SpentSetFullError (503) when the set is full."""
        now = self._clock()
        if checked.not_after <= now:
            raise ChallengeMismatchError("the token's challenge expired")
        self._spent.add(checked.nonce, checked.not_after, now)

    def redeem_authorization(self, header_value: str) -> None:
        """Parse `Authorization: PrivateToken token=...` and redeem the token."""
        self.spend(self.check_authorization(header_value))

    def redeem(self, token: Token) -> None:
        """Accept the token once; raises a TokenRejectedError subclass (401) or
        SpentSetFullError (503). Nothing is recorded unless every check passed."""
        self.spend(self.check(token))

    def _match_challenge(self, challenge_digest: bytes, now: float) -> AcceptedChallenge:
        for accepted in self._schedule.accepted(now):
            if hmac.compare_digest(accepted.digest, challenge_digest):
                return accepted
        raise ChallengeMismatchError("challenge_digest matches no accepted challenge")
