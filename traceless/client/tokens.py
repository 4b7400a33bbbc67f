"""Privacy Pass tokens for the client: fetched in batches from the issuer, spent one per request.

The challenge comes from the gateway through the relay; the issuer's key comes from the issuer
the client has an account with (never from the gateway, which could hand a client a key of its
own to tag it). Tokens answer one challenge; when the gateway's challenge changes, the wallet
starts over.
"""
from __future__ import annotations

import asyncio

import httpx

from traceless.privacy import privacypass
from traceless.privacy.privacypass_http import choose_challenge, parse_www_authenticate
from traceless.privacy.privacypass_keys import IssuerPublicKey
from traceless.privacy.privacypass_wire import Token, TokenResponse
from traceless.privacy.token_batch import BATCH_REQUEST_MEDIA_TYPE, decode_batch, encode_batch
from traceless.privacy.token_errors import TokenError as WireTokenError

class TokenError(Exception):
    """Tokens could not be obtained (issuer refused, rate limit, no usable challenge)."""


class TokenWallet:
    def __init__(self, config, http: httpx.AsyncClient):
        self._config = config
        self._http = http
        self._key: IssuerPublicKey | None = None
        self._tokens: list[Token] = []
        self._challenge: bytes | None = None
        self._lock = asyncio.Lock()

    async def _issuer_key(self) -> IssuerPublicKey:
        if self._key is None:
            r = await self._http.get(self._config.issuer_url.rstrip("/") + "/token-issuer-directory")
            if r.status_code != 200:
                raise TokenError(f"issuer directory unavailable (HTTP {r.status_code})")
            from traceless.privacy.privacypass_http import b64url_decode

            keys = [k for k in r.json().get("token-keys", []) if k.get("token-type") == 2]
            if not keys:
                raise TokenError("the issuer offers no type-2 token key")
            self._key = IssuerPublicKey.from_spki(b64url_decode(keys[0]["token-key"], "token-key"))
        return self._key

    async def _current_challenge(self, key: IssuerPublicKey):
        r = await self._http.get(self._config.relay_url.rstrip("/") + "/pcc/v1/challenge")
        header = r.headers.get("www-authenticate")
        if header is None:
            raise TokenError("the gateway sent no PrivateToken challenge")
        selected = choose_challenge(parse_www_authenticate(header), self._config.origin_name, key)
        if selected is None:
            raise TokenError("no usable PrivateToken challenge for this issuer")
        return selected.challenge

    async def take(self) -> Token:
        async with self._lock:
            key = await self._issuer_key()
            challenge = await self._current_challenge(key)
            encoded = challenge.encode()
            if encoded != self._challenge:  # a new epoch: tokens for the old one are no use
                self._tokens.clear()
                self._challenge = encoded
            if not self._tokens:
                self._tokens = await self._fetch(challenge, key)
            return self._tokens.pop()

    async def _fetch(self, challenge, key: IssuerPublicKey) -> list[Token]:
        states, requests = [], []
        for _ in range(self._config.token_batch):
            req, state = privacypass.begin(challenge, key)
            requests.append(req.encode())
            states.append(state)
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
        return [privacypass.finalize(s, TokenResponse.decode(b)) for s, b in zip(states, responses)]

    def invalidate(self) -> None:
        self._tokens.clear()
        self._challenge = None
