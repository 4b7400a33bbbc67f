"""Attacks of colluding hops (gateway, issuer, relay) in `traceless audit targeting`: each row is an
attack's success rate against our client, beside the honest baseline and beside a deliberately
weakened client that lacks the one defence the attack targets, so the audit can see each attack.

Linking attacks (this file; metric: the attacker names the user behind a spend, fair level 1/USERS,
an attacker without a signal guessing at random):
    pairing_tagger   the gateway pairs a client's direct challenge fetch (which shows its address)
                     with the relayed one arriving at the same moment and tags both alike; at
                     redemption the tag names the user. Weakened: the wallet that fetched both
                     copies and compared them.
    key_partition    the issuer shows the target an older live logged key while everyone else uses
                     the newest; the key id of a spend names the target. Weakened: any live logged
                     key the directory offers.
    forced_refill    the gateway refuses the target's token (401); the client dropped its tokens,
                     waited for the next batch and resent the instant it landed: issuer and gateway
                     pair the refill with the spend. Weakened: that client.
Routing attacks (targeting_collusion_routing.py; metric: P(target's request answered by T), fair
level T's capacity share): node_aliases, retry_steering.

Every cell has a 99.99% Wilson interval (VERDICT_Z, as the routing rows): BEATS when its lower bound
is above the fair level. The audit passes a row when the honest baseline is AT the fair level, the
attack on our client does not BEAT it, and the attack on the weakened client does.
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from traceless_tools.audit.stats import wilson_interval
from traceless_tools.audit.targeting_estimate import AT, BEATS, BELOW, VERDICT_Z
from traceless_tools.client.tokens import TokenError, TokenWallet

USERS = 8


@dataclass(frozen=True, slots=True)
class Cell:
    successes: int
    trials: int

    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.successes, self.trials, z=VERDICT_Z)

    def verdict(self, fair: float) -> str:
        lo, hi = self.interval()
        return BEATS if lo > fair else BELOW if hi < fair else AT

    def to_json(self, fair: float) -> dict:
        return {
            "successes": self.successes,
            "trials": self.trials,
            "rate": self.successes / self.trials if self.trials else float("nan"),
            "interval_99_99": list(self.interval()),
            "verdict": self.verdict(fair),
        }


@dataclass(frozen=True, slots=True)
class CollusionRow:
    strategy: str
    metric: str
    fair: float  # the rate an attacker gets without the attack: 1/USERS, or T's capacity share
    honest: Cell  # our client, the hops honest
    attacked: Cell  # our client, under the attack
    weakened: Cell  # the client without the defence, under the attack
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return (
            self.honest.verdict(self.fair) == AT
            and self.attacked.verdict(self.fair) != BEATS
            and self.weakened.verdict(self.fair) == BEATS
        )

    def to_json(self) -> dict:
        return {
            "strategy": self.strategy,
            "metric": self.metric,
            "fair": self.fair,
            "honest": self.honest.to_json(self.fair),
            "attacked": self.attacked.to_json(self.fair),
            "weakened": self.weakened.to_json(self.fair),
            "passed": self.passed,
            "notes": self.notes,
        }


def _guess(rng: random.Random, user: int) -> bool:
    """An attacker without a signal names one of USERS users at random."""
    return rng.randrange(USERS) == user


# --- pairing tagger ------------------------------------------------------------------------------
class PairingTagger:
    """The gateway's challenge route as a pairing tagger runs it: a direct fetch (from user u's own
    address) mints a tag for u; a relayed fetch within PAIR_S of it gets the same tag; any other
    relayed fetch gets the public challenge."""

    PAIR_S = 0.05

    def __init__(self, issuer_name: str, key_spki: bytes, honest_header: Callable[[], str]) -> None:
        self._issuer, self._key, self._honest = issuer_name, key_spki, honest_header
        self.tags: dict[bytes, int] = {}  # tag -> user
        self._last: tuple[float, bytes] | None = None

    def header(self, context: bytes) -> str:
        from traceless.privacy.privacypass.http import PrivateTokenChallenge, format_www_authenticate
        from traceless.privacy.privacypass.wire import TOKEN_TYPE_BLIND_RSA, TokenChallenge

        challenge = TokenChallenge(TOKEN_TYPE_BLIND_RSA, self._issuer, context, "")
        return format_www_authenticate([PrivateTokenChallenge(challenge.encode(), self._key, 3600)])

    def last_at(self) -> float:
        return self._last[0] if self._last is not None else -float("inf")

    def answer(self, user: int | None, now: float) -> str:
        if user is not None:
            tag = secrets.token_bytes(32)
            self.tags[tag] = user
            self._last = (now, tag)
            return self.header(tag)
        if self._last is not None and now - self._last[0] < self.PAIR_S:
            return self.header(self._last[1])
        return self._honest()


def _tagger_transport(tagger: PairingTagger, real: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
    """Challenge fetches go to the tagger (relay.attack: relayed; direct.attack/u/N: user N's own
    address); everything else (issuer) to the real services. A relayed fetch is held up to PAIR_S
    for a direct fetch to pair it with."""
    import time

    class Transport(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if not request.url.path.endswith("/pcc/v1/challenge"):
                return await real.handle_async_request(request)
            user = int(request.url.path.split("/")[2]) if request.url.host == "direct.attack" else None
            if user is None:
                waited = time.monotonic()
                while tagger.last_at() < waited - tagger.PAIR_S and time.monotonic() - waited < tagger.PAIR_S:
                    await asyncio.sleep(0.002)
            return httpx.Response(200, headers={"www-authenticate": tagger.answer(user, time.monotonic())})

    return Transport()


def pairing_tagger(w, trials: int, rng: random.Random) -> tuple[Cell, Cell, Cell]:
    """One trial: a random user's wallet refills once; the attacker reads the challenge of its tokens."""
    from traceless.privacy.privacypass.http import PrivateTokenChallenge, format_www_authenticate
    from traceless.privacy.privacypass.redemption_schedule import RedemptionSchedule
    from traceless_tools.audit.targeting_linking import _logged_keys, _wallet_config
    from traceless_tools.cluster.issuer_directory import issuer_name

    name = issuer_name(w.issuer_url)

    def honest_header() -> str:
        import time

        public = RedemptionSchedule(name, "", 3600.0, 0.0).current(time.time()).challenge
        return format_www_authenticate([PrivateTokenChallenge(public.encode(), w.issuer_key_spki, 3600)])

    async def trial(weakened: bool, attack: bool) -> bool:
        user = rng.randrange(USERS)
        tagger = PairingTagger(name, w.issuer_key_spki, honest_header)
        relay = "http://relay.attack" if attack else w.gateway_url
        cfg = _wallet_config(w, relay, f"http://direct.attack/u/{user}", w.issuer_url)
        transport = _tagger_transport(tagger, httpx.AsyncHTTPTransport()) if attack else httpx.AsyncHTTPTransport()
        async with httpx.AsyncClient(transport=transport, timeout=10) as http:
            wallet = (_DirectCheckingWallet if weakened else TokenWallet)(cfg, http, _logged_keys(w))
            try:
                await wallet.refill_once()
            except TokenError:
                return _guess(rng, user)
            tag = wallet._tokens[0].challenge_digest if wallet._tokens else None
        named = next((u for t, u in tagger.tags.items() if _digest(name, t) == tag), None)
        return named == user if named is not None else _guess(rng, user)

    return _cells(trials, trial)


def _digest(issuer: str, context: bytes) -> bytes:
    from traceless.privacy.privacypass.wire import TOKEN_TYPE_BLIND_RSA, TokenChallenge

    return TokenChallenge(TOKEN_TYPE_BLIND_RSA, issuer, context, "").digest()


class _DirectCheckingWallet(TokenWallet):
    """WEAKENED: fetches the challenge through the relay and directly from the gateway at once and
    accepts it when the two agree (the wallet before the public challenge)."""

    async def _checked_challenge(self, key):
        relayed, direct = await asyncio.gather(
            self._challenge_from(self._config.relay_url, key), self._challenge_from(self._config.gateway_url, key)
        )
        if relayed.encode() != direct.encode():
            raise TokenError("the two copies differ", "challenge_mismatch")
        return relayed


def _cells(trials: int, trial: Callable) -> tuple[Cell, Cell, Cell]:
    """(honest, attacked, weakened): `trial(weakened, attack)` -> whether the attacker named the user."""

    async def count(weakened: bool, attack: bool) -> Cell:
        return Cell(sum([await trial(weakened, attack) for _ in range(trials)]), trials)

    async def run() -> tuple[Cell, Cell, Cell]:
        return await count(False, False), await count(False, True), await count(True, True)

    return asyncio.run(run())


# --- issuer key partition ------------------------------------------------------------------------
class _AnyLoggedKeyWallet(TokenWallet):
    """WEAKENED: takes the first key the directory offers if it is any live logged key."""

    async def _issuer_key(self):
        from traceless.privacy.privacypass.http import b64url_decode
        from traceless.privacy.privacypass.keys import IssuerPublicKey

        r = await self._http.get(self._config.issuer_url.rstrip("/") + "/token-issuer-directory")
        offered = b64url_decode(r.json()["token-keys"][0]["token-key"], "token-key")
        if offered not in await asyncio.to_thread(self._live_logged, self._issuer_name()):
            raise TokenError("not logged", "issuer_key_not_logged")
        return IssuerPublicKey.from_spki(offered)


def key_partition(w, trials: int, rng: random.Random) -> tuple[Cell, Cell, Cell]:
    """A newer issuer key is logged (two live keys: a rotation's overlap). One trial: a random user's
    wallet picks its key; under attack the issuer's directory shows that user the older key, which
    nobody else uses, so its key id names the user."""
    import time

    from cryptography.hazmat.primitives.asymmetric import rsa

    from traceless.privacy.privacypass.http import b64url_encode
    from traceless.privacy.privacypass.keys import encode_token_key
    from traceless.privacy.translog.log import TransparencyLog
    from traceless.privacy.translog.manifest import IssuerKeyEntry
    from traceless_tools.audit.targeting_linking import _logged_keys, _wallet_config, witness_round
    from traceless_tools.cluster.issuer_directory import issuer_name

    older, newer = w.issuer_key_spki, encode_token_key(rsa.generate_private_key(65537, 2048).public_key())
    now = int(time.time())
    TransparencyLog.open(w.dir / "log").append(
        IssuerKeyEntry(issuer_name(w.issuer_url), newer, now - 30, now + 86400).encode()
    )
    witness_round(w)

    async def trial(weakened: bool, attack: bool) -> bool:
        user = rng.randrange(USERS)
        shown = older if attack else newer

        def directory(request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, json={"token-keys": [{"token-type": 2, "token-key": b64url_encode(shown)}]})

        cfg = _wallet_config(w, w.gateway_url, w.gateway_url, w.issuer_url)
        async with httpx.AsyncClient(transport=httpx.MockTransport(directory)) as http:
            wallet = (_AnyLoggedKeyWallet if weakened else TokenWallet)(cfg, http, _logged_keys(w))
            try:
                key = await wallet._issuer_key()
            except TokenError:
                return _guess(rng, user)
        # Everyone else holds the newest key: the older one names this user.
        return True if key.spki == older else _guess(rng, user)

    return _cells(trials, trial)


def measure_collusion_linking(trials: int, seed: int | None = None) -> list[CollusionRow]:
    """pairing_tagger and key_partition against the real issuer, log and witness; forced_refill
    against the real client's request and wallet logic (targeting_refill.py)."""
    from traceless_tools.audit.targeting_linking import world
    from traceless_tools.audit.targeting_refill import forced_refill

    rng = random.Random(seed) if seed is not None else random.Random(secrets.randbits(64))
    metric = f"attacker names the user behind a spend (of {USERS})"
    with world() as w:
        rows = [
            CollusionRow("pairing_tagger", metric, 1 / USERS, *pairing_tagger(w, trials, rng)),
            CollusionRow("key_partition", metric, 1 / USERS, *key_partition(w, trials, rng)),
        ]
    rows.append(CollusionRow("forced_refill", metric, 1 / USERS, *forced_refill(trials, rng)))
    return rows
