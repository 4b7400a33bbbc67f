"""The forced-refill attack of `traceless audit targeting` (targeting_collusion.py): the gateway refuses
a request's token (401) and the issuer watches who refills next; a client that drops its tokens,
waits for the next batch and resends the instant it lands hands the pair a refill and a spend a few
milliseconds apart, and the refill names the user.

USERS clients run the real AsyncPrivateClient request logic and the real TokenWallet schedule (at
audit speed: refills every 20..60 ms, a waiting request released after 50..200 ms), with the issuer
and the gateway stood in for: the issuer logs (time, user) of every batch, the gateway answers with
a real OHTTP reply from the one node and logs the time of every spend, and under attack refuses the
trial's first request with a 401. The attacker then takes the first refill after the refusal and,
if a spend follows it within PAIR_S, names that refill's user; otherwise it guesses.

WEAKENED: the client before this change: after a 401 it drops its tokens and resends, and a
request waiting on an empty wallet leaves the instant a batch lands.
"""

from __future__ import annotations

import asyncio
import random
import time
from types import SimpleNamespace

import httpx

from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.ohttp.gateway import OhttpServer
from traceless.privacy.privacypass.wire import Token
from traceless_tools.client.errors import FailureCause, PrivateClientError
from traceless_tools.client.node_verifier import VerifiedNode
from traceless_tools.client.private_client import AsyncPrivateClient, ClientConfig
from traceless_tools.client.tokens import TokenWallet

PAIR_S = 0.05
_FAST = dict(
    token_batch=4,
    token_low_water=2,
    token_refill_delay_s=(0.02, 0.06),
    token_wait_s=2.0,
    token_release_delay_s=(0.05, 0.2),
)


class _Hops:
    """The colluding issuer and gateway: what each logs, and the gateway's one refusal."""

    def __init__(self) -> None:
        self.refills: list[tuple[float, int]] = []
        self.spends: list[float] = []
        self.refuse_next = False
        self.server = OhttpServer(key_id=1)

    def gateway(self, request: httpx.Request) -> httpx.Response:
        self.spends.append(time.monotonic())
        if self.refuse_next:
            self.refuse_next = False
            return httpx.Response(401, json={"error": {"message": "token refused"}})
        _, context = self.server.decapsulate_request(request.content)
        reply = bhttp.encode_response(bhttp.Response(200, content=b'{"object": "chat.completion"}'))
        return httpx.Response(200, content=context.encapsulate(reply), headers={"content-type": "message/ohttp-res"})

    def name(self, refused_at: float, rng: random.Random) -> int | None:
        """The attacker's pairing: the first refill after the refusal, if a spend follows it closely."""
        refill = next(((t, u) for t, u in self.refills if t > refused_at), None)
        if refill is None:
            return None
        spend = next((t for t in self.spends if t > refill[0]), None)
        return refill[1] if spend is not None and spend - refill[0] < PAIR_S else None


class _IssuerWallet(TokenWallet):
    """The real schedule; the issuer (key, challenge, batch) stood in, logging who refilled when."""

    def __init__(self, config, hops: _Hops, user: int) -> None:
        super().__init__(config, http=None)  # type: ignore[arg-type]
        self._hops, self._user = hops, user

    async def _issuer_key(self):
        return None

    async def _checked_challenge(self, key):
        return SimpleNamespace(encode=lambda: b"epoch")

    async def _fetch(self, challenge, key):
        await asyncio.sleep(0.002)
        self._hops.refills.append((time.monotonic(), self._user))
        return [Token(2, bytes(32), bytes(32), bytes(32), bytes(256)) for _ in range(self._config.token_batch)]


class _LockStepWallet(_IssuerWallet):
    """WEAKENED: a waiting request leaves the instant a batch lands."""

    async def take(self) -> Token:
        self._start(delayed=True)
        while not self._tokens:
            await asyncio.sleep(0.001)
        return self._tokens.pop()


def _client(hops: _Hops, user: int, weakened: bool) -> AsyncPrivateClient:
    config = ClientConfig(
        "http://issuer.audit",
        "k",
        "http://relay.audit",
        "http://log.audit",
        bytes(32),
        (),
        "m",
        **_FAST,  # type: ignore[arg-type]
    )
    client = AsyncPrivateClient(config, http=httpx.AsyncClient(transport=httpx.MockTransport(hops.gateway)))
    node = VerifiedNode("node", 1, hops.server.key_config, bytes(32), "kid", 0.0)
    client._verified_candidates = lambda: asyncio.sleep(0, [node])  # type: ignore[method-assign]
    client.wallet = (_LockStepWallet if weakened else _IssuerWallet)(config, hops, user)
    return client


async def _send(client: AsyncPrivateClient, weakened: bool) -> None:
    body = {"model": "m", "prompt": "p", "max_tokens": 1}
    try:
        await client.request("/v1/completions", body)
    except PrivateClientError as exc:
        if weakened and exc.cause is FailureCause.TOKEN_REFUSED:  # drop the tokens, resend when a batch lands
            client.wallet._tokens.clear()
            try:
                await client.request("/v1/completions", body)
            except PrivateClientError:
                pass


async def _trial(rng: random.Random, weakened: bool, attack: bool) -> bool:
    from traceless_tools.audit.targeting_collusion import USERS, _guess

    hops = _Hops()
    clients = [_client(hops, u, weakened) for u in range(USERS)]
    for c in clients:
        c.start()
    try:
        await asyncio.sleep(0.1)  # every wallet has its first batch
        user = rng.randrange(USERS)
        hops.refuse_next = attack
        refused_at = time.monotonic()
        await _send(clients[user], weakened)
        await asyncio.sleep(0.1)
    finally:
        for c in clients:
            await c.aclose()
    named = hops.name(refused_at, rng)
    return named == user if named is not None else _guess(rng, user)


def forced_refill(trials: int, rng: random.Random):
    from traceless_tools.audit.targeting_collusion import Cell

    async def count(weakened: bool, attack: bool) -> Cell:
        return Cell(sum([await _trial(rng, weakened, attack) for _ in range(trials)]), trials)

    async def run():
        return await count(False, False), await count(False, True), await count(True, True)

    return asyncio.run(run())
