"""Privacy Pass tokens for the client: fetched on the wallet's own schedule, spent one per request.

The issuer knows who fetches tokens and when; the gateway sees when tokens are spent. Nothing here
lets the two line those up (issue 12, finding 4):

- **Own schedule.** A background task wakes after random delays (uniform in
  `token_refill_delay_s`) and, when the wallet holds fewer than `token_low_water` tokens or the
  challenge changed, fetches exactly `token_batch` tokens. A request only takes a token; an empty
  wallet makes it wait for the next scheduled fill, never hastens it. So a fetch's time and size
  say nothing about any one request.
- **One challenge for everyone.** Each wake fetches the gateway's challenge twice: through the
  relay (as requests go) and directly from the gateway (`gateway_url`). They must be identical: a
  gateway that hands out a unique challenge per fetch (to tag a wallet and link its redemptions)
  would have to guess which fetch is which, and a mismatch stops the wallet (no tokens fetched).
- **Logged issuer keys.** The issuer's key comes from its own directory (never from the gateway),
  and is used only if it is in the transparency log (`IssuerKeyEntry`, valid now; proven against a
  witnessed tree head). More live logged keys for the issuer than a rotation needs
  (MAX_LIVE_ISSUER_KEYS) means keys per user: refused. A new issuer key (rotation, restart) is
  picked up at the next wake once it is logged, without a restart.
"""
from __future__ import annotations

import asyncio
import random
import secrets
import time
from collections.abc import Callable
from typing import Any

import httpx

from traceless.events import emit
from traceless.privacy.privacypass import protocol as privacypass
from traceless.privacy.privacypass.errors import DecodeError
from traceless.privacy.privacypass.errors import TokenError as WireTokenError
from traceless.privacy.privacypass.http import b64url_decode, choose_challenge, parse_www_authenticate
from traceless.privacy.privacypass.keys import IssuerPublicKey
from traceless.privacy.privacypass.token_batch import BATCH_REQUEST_MEDIA_TYPE, decode_batch, encode_batch
from traceless.privacy.privacypass.wire import TOKEN_TYPE_BLIND_RSA, Token, TokenChallenge, TokenResponse
from traceless.privacy.translog.client import LogClientError
from traceless.privacy.translog.manifest import IssuerKeyEntry

MAX_LIVE_ISSUER_KEYS = 2  # the current key and the one it replaces, during a rotation's overlap

# issuer name, refresh -> the logged key entries of that issuer (NodeVerifier.logged_issuer_keys)
LoggedKeys = Callable[[str, bool], list[IssuerKeyEntry]]


class TokenError(Exception):
    """Tokens could not be obtained (issuer refused, rate limit, no usable or no consistent challenge,
    issuer key not logged). `reason` is one word for the event log."""

    def __init__(self, message: str, reason: str = "issuer_error"):
        super().__init__(message)
        self.reason = reason


class TokenWallet:
    def __init__(self, config: Any, http: httpx.AsyncClient, logged_keys: LoggedKeys | None = None, *,
                 rng: random.Random | None = None, clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._http = http
        self._logged_keys = logged_keys
        self._rng = rng if rng is not None else secrets.SystemRandom()
        self._clock = clock
        self._tokens: list[Token] = []
        self._challenge: TokenChallenge | None = None
        self._task: asyncio.Task | None = None
        self._attempt = asyncio.Event()  # set (and replaced) after every scheduled refill attempt
        self._last_error: TokenError | None = None
        self.issuer_calls = 0

    # --- the schedule -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the refill schedule (the proxy does at startup; else the first take() does)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._tokens.clear()

    async def _run(self) -> None:
        low, high = self._config.token_refill_delay_s
        while True:
            try:
                await self.refill_once()
                self._last_error = None
            except TokenError as exc:
                self._last_error = exc
                emit("client.tokens_refused", reason=exc.reason)
            except httpx.HTTPError:
                self._last_error = TokenError("the issuer or the gateway could not be reached", "unreachable")
                emit("client.tokens_refused", reason="unreachable")
            done, self._attempt = self._attempt, asyncio.Event()
            done.set()
            await asyncio.sleep(self._rng.uniform(low, high))

    async def refill_once(self) -> None:
        """One scheduled wake: check key and challenge; fetch one fixed-size batch if needed."""
        key = await self._issuer_key()
        challenge = await self._checked_challenge(key)
        if self._challenge is None or challenge.encode() != self._challenge.encode():
            self._tokens.clear()  # a new epoch: tokens for the old challenge are no use
            self._challenge = challenge
        if len(self._tokens) < self._config.token_low_water:
            tokens = await self._fetch(challenge, key)
            # kept unless the challenge changed meanwhile (invalidate(), a new epoch): compared by its
            # bytes, since every wake fetches a new, equal object
            current = self._challenge
            if current is not None and current.encode() == challenge.encode():
                self._tokens.extend(tokens)
                emit("client.tokens_refilled", tokens=len(tokens))

    # --- requests -----------------------------------------------------------------------------
    async def take(self) -> Token:
        """A token for the current challenge; waits (at most token_wait_s) for a scheduled fill."""
        self.start()
        deadline = time.monotonic() + self._config.token_wait_s
        while not self._tokens:
            remaining = deadline - time.monotonic()
            if self._task is None or self._task.done():  # the schedule died: it would never refill
                raise TokenError("the wallet's refill schedule has stopped")
            if remaining <= 0:
                raise TokenError("no token: the wallet's scheduled refill has not come", "timeout")
            attempt = self._attempt
            try:
                await asyncio.wait_for(attempt.wait(), remaining)
            except TimeoutError:
                continue
            if not self._tokens and self._last_error is not None:
                raise self._last_error
        return self._tokens.pop()

    def invalidate(self) -> None:
        """The gateway refused a token (its challenge rotated): drop the tokens; the next scheduled
        wake fetches the new challenge and refills."""
        self._tokens.clear()
        self._challenge = None

    # --- issuer key and challenge -------------------------------------------------------------
    async def _issuer_key(self) -> IssuerPublicKey:
        r = await self._http.get(self._config.issuer_url.rstrip("/") + "/token-issuer-directory")
        if r.status_code != 200:
            raise TokenError(f"issuer directory unavailable (HTTP {r.status_code})")
        try:
            offered = [b64url_decode(k["token-key"], "token-key") for k in r.json().get("token-keys", [])
                       if isinstance(k, dict) and k.get("token-type") == TOKEN_TYPE_BLIND_RSA]
        except (ValueError, TypeError, KeyError, AttributeError, DecodeError):
            raise TokenError("the issuer directory is malformed") from None
        if not offered:
            raise TokenError("the issuer offers no type-2 token key")
        name = self._issuer_name()
        for refresh in (False, True):  # a key not logged yet may be in a newer tree head
            logged = await asyncio.to_thread(self._live_logged, name, refresh)
            usable = [spki for spki in offered if spki in logged]
            if usable:
                try:
                    return IssuerPublicKey.from_spki(usable[0])
                except DecodeError:
                    raise TokenError("the logged issuer key is malformed") from None
        raise TokenError("the issuer's key is not in the transparency log", "issuer_key_not_logged")

    def _live_logged(self, issuer: str, refresh: bool) -> set[bytes]:
        if self._logged_keys is None:
            raise TokenError("no transparency log to check the issuer's key against", "issuer_key_not_logged")
        try:
            entries = self._logged_keys(issuer, refresh)
        except LogClientError:  # the log could not be read or verified: no key is proven
            raise TokenError("the transparency log could not be read or verified", "issuer_key_not_logged") \
                from None
        live = {e.token_key for e in entries if e.valid_at(self._clock())}
        if len(live) > MAX_LIVE_ISSUER_KEYS:
            raise TokenError("the log holds more live keys for this issuer than a rotation needs",
                             "too_many_issuer_keys")
        return live

    def _issuer_name(self) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(self._config.issuer_url)
        return f"{parts.hostname}" if parts.port is None else f"{parts.hostname}:{parts.port}"

    async def _checked_challenge(self, key: IssuerPublicKey) -> TokenChallenge:
        if not self._config.gateway_url:
            raise TokenError("no direct gateway URL to check the challenge against", "challenge_mismatch")
        relayed, direct = await asyncio.gather(self._challenge_from(self._config.relay_url, key),
                                               self._challenge_from(self._config.gateway_url, key))
        if relayed.encode() != direct.encode():
            raise TokenError("the challenge through the relay differs from the gateway's own: refused",
                             "challenge_mismatch")
        return relayed

    async def _challenge_from(self, base_url: str, key: IssuerPublicKey) -> TokenChallenge:
        r = await self._http.get(base_url.rstrip("/") + "/pcc/v1/challenge")
        header = r.headers.get("www-authenticate")
        if header is None:
            raise TokenError("the gateway sent no PrivateToken challenge")
        selected = choose_challenge(parse_www_authenticate(header), self._config.origin_name, key)
        if selected is None:
            raise TokenError("no usable PrivateToken challenge for this issuer")
        return selected.challenge

    async def _fetch(self, challenge: TokenChallenge, key: IssuerPublicKey) -> list[Token]:
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
        try:
            return [privacypass.finalize(s, TokenResponse.decode(b)) for s, b in zip(states, responses)]
        except (WireTokenError, ValueError):
            raise TokenError("the issuer's token responses do not verify") from None
