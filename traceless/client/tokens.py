"""Privacy Pass tokens for the client: fetched in batches from the issuer, spent one per request.

The challenge comes from the gateway through the relay; the issuer's key comes from the issuer
the client has an account with (never from the gateway, which could hand a client a key of its
own to tag it). Tokens answer one challenge; when the gateway's challenge changes, the wallet
starts over.
"""
from __future__ import annotations

import asyncio
import time

import httpx

from traceless.privacy.privacypass import protocol as privacypass
from traceless.privacy.privacypass.errors import TokenError as WireTokenError
from traceless.privacy.privacypass.http import b64url_decode, choose_challenge, parse_www_authenticate
from traceless.privacy.privacypass.keys import IssuerPublicKey
from traceless.privacy.privacypass.token_batch import BATCH_REQUEST_MEDIA_TYPE, decode_batch, encode_batch
from traceless.privacy.privacypass.wire import Token, TokenChallenge, TokenResponse


class TokenError(Exception):
    """Tokens could not be obtained (issuer refused, rate limit, no usable challenge)."""


class TokenWallet:
    """Tokens for the current challenge. The challenge is fetched at most every CHALLENGE_TTL_S
    seconds (it changes once per gateway epoch), and the wallet refills in the background when it
    runs low, so a request rarely waits for the issuer."""

    CHALLENGE_TTL_S = 30.0
    LOW_WATER = 4

    def __init__(self, config, http: httpx.AsyncClient, clock=time.monotonic):
        self._config = config
        self._http = http
        self._clock = clock
        self._key: IssuerPublicKey | None = None
        self._tokens: list[Token] = []
        self._challenge: TokenChallenge | None = None
        self._challenge_at = -1e9
        self._refill: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self.issuer_calls = 0

    async def _issuer_key(self) -> IssuerPublicKey:
        if self._key is None:
            r = await self._http.get(self._config.issuer_url.rstrip("/") + "/token-issuer-directory")
            if r.status_code != 200:
                raise TokenError(f"issuer directory unavailable (HTTP {r.status_code})")
            keys = [k for k in r.json().get("token-keys", []) if k.get("token-type") == 2]
            if not keys:
                raise TokenError("the issuer offers no type-2 token key")
            self._key = IssuerPublicKey.from_spki(b64url_decode(keys[0]["token-key"], "token-key"))
        return self._key

    async def _current_challenge(self, key: IssuerPublicKey) -> TokenChallenge:
        if self._challenge is not None and self._clock() - self._challenge_at < self.CHALLENGE_TTL_S:
            return self._challenge
        r = await self._http.get(self._config.relay_url.rstrip("/") + "/pcc/v1/challenge")
        header = r.headers.get("www-authenticate")
        if header is None:
            raise TokenError("the gateway sent no PrivateToken challenge")
        selected = choose_challenge(parse_www_authenticate(header), self._config.origin_name, key)
        if selected is None:
            raise TokenError("no usable PrivateToken challenge for this issuer")
        if self._challenge is None or selected.challenge.encode() != self._challenge.encode():
            self._tokens.clear()  # a new epoch: tokens for the old challenge are no use
        self._challenge, self._challenge_at = selected.challenge, self._clock()
        return self._challenge

    async def take(self) -> Token:
        async with self._lock:
            key = await self._issuer_key()
            challenge = await self._current_challenge(key)
            if not self._tokens:
                if self._refill is None:
                    self._refill = asyncio.create_task(self._fetch_and_store(challenge, key))
                task, self._refill = self._refill, None
                await task  # a failed fetch raises here, to the request that needs the token
                if not self._tokens:
                    raise TokenError("the issuer gave no tokens for the current challenge")
            token = self._tokens.pop()
            if len(self._tokens) < self.LOW_WATER and self._refill is None:
                self._refill = asyncio.create_task(self._fetch_and_store(challenge, key))  # ahead of need
                self._refill.add_done_callback(self._background_done)
            return token

    async def _fetch_and_store(self, challenge, key: IssuerPublicKey) -> None:
        """One batch, stored by the task itself: exactly once, whether a take() awaits the task or
        it finishes in the background."""
        tokens, challenge = await self._fetch(challenge, key)
        if challenge is self._challenge:
            self._tokens.extend(tokens)

    def _background_done(self, task: asyncio.Task) -> None:
        if self._refill is task:
            self._refill = None
        if not task.cancelled():
            task.exception()  # retrieved: the next take() that finds the wallet empty fetches (and reports) itself

    async def _fetch(self, challenge, key: IssuerPublicKey):
        states, requests = [], []
        for _ in range(self._config.token_batch):
            req, state = privacypass.begin(challenge, key)
            requests.append(req.encode())
            states.append(state)
        self.issuer_calls += 1
        r = await self._http.post(
            self._config.issuer_url.rstrip("/") + "/token-request-batch", content=encode_batch(requests),
            headers={"content-type": BATCH_REQUEST_MEDIA_TYPE, "authorization": f"Bearer {self._config.api_key}"})
        if r.status_code != 200:
            raise TokenError(f"the issuer refused tokens (HTTP {r.status_code})")
        try:
            responses = decode_batch(r.content)
        except (WireTokenError, ValueError):
            raise TokenError("malformed batch response") from None
        if len(responses) != len(states):
            raise TokenError("the issuer answered a different number of tokens")
        return [privacypass.finalize(s, TokenResponse.decode(b)) for s, b in zip(states, responses)], challenge

    def invalidate(self) -> None:
        """The gateway refused a token (its challenge rotated): start over with a fresh challenge."""
        self._tokens.clear()
        self._challenge = None
