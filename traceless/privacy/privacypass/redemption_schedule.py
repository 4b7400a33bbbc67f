"""Time-windowed token challenges: what makes spent-nonce expiry safe.

RFC 9577 section 2.1.1.2 suggests binding a challenge to a time window by setting
redemption_context = F(current time window) for a PRF F. Here F is HMAC-SHA-256 under a
context key drawn when the schedule is made:

    time:        |---- epoch k-1 ----|----- epoch k -----|---- epoch k+1 ----|
    offered:      C(k-1)              C(k)                C(k+1)
    C(k) accepted:                    [kE .......................... (k+1)E + grace)

Each epoch's challenge C(k) is offered (in WWW-Authenticate) during epoch k and accepted
until `not_after = (k+1)E + grace`, so a client can fetch a batch of tokens for C(k) and
spend them through the epoch plus the grace period. At any instant at most two challenges
are accepted, and no token is acceptable longer than E + grace after the earliest moment
it could be redeemed. That bound is the spent-nonce set's max_ttl.

The context key is per process by default: after a restart, the old challenges (and every
token bound to them) are no longer accepted, so the new process's empty spent-nonce set
cannot be replayed against. Several verifiers that share one key must share one spent set.

Privacy: every client sees the same challenge during an epoch, so the context splits
clients by time only. An untrusted gateway could still hand a chosen client a unique
challenge to tag it; clients defend against that by fetching challenges through the
anonymizing relay and keeping the ones they were given (see RFC 9576 section 6).
"""
from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from dataclasses import dataclass, field

from traceless.privacy.privacypass.wire import TOKEN_TYPE_BLIND_RSA, TokenChallenge

_CONTEXT_LABEL = b"traceless privacypass redemption_context v1"


@dataclass(frozen=True, slots=True)
class AcceptedChallenge:
    """A challenge, its digest, and the instant (exclusive) after which it is refused."""

    challenge: TokenChallenge
    digest: bytes
    not_after: float


@dataclass(frozen=True, slots=True)
class RedemptionSchedule:
    """Per-epoch TokenChallenges for one issuer and origin set.

    context_key is secret (a client who knew it could precompute future challenges and
    stockpile tokens for them); leave it out to draw a fresh one.
    """

    issuer_name: str
    origin_info: str
    epoch_seconds: float
    grace_seconds: float
    context_key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    def __post_init__(self) -> None:
        if not self.epoch_seconds > 0:
            raise ValueError("epoch_seconds must be positive")
        if not 0 <= self.grace_seconds <= self.epoch_seconds:
            raise ValueError("grace_seconds must be in [0, epoch_seconds]")
        if len(self.context_key) < 16:
            raise ValueError("context_key must be at least 16 bytes")
        TokenChallenge(TOKEN_TYPE_BLIND_RSA, self.issuer_name, b"", self.origin_info)  # validates

    @property
    def max_window_seconds(self) -> float:
        """The longest any token stays acceptable: one epoch plus the grace period."""
        return self.epoch_seconds + self.grace_seconds

    def epoch_at(self, now: float) -> int:
        epoch = math.floor(now / self.epoch_seconds)
        if epoch < 0:
            raise ValueError("time before the Unix epoch")
        return epoch

    def challenge_for_epoch(self, epoch: int) -> AcceptedChallenge:
        mac = hmac.new(self.context_key, _CONTEXT_LABEL + epoch.to_bytes(8, "big"), hashlib.sha256)
        challenge = TokenChallenge(
            TOKEN_TYPE_BLIND_RSA, self.issuer_name, mac.digest(), self.origin_info
        )
        not_after = (epoch + 1) * self.epoch_seconds + self.grace_seconds
        return AcceptedChallenge(challenge, challenge.digest(), not_after)

    def current(self, now: float) -> AcceptedChallenge:
        """The challenge to offer clients now."""
        return self.challenge_for_epoch(self.epoch_at(now))

    def accepted(self, now: float) -> list[AcceptedChallenge]:
        """Challenges whose tokens are accepted at `now`: this epoch's, and the previous
        epoch's while its grace period lasts."""
        epoch = self.epoch_at(now)
        out = [self.challenge_for_epoch(epoch)]
        if epoch > 0:
            previous = self.challenge_for_epoch(epoch - 1)
            if now < previous.not_after:
                out.append(previous)
        return out
