"""The token issuance service (library only, no HTTP): who may get tokens, and how many.

    issue_batch(api_key, [TokenRequest bytes, ...]) -> [TokenResponse bytes, ...]
      1. authenticate the API key                      -> AuthenticationError (401)
      2. check the batch size                          -> BatchSizeError (400), ...TooLarge (413)
      3. decode every request, check type and key id   -> DecodeError etc. (400)
      4. reserve quota for the whole batch             -> RateLimitExceededError (429)
      5. blind-sign every request (s^e == m checked);
         on any failure refund the quota, return nothing

Unlinkability: the issuer sees blinded messages only, never tokens (it takes no part in
redemption). It keeps per-user counters and the API-key digests, and nothing about
individual requests or responses; nothing here logs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from traceless.privacy.privacypass.errors import (
    AuthenticationError,
    BatchSizeError,
    BatchTooLargeError,
    UnknownTokenKeyError,
)
from traceless.privacy.privacypass.keys import IssuerPublicKey
from traceless.privacy.privacypass.protocol import Issuer
from traceless.privacy.privacypass.rate_limit import RateLimit, TokenRateLimiter
from traceless.privacy.privacypass.wire import TokenRequest

MIN_API_KEY_LEN = 16


class ApiKeyStore:
    """user_id -> API key, held only as SHA-256 digests.

    authenticate() compares the presented key's digest with every stored digest using
    hmac.compare_digest and does not stop at a match, so its timing does not depend on
    which entry (if any) matched. Cost is linear in the number of users.
    """

    __slots__ = ("_entries",)

    def __init__(self, keys: Mapping[str, str]) -> None:
        entries = []
        seen: set[bytes] = set()
        for user_id, api_key in keys.items():
            if not isinstance(user_id, str) or not user_id:
                raise ValueError("user ids must be non-empty strings")
            if not isinstance(api_key, str) or len(api_key) < MIN_API_KEY_LEN:
                raise ValueError(f"API keys must be strings of {MIN_API_KEY_LEN}+ characters")
            digest = _digest(api_key)
            if digest in seen:
                raise ValueError("two users share one API key")
            seen.add(digest)
            entries.append((user_id, digest))
        if not entries:
            raise ValueError("no API keys given")
        self._entries = tuple(entries)

    @classmethod
    def from_file(cls, path: str | Path) -> ApiKeyStore:
        """Load a JSON object {user_id: api_key} from path."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            raise ValueError("API key file is not valid JSON") from None
        if not isinstance(data, dict):
            raise ValueError("API key file must hold a JSON object {user_id: api_key}")
        return cls(data)

    def authenticate(self, api_key: str) -> str:
        """The user id owning api_key; raises AuthenticationError otherwise."""
        presented = _digest(api_key) if isinstance(api_key, str) else b""
        user = None
        for user_id, digest in self._entries:
            if hmac.compare_digest(digest, presented):
                user = user_id
        if user is None:
            raise AuthenticationError("invalid API key")
        return user

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"ApiKeyStore(users={len(self._entries)})"


def _digest(api_key: str) -> bytes:
    return hashlib.sha256(api_key.encode("utf-8")).digest()


class TokenIssuanceService:
    """Authenticated, rate-limited batch issuance of type-2 tokens.

    `clock` returns seconds (wall clock by default); tests inject their own.
    """

    __slots__ = ("_issuer", "_api_keys", "_limiter", "_clock")

    def __init__(
        self,
        issuer: Issuer,
        api_keys: ApiKeyStore,
        rate_limit: RateLimit,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._issuer = issuer
        self._api_keys = api_keys
        self._limiter = TokenRateLimiter(rate_limit)
        self._clock = clock

    @property
    def issuer_key(self) -> IssuerPublicKey:
        return self._issuer.public_key

    @property
    def rate_limiter(self) -> TokenRateLimiter:
        return self._limiter

    def authenticate(self, api_key: str) -> None:
        """Raise AuthenticationError unless api_key is a known key (checked again by issue_batch);
        lets a server refuse a request on its head, before reading its body."""
        self._api_keys.authenticate(api_key)

    def issue_batch(self, api_key: str, token_requests: Sequence[bytes]) -> list[bytes]:
        """Encoded TokenRequests in, encoded TokenResponses out (same order), all or none."""
        user_id = self._api_keys.authenticate(api_key)
        if not token_requests:
            raise BatchSizeError("empty batch")
        if len(token_requests) > self._limiter.limit.max_batch:
            raise BatchTooLargeError(f"batch over {self._limiter.limit.max_batch} requests")
        requests = [TokenRequest.decode(raw) for raw in token_requests]
        key_id = self._issuer.public_key.truncated_token_key_id
        if any(request.truncated_token_key_id != key_id for request in requests):
            raise UnknownTokenKeyError("truncated_token_key_id does not name this issuer's key")
        now = self._clock()
        self._limiter.reserve(user_id, len(requests), now)
        try:
            return [self._issuer.issue(request).encode() for request in requests]
        except BaseException:
            self._limiter.refund(user_id, len(requests), now)
            raise

    def remaining(self, api_key: str) -> int:
        """Tokens the key's user may still get in the current window."""
        return self._limiter.remaining(self._api_keys.authenticate(api_key), self._clock())
