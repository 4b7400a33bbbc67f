"""Time-windowed token challenges that every client can compute for itself.

RFC 9577 section 2.1.1.2 suggests binding a challenge to a time window by setting
redemption_context = F(current time window). Here F is public: SHA-256 over a label, the issuer
name, the origin info, the epoch length and the epoch number. So the challenge of an epoch is the
same for everyone and a client derives it itself; an untrusted gateway that hands one client a
challenge of its own (to tag it, and read the tag back when the tokens are spent) is caught by
a comparison, without the client ever showing the gateway its address (it fetches only through
the relay):

    time:        |---- epoch k-1 ----|----- epoch k -----|---- epoch k+1 ----|
    offered:      C(k-1)              C(k)                C(k+1)
    C(k) accepted:               [kE - early ................... (k+1)E + grace)

Each epoch's challenge C(k) is offered during epoch k and accepted from `early_seconds` before
the epoch starts (a client whose clock runs a little ahead) until `not_after = (k+1)E + grace`,
so a client can fetch a batch of tokens for C(k) and spend them through the epoch plus the grace
period. At any instant at most three challenges are accepted, and no token is acceptable longer
than early + E + grace: that bound is the spent-nonce set's max_ttl.

What a public context costs: a client can fetch tokens for a future epoch ahead of time (the
issuer's per-user quota still counts them when they are fetched), and a gateway restart loses its
spent-nonce set, so a token already spent in the current epoch is accepted once more after a
restart (docs/private-path.md, "What remains out of scope").
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from traceless.privacy.privacypass.wire import TOKEN_TYPE_BLIND_RSA, TokenChallenge

_CONTEXT_LABEL = b"traceless privacypass public redemption_context v2"


@dataclass(frozen=True, slots=True)
class AcceptedChallenge:
    """A challenge, its digest, and the instant (exclusive) after which it is refused."""

    challenge: TokenChallenge
    digest: bytes
    not_after: float


def epoch_context(issuer_name: str, origin_info: str, epoch_seconds: float, epoch: int) -> bytes:
    """The public redemption context of one epoch (32 bytes)."""
    h = hashlib.sha256(_CONTEXT_LABEL)
    for part in (issuer_name.encode(), origin_info.encode(), repr(float(epoch_seconds)).encode()):
        h.update(len(part).to_bytes(2, "big") + part)
    h.update(epoch.to_bytes(8, "big"))
    return h.digest()


@dataclass(frozen=True, slots=True)
class RedemptionSchedule:
    """Per-epoch TokenChallenges for one issuer and origin set (public: see the module docstring)."""

    issuer_name: str
    origin_info: str
    epoch_seconds: float
    grace_seconds: float
    early_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not self.epoch_seconds > 0:
            raise ValueError("epoch_seconds must be positive")
        if not 0 <= self.grace_seconds <= self.epoch_seconds:
            raise ValueError("grace_seconds must be in [0, epoch_seconds]")
        if not 0 <= self.early_seconds <= self.epoch_seconds:
            raise ValueError("early_seconds must be in [0, epoch_seconds]")
        TokenChallenge(TOKEN_TYPE_BLIND_RSA, self.issuer_name, b"", self.origin_info)  # validates

    @property
    def max_window_seconds(self) -> float:
        """The longest any token stays acceptable: early acceptance, one epoch and the grace period."""
        return self.early_seconds + self.epoch_seconds + self.grace_seconds

    def epoch_at(self, now: float) -> int:
        epoch = math.floor(now / self.epoch_seconds)
        if epoch < 0:
            raise ValueError("time before the Unix epoch")
        return epoch

    def challenge_for_epoch(self, epoch: int) -> AcceptedChallenge:
        context = epoch_context(self.issuer_name, self.origin_info, self.epoch_seconds, epoch)
        challenge = TokenChallenge(TOKEN_TYPE_BLIND_RSA, self.issuer_name, context, self.origin_info)
        not_after = (epoch + 1) * self.epoch_seconds + self.grace_seconds
        return AcceptedChallenge(challenge, challenge.digest(), not_after)

    def current(self, now: float) -> AcceptedChallenge:
        """The challenge to offer clients now."""
        return self.challenge_for_epoch(self.epoch_at(now))

    def plausible(self, now: float, skew_seconds: float) -> list[AcceptedChallenge]:
        """The challenges a gateway whose clock is within `skew_seconds` of `now` may offer: this
        epoch's, and a neighbour's near a boundary (what a client compares an offered one with)."""
        epochs = {self.epoch_at(max(0.0, now + d)) for d in (-skew_seconds, 0.0, skew_seconds)}
        return [self.challenge_for_epoch(e) for e in sorted(epochs)]

    def accepted(self, now: float) -> list[AcceptedChallenge]:
        """Challenges whose tokens are accepted at `now`: this epoch's, the previous epoch's while
        its grace period lasts, and the next epoch's within `early_seconds` of its start."""
        epoch = self.epoch_at(now)
        out = [self.challenge_for_epoch(epoch)]
        if epoch > 0:
            previous = self.challenge_for_epoch(epoch - 1)
            if now < previous.not_after:
                out.append(previous)
        if self.early_seconds > 0 and self.epoch_at(now + self.early_seconds) > epoch:
            upcoming = self.challenge_for_epoch(epoch + 1)
            out.append(AcceptedChallenge(upcoming.challenge, upcoming.digest, upcoming.not_after))
        return out
