"""TokenWallet: refills on its own random schedule in fixed batches, never because of a request or an
error, and the schedule survives anything a hop answers; a waiting request leaves on its own clock,
not when a batch lands; every token handed out once; one challenge for everyone (the epoch's public
one, fetched through the relay only: the gateway never sees the client's address); only the newest
issuer key in the transparency log, picked up without a restart."""

import asyncio
import itertools
import random
from types import SimpleNamespace

import httpx
import pytest

from traceless.privacy.privacypass.http import b64url_encode
from traceless.privacy.privacypass.redemption_schedule import RedemptionSchedule
from traceless.privacy.translog.manifest import IssuerKeyEntry
from traceless_tools.client.tokens import TokenError, TokenWallet

EPOCH_S = 3600.0


def _config(**kw):
    # gateway_url: where a wallet that checked challenges directly would go (this one must never)
    base = dict(
        token_batch=8,
        token_low_water=4,
        token_refill_delay_s=(0.02, 0.05),
        token_wait_s=5.0,
        token_release_delay_s=(0.01, 0.02),
        challenge_epoch_s=EPOCH_S,
        clock_leeway_s=60,
        issuer_url="http://issuer.test:1",
        relay_url="http://relay.test",
        gateway_url="http://gw.test",
        origin_name="traceless",
        api_key="k",
    )
    return SimpleNamespace(**(base | kw))


class _FakeChallenge:
    _ids = itertools.count()

    def __init__(self):
        self._id = next(self._ids)

    def encode(self) -> bytes:
        return self._id.to_bytes(4, "big")


class FakeIssuerWallet(TokenWallet):
    """The wallet's schedule logic; the issuer, key and challenge are stand-ins (tokens are integers)."""

    def __init__(self, fail_after: int | None = None, **kw):
        super().__init__(_config(**kw), http=None, rng=random.Random(1))
        self._ids = itertools.count()
        self.fail_after = fail_after
        self.fetch_sizes: list[int] = []
        self.challenge = _FakeChallenge()

    async def _issuer_key(self):
        return "key"

    async def _checked_challenge(self, key):
        return self.challenge

    async def _fetch(self, challenge, key):
        await asyncio.sleep(0.002)
        self.issuer_calls += 1
        if self.fail_after is not None and self.issuer_calls > self.fail_after:
            raise TokenError("issuer down")
        self.fetch_sizes.append(self._config.token_batch)
        return [next(self._ids) for _ in range(self._config.token_batch)]


def test_every_token_is_handed_out_once_and_every_fetch_is_one_fixed_batch():
    async def run():
        w = FakeIssuerWallet()
        sequential = [await w.take() for _ in range(30)]
        concurrent = await asyncio.gather(*(w.take() for _ in range(30)))
        await w.aclose()
        return sequential + list(concurrent), w

    tokens, w = asyncio.run(run())
    assert len(set(tokens)) == len(tokens) == 60
    assert set(w.fetch_sizes) == {8} and w.issuer_calls <= 60 // 8 + 2


def test_requests_never_trigger_a_fetch():
    """A burst of takes does not hasten the schedule: fetches happen only at the wallet's own wakes."""

    async def run():
        w = FakeIssuerWallet(token_refill_delay_s=(0.3, 0.3))
        w.start()
        await asyncio.sleep(0.05)  # the first wake has filled the wallet
        calls_before = w.issuer_calls
        for _ in range(8):  # drain it completely
            await w.take()
        burst = asyncio.gather(*(w.take() for _ in range(3)))
        await asyncio.sleep(0.1)
        calls_during = w.issuer_calls  # still waiting for the next wake (0.3 s after the first)
        got = await burst
        await w.aclose()
        return calls_before, calls_during, len(got)

    before, during, served = asyncio.run(run())
    assert before == 1 and during == 1 and served == 3


def test_a_waiting_request_leaves_on_its_own_clock_not_when_the_batch_lands():
    """Forced refill, burst drain: a request that waits on an empty wallet must not be sent the instant
    the next batch lands (the issuer sees the batch, the gateway the spend: lock-step links them). It
    leaves at a time drawn when it began waiting."""

    async def run():
        loop = asyncio.get_running_loop()
        w = FakeIssuerWallet(token_refill_delay_s=(0.05, 0.05), token_release_delay_s=(0.3, 0.3))
        landed = []
        fetch = w._fetch

        async def recording_fetch(challenge, key):
            tokens = await fetch(challenge, key)
            landed.append(loop.time())
            return tokens

        w._fetch = recording_fetch
        w.start()
        await asyncio.sleep(0.02)  # the first wake has filled the wallet
        for _ in range(8):
            await w.take()
        start = loop.time()
        await w.take()  # waits for the next wake (~0.03 s from now)
        left = loop.time()
        await w.aclose()
        return start, landed[1], left

    start, landed, left = asyncio.run(run())
    assert landed - start < 0.1 and left - landed > 0.2


def test_the_refill_delays_are_random_within_the_configured_range():
    async def run():
        sleeps = []
        w = FakeIssuerWallet(token_refill_delay_s=(0.01, 0.04))
        real_sleep = asyncio.sleep

        async def recording_sleep(delay):
            if delay >= 0.01:
                sleeps.append(delay)
            await real_sleep(0.001)

        asyncio.sleep = recording_sleep
        try:
            w.start()
            while len(sleeps) < 20:
                await real_sleep(0.001)
        finally:
            asyncio.sleep = real_sleep
            await w.aclose()
        return sleeps

    sleeps = asyncio.run(run())
    assert all(0.01 <= s <= 0.04 for s in sleeps) and len(set(sleeps)) > 10


def test_an_issuer_failure_reaches_the_request_that_needs_a_token():
    async def run():
        w = FakeIssuerWallet(fail_after=1)
        got = [await w.take() for _ in range(8)]
        with pytest.raises(TokenError, match="issuer down"):
            await w.take()
        await w.aclose()
        return got

    assert sorted(asyncio.run(run())) == list(range(8))


def test_a_new_challenge_drops_the_old_tokens():
    async def run():
        w = FakeIssuerWallet()
        first = await w.take()
        w.challenge = _FakeChallenge()  # the gateway's next epoch
        await w.refill_once()
        second = await w.take()
        await w.aclose()
        return first, second

    first, second = asyncio.run(run())
    assert second >= 8  # from the second batch: the first batch's tokens were dropped


class _Copy:
    """The same challenge as fetched again on a later wake: an equal, new object."""

    def __init__(self, of):
        self.of = of

    def encode(self) -> bytes:
        return self.of.encode()


def test_every_refill_of_the_same_epoch_is_kept():
    """Each wake fetches the challenge anew (an equal object, not the same one): the batches of the
    second and later wakes must be kept, not dropped as if the epoch had changed."""

    async def run():
        w = FakeIssuerWallet()
        epoch = w.challenge
        w._checked_challenge = lambda key: asyncio.sleep(0, _Copy(epoch))
        await w.refill_once()
        taken = [w._tokens.pop() for _ in range(len(w._tokens))]
        await w.refill_once()
        left = len(w._tokens)
        await w.aclose()
        return taken, left, w.issuer_calls

    taken, left, calls = asyncio.run(run())
    assert len(taken) == 8 and left == 8 and calls == 2


# --- the real key and challenge checks, over a mock transport ---------------------------------------
class World:
    """An issuer directory, a gateway challenge (as the relay forwards it, and as the gateway would
    answer a direct fetch) and the log's issuer keys. `hosts` records every host the wallet contacted."""

    def __init__(self, keys):
        self.keys, self.directory_keys = keys, [keys[0]]
        self.logged = [IssuerKeyEntry("issuer.test:1", keys[0].spki, 0, 2**40)]
        self.relayed_context: bytes | None = None  # None: the epoch's public challenge
        self.direct_context: bytes | None = None
        self.malformed_challenge = False
        self.log_calls, self.hosts = [], []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.hosts.append(request.url.host)
        if request.url.path == "/token-issuer-directory":
            return httpx.Response(
                200,
                json={
                    "token-keys": [{"token-type": 2, "token-key": b64url_encode(k.spki)} for k in self.directory_keys]
                },
            )
        if request.url.path == "/pcc/v1/challenge":
            if self.malformed_challenge:
                return httpx.Response(200, headers={"www-authenticate": 'PrivateToken challenge="'})
            context = self.relayed_context if request.url.host == "relay.test" else self.direct_context
            return httpx.Response(200, headers={"www-authenticate": _header(context, self.directory_keys[0])})
        return httpx.Response(500)

    def logged_keys(self, issuer, refresh):
        self.log_calls.append((issuer, refresh))
        return list(self.logged)


def public_context() -> bytes:
    import time

    return RedemptionSchedule("issuer.test:1", "", EPOCH_S, 0.0).current(time.time()).challenge.redemption_context


def _header(context, key) -> str:
    from traceless.privacy.privacypass.wire import TokenChallenge

    c = TokenChallenge(2, "issuer.test:1", public_context() if context is None else context, "")
    return f'PrivateToken challenge="{b64url_encode(c.encode())}", token-key="{b64url_encode(key.spki)}"'


@pytest.fixture(scope="module")
def world_keys():
    from cryptography.hazmat.primitives.asymmetric import rsa

    from traceless.privacy.privacypass.keys import IssuerPublicKey

    return [IssuerPublicKey.from_public_key(rsa.generate_private_key(65537, 2048).public_key()) for _ in range(4)]


def _world(keys):
    return World(keys)


def _check(world, fetch: str):
    async def run():
        http = httpx.AsyncClient(transport=httpx.MockTransport(world.handler))
        wallet = TokenWallet(_config(), http, world.logged_keys)
        try:
            if fetch == "key":
                return await wallet._issuer_key()
            key = await wallet._issuer_key()
            return await wallet._checked_challenge(key)
        finally:
            await http.aclose()

    return asyncio.run(run())


def test_the_logged_issuer_key_and_the_public_challenge_are_used(world_keys):
    world = _world(world_keys)
    assert _check(world, "key") == world_keys[0]
    assert _check(world, "challenge").redemption_context == public_context()


def test_the_wallet_never_contacts_the_gateway_directly(world_keys):
    """A direct fetch shows the gateway the client's address next to the relayed one: the gateway
    pairs the two by time and tags both (a pairing tagger)."""
    world = _world(world_keys)
    try:
        _check(world, "challenge")
    except TokenError:
        pass
    assert "gw.test" not in world.hosts and "relay.test" in world.hosts


def test_a_challenge_tagged_alike_on_both_paths_is_refused(world_keys):
    """The pairing tagger answers the relayed and the direct fetch with the same tag: comparing the
    two copies cannot catch it; comparing with the epoch's public challenge does."""
    world = _world(world_keys)
    world.relayed_context = world.direct_context = b"\x01" * 32
    with pytest.raises(TokenError) as e:
        _check(world, "challenge")
    assert e.value.reason == "challenge_mismatch"


def test_an_issuer_key_that_is_not_logged_is_refused(world_keys):
    world = _world(world_keys)
    world.directory_keys = [world_keys[1]]  # a key for this user only, never logged
    with pytest.raises(TokenError) as e:
        _check(world, "key")
    assert e.value.reason == "issuer_key_not_logged"
    assert ("issuer.test:1", True) in world.log_calls  # it looked at a fresh tree head before refusing


def test_an_older_logged_key_shown_to_one_user_is_refused(world_keys):
    """Key partition: two live logged keys (a rotation's overlap); the issuer shows this user the older
    one while everyone else uses the newer, and the gateway reads the key id back at redemption."""
    world = _world(world_keys)
    world.logged = [IssuerKeyEntry("issuer.test:1", k.spki, 0, 2**40) for k in world_keys[:2]]
    world.directory_keys = [world_keys[0]]
    with pytest.raises(TokenError) as e:
        _check(world, "key")
    assert e.value.reason == "issuer_key_not_newest"
    world.directory_keys = [world_keys[1], world_keys[0]]  # both offered: the newest is the one used
    assert _check(world, "key") == world_keys[1]


def test_issuer_restarts_that_log_new_keys_keep_issuance_working(world_keys):
    """Every restart logs a new key: three live logged keys; the newest, which the issuer offers, is used."""
    world = _world(world_keys)
    world.logged = [IssuerKeyEntry("issuer.test:1", k.spki, 0, 2**40) for k in world_keys[:3]]
    world.directory_keys = [world_keys[2]]
    assert _check(world, "key") == world_keys[2]
    world.logged[2] = IssuerKeyEntry("issuer.test:1", world_keys[2].spki, 0, 10)  # expired: not live
    world.directory_keys = [world_keys[1]]
    assert _check(world, "key") == world_keys[1]


def test_a_rotated_issuer_key_is_used_once_logged_without_a_restart(world_keys):
    async def run(world):
        http = httpx.AsyncClient(transport=httpx.MockTransport(world.handler))
        wallet = TokenWallet(_config(), http, world.logged_keys)
        try:
            first = await wallet._issuer_key()
            world.directory_keys = [world_keys[3]]  # the issuer rotated (or restarted)
            with pytest.raises(TokenError):
                await wallet._issuer_key()  # not logged yet
            world.logged.append(IssuerKeyEntry("issuer.test:1", world_keys[3].spki, 0, 2**40))
            second = await wallet._issuer_key()
            return first, second
        finally:
            await http.aclose()

    first, second = asyncio.run(run(_world(world_keys)))
    assert first == world_keys[0] and second == world_keys[3]


def test_a_malformed_challenge_header_does_not_stop_the_schedule(world_keys):
    """One malformed WWW-Authenticate must not kill the schedule (and a request must not restart it)."""

    async def run(world):
        http = httpx.AsyncClient(transport=httpx.MockTransport(world.handler))
        wallet = TokenWallet(_config(), http, world.logged_keys)
        world.malformed_challenge = True
        wallet.start()
        try:
            await asyncio.sleep(0.15)  # a few wakes, each refused
            task = wallet._task
            alive = task is not None and not task.done()
            world.malformed_challenge = False
            await asyncio.sleep(0.15)
            return alive, wallet._task is task, len(wallet._tokens)
        finally:
            await wallet.aclose()
            await http.aclose()

    alive, same_task, _ = asyncio.run(run(_world(world_keys)))
    assert alive and same_task
