"""The node's hardware evidence: collected once per OHTTP key set over a base document, and capped.

Collecting evidence is slow and the hardware's to give (a CPU report through configfs, an SPDM report
from every GPU), so a node collects it only when what its base document states changes (a key
rotation adds a key, a retirement drops one) or the base nears its expiry, and never more often than
once per `min_interval_s`, whoever asks:

    base(statement, min_valid_s, collect)
      the base states `statement` and stays valid min_valid_s more  -> it, nothing collected
      the last attempt is min_interval_s old or more                -> collect (a failure counts too)
      otherwise (the cap)  the base, while it has not expired, states the same node and its newest
                           OHTTP key is still live (the overlap window)  -> it, nothing collected
                           else EvidenceRateLimitedError (retry after the rest of the interval)

Every nonce is answered with a fresh document by the key the base's evidence vouches for
(identity.py, privacy/attestation/vouched.py). The cache is shared by the route (on a worker thread)
and registration (on another), so it holds a lock while it collects: concurrent askers at a rotation
wait for the one collection rather than start their own.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from traceless.errors import TracelessError
from traceless.privacy.attestation.software import NodeStatement
from traceless.privacy.ohttp.keys import decode_ohttp_keys


class EvidenceRateLimitedError(TracelessError):
    """The node's evidence is due for renewal but its collection cap has not passed (HTTP 503)."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"hardware evidence is collected at most once per interval; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class EvidenceLimits:
    ttl_s: int = 3600  # how long a base document (and so its evidence) is valid
    min_interval_s: float = 60.0  # at most one collection per this many seconds

    def __post_init__(self) -> None:
        if self.ttl_s < 2 or self.min_interval_s < 0:
            raise ValueError("the evidence ttl must be at least 2 s and the collection interval >= 0")


@dataclass(frozen=True, slots=True)
class Vouched:
    """A base document, what it states and the evidence (JSON items) collected for it."""

    statement: NodeStatement
    document: str = field(repr=False)
    evidence: tuple[dict[str, str], ...] = field(repr=False)
    exp: int  # the base document's expiry, seconds since the epoch


class EvidenceCache:
    def __init__(self, limits: EvidenceLimits = EvidenceLimits(), clock: Callable[[], float] = time.time) -> None:
        self.limits = limits
        self._clock = clock
        self._lock = threading.Lock()
        self._current: Vouched | None = None
        self._last_attempt = -math.inf
        self.collections = 0  # attempts so far (tests and audits read it)

    def base(
        self, statement: NodeStatement, min_valid_s: float, collect: Callable[[NodeStatement], Vouched]
    ) -> Vouched:
        """The base to answer with now (blocking while a collection runs; `collect` may raise
        CollectorError, which the attempt still counts against the cap)."""
        with self._lock:
            now = self._clock()
            current = self._current
            if current is not None and current.statement == statement and current.exp - now >= min_valid_s:
                return current
            wait = self._last_attempt + self.limits.min_interval_s - now
            if wait > 0:
                if current is not None and _still_usable(current, statement, now):
                    return current
                raise EvidenceRateLimitedError(math.ceil(wait))
            self._last_attempt = now
            self.collections += 1
            self._current = collect(statement)
            return self._current


def _still_usable(base: Vouched, statement: NodeStatement, now: float) -> bool:
    """Whether `base` may still answer: unexpired, the same node, and its newest key still live."""
    if base.exp - now < 1 or replace(base.statement, ohttp_keys=statement.ohttp_keys) != statement:
        return False
    newest = decode_ohttp_keys(base.statement.ohttp_keys)[0].encode()
    return newest in {config.encode() for config in decode_ohttp_keys(statement.ohttp_keys)}
