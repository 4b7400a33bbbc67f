"""Privacy Pass tokens for the client: fetched on the wallet's own schedule, spent one per request.

The issuer knows who fetches tokens and when; the gateway sees when tokens are spent and, if it
colludes with the issuer, would like to line the two up. Nothing here lets it:

- **Own schedule.** A background task wakes after random delays (uniform in
  `token_refill_delay_s`) and, when the wallet holds fewer than `token_low_water` tokens (the
  reserve) or the epoch's challenge changed, fetches exactly `token_batch` tokens. The task
  survives any error. A request only takes a token. An empty wallet makes it wait, but it is
  released on a clock of its own (random delays in `token_release_delay_s`, drawn when it starts
  waiting), never when a batch lands: a spend does not follow a refill in lock-step.
- **Nothing a request or an error causes.** A token the gateway refuses (401) fails that request:
  the wallet keeps its tokens and fetches nothing because of it (dropping them would make the
  next scheduled wake refill, and a request that waited for it would be resent the instant the
  batch lands, both lined up with the refusal).
- **One challenge for everyone, checked without the gateway seeing the client.** The challenge of
  an epoch is public (`redemption_schedule.epoch_context`): the wallet derives it and fetches the
  gateway's copy only through the relay, refusing any other (a gateway that tags a fetch with a
  challenge of its own, to read the tag back at redemption, is caught). It never fetches anything
  from the gateway directly: a direct fetch would show the gateway the client's address beside a
  relayed one.
- **One issuer key for everyone, in log order.** The key used is the newest live issuer key in
  the transparency log (`IssuerKeyEntry`, proven against a witnessed tree head), and the
  issuer's directory must offer exactly that one: an issuer that shows one user an older (or
  unlogged) key, to read the key id back at redemption, is refused. An issuer restart or rotation
  that logs a new key is followed at the next wake, without a restart.
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
from traceless.privacy.privacypass.errors import DecodeError, HeaderParseError
from traceless.privacy.privacypass.errors import TokenError as WireTokenError
from traceless.privacy.privacypass.http import b64url_decode, choose_challenge, parse_www_authenticate
from traceless.privacy.privacypass.keys import IssuerPublicKey
from traceless.privacy.privacypass.redemption_schedule import RedemptionSchedule
from traceless.privacy.privacypass.token_batch import BATCH_REQUEST_MEDIA_TYPE, decode_batch, encode_batch
from traceless.privacy.privacypass.wire import TOKEN_TYPE_BLIND_RSA, Token, TokenChallenge, TokenResponse
from traceless.privacy.translog.client import LogClientError
from traceless.privacy.translog.manifest import IssuerKeyEntry

# issuer name, refresh -> the logged key entries of that issuer, in log order
# (NodeVerifier.logged_issuer_keys)
LoggedKeys = Callable[[str, bool], list[IssuerKeyEntry]]


class TokenError(Exception):
    """Tokens could not be obtained (issuer refused, rate limit, no usable or no consistent challenge,
    issuer key not logged). `reason` is one word for the event log."""

    def __init__(self, message: str, reason: str = "issuer_error"):
        super().__init__(message)
        self.reason = reason


class TokenWallet:
    def __init__(
        self,
        config: Any,
        http: httpx.AsyncClient,
        logged_keys: LoggedKeys | None = None,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._http = http
        self._logged_keys = logged_keys
        self._rng = rng if rng is not None else secrets.SystemRandom()
        self._clock = clock
        self._tokens: list[Token] = []
        self._challenge: TokenChallenge | None = None
        self._task: asyncio.Task | None = None
        self._attempts = 0  # scheduled refill attempts so far (a waiting request reads the last one's error)
        self._last_error: TokenError | None = None
        self.issuer_calls = 0

    # --- the schedule -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the refill schedule (the proxy and PrivateClient do at startup). Started this way,
        the first wake comes at once; see take() for a schedule started by a request."""
        self._start(delayed=False)

    def _start(self, delayed: bool) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(delayed))

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._tokens.clear()

    async def _run(self, delayed: bool) -> None:
        low, high = self._config.token_refill_delay_s
        if delayed:
            await asyncio.sleep(self._rng.uniform(low, high))
        while True:
            try:
                await self.refill_once()
                self._last_error = None
            except TokenError as exc:
                self._last_error = exc
                emit("client.tokens_refused", reason=exc.reason)
            except httpx.HTTPError:
                self._last_error = TokenError("the issuer or the relay could not be reached", "unreachable")
                emit("client.tokens_refused", reason="unreachable")
            except Exception:  # noqa: BLE001 - whatever a hop answers, the schedule must go on
                self._last_error = TokenError("the issuer, relay or log answered something unusable")
                emit("client.tokens_refused", reason="issuer_error")
            self._attempts += 1
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
            # kept unless the epoch changed meanwhile: compared by its bytes, since every wake
            # fetches a new, equal object
            current = self._challenge
            if current is not None and current.encode() == challenge.encode():
                self._tokens.extend(tokens)
                emit("client.tokens_refilled", tokens=len(tokens))

    # --- requests -----------------------------------------------------------------------------
    async def take(self) -> Token:
        """A token for the current challenge. With the wallet empty, the request waits (at most
        token_wait_s) and looks again after random delays of its own (token_release_delay_s),
        drawn now: when it leaves does not depend on when a batch lands. A schedule nobody
        started is started here, its first wake after a random delay (never at once, for a
        request)."""
        self._start(delayed=True)
        if self._tokens:
            return self._tokens.pop()
        deadline = time.monotonic() + self._config.token_wait_s
        attempts = self._attempts
        low, high = self._config.token_release_delay_s
        while not self._tokens:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TokenError("no token: the wallet's scheduled refill has not come", "timeout")
            if self._task is not None and self._task.done():
                raise TokenError("the wallet's refill schedule has stopped")
            await asyncio.sleep(min(remaining, self._rng.uniform(low, high)))
            if not self._tokens and self._attempts > attempts and self._last_error is not None:
                raise self._last_error
        return self._tokens.pop()

    # --- issuer key and challenge -------------------------------------------------------------
    async def _issuer_key(self) -> IssuerPublicKey:
        """The newest live issuer key in the log, if the issuer's directory offers it."""
        r = await self._http.get(self._config.issuer_url.rstrip("/") + "/token-issuer-directory")
        if r.status_code != 200:
            raise TokenError(f"issuer directory unavailable (HTTP {r.status_code})")
        try:
            offered = [
                b64url_decode(k["token-key"], "token-key")
                for k in r.json().get("token-keys", [])
                if isinstance(k, dict) and k.get("token-type") == TOKEN_TYPE_BLIND_RSA
            ]
        except (ValueError, TypeError, KeyError, AttributeError, DecodeError):
            raise TokenError("the issuer directory is malformed") from None
        if not offered:
            raise TokenError("the issuer offers no type-2 token key")
        name = self._issuer_name()
        newest = None
        for refresh in (False, True):  # a key not logged yet may be in a newer tree head
            newest = await asyncio.to_thread(self._newest_logged, name, refresh)
            if newest is not None and newest in offered:
                try:
                    return IssuerPublicKey.from_spki(newest)
                except DecodeError:
                    raise TokenError("the logged issuer key is malformed") from None
        if newest is not None and set(offered) & await asyncio.to_thread(self._live_logged, name):
            raise TokenError("the issuer offers an older logged key, not the newest: refused", "issuer_key_not_newest")
        raise TokenError("the issuer does not offer the newest key in the transparency log", "issuer_key_not_logged")

    def _newest_logged(self, issuer: str, refresh: bool) -> bytes | None:
        """The last live key entry of `issuer` in log order (everyone's view of the log agrees on it)."""
        live = [e.token_key for e in self._entries(issuer, refresh) if e.valid_at(self._clock())]
        return live[-1] if live else None

    def _live_logged(self, issuer: str) -> set[bytes]:
        return {e.token_key for e in self._entries(issuer, False) if e.valid_at(self._clock())}

    def _entries(self, issuer: str, refresh: bool) -> list[IssuerKeyEntry]:
        if self._logged_keys is None:
            raise TokenError("no transparency log to check the issuer's key against", "issuer_key_not_logged")
        try:
            return self._logged_keys(issuer, refresh)
        except LogClientError:  # the log could not be read or verified: no key is proven
            raise TokenError("the transparency log could not be read or verified", "issuer_key_not_logged") from None

    def _issuer_name(self) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(self._config.issuer_url)
        return f"{parts.hostname}" if parts.port is None else f"{parts.hostname}:{parts.port}"

    def expected_challenges(self) -> list[TokenChallenge]:
        """The epoch's public challenge by this client's clock (and its neighbour near a boundary,
        within the clock leeway): the only ones a gateway may offer."""
        schedule = RedemptionSchedule(self._issuer_name(), "", self._config.challenge_epoch_s, 0.0)
        return [a.challenge for a in schedule.plausible(self._clock(), self._config.clock_leeway_s)]

    async def _checked_challenge(self, key: IssuerPublicKey) -> TokenChallenge:
        """The gateway's challenge, fetched through the relay only, if it is the epoch's public one."""
        offered = await self._challenge_from(self._config.relay_url, key)
        if offered.encode() not in {c.encode() for c in self.expected_challenges()}:
            raise TokenError("the gateway's challenge is not this epoch's public one: refused", "challenge_mismatch")
        return offered

    async def _challenge_from(self, base_url: str, key: IssuerPublicKey) -> TokenChallenge:
        r = await self._http.get(base_url.rstrip("/") + "/pcc/v1/challenge")
        header = r.headers.get("www-authenticate")
        if header is None:
            raise TokenError("the gateway sent no PrivateToken challenge")
        try:
            selected = choose_challenge(parse_www_authenticate(header), self._config.origin_name, key)
        except HeaderParseError:
            raise TokenError("the gateway's PrivateToken challenge is malformed") from None
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
            self._config.issuer_url.rstrip("/") + "/token-request-batch",
            content=encode_batch(requests),
            headers={"content-type": BATCH_REQUEST_MEDIA_TYPE, "authorization": f"Bearer {self._config.api_key}"},
        )
        if r.status_code == 429:
            raise TokenError("the issuer's token quota for this API key is used up for now", "quota_exhausted")
        if r.status_code == 401:
            raise TokenError("the issuer does not know this API key", "api_key_refused")
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
