"""TokenWallet (issue 12, finding 4): refills on its own random schedule in fixed batches, never
because of a request; every token handed out once; one challenge for everyone (relay copy == direct
copy); only issuer keys that are in the transparency log; a new issuer key picked up without a restart."""
import asyncio
import itertools
import random
from types import SimpleNamespace

import httpx
import pytest

from traceless.client.tokens import MAX_LIVE_ISSUER_KEYS, TokenError, TokenWallet
from traceless.privacy.privacypass.http import b64url_encode
from traceless.privacy.translog.manifest import IssuerKeyEntry


def _config(**kw):
    base = dict(token_batch=8, token_low_water=4, token_refill_delay_s=(0.02, 0.05), token_wait_s=5.0,
                issuer_url="http://issuer.test:1", relay_url="http://relay.test", gateway_url="http://gw.test",
                origin_name="traceless", api_key="k")
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
    """An issuer directory, a gateway challenge (relay and direct copies) and the log's issuer keys."""

    def __init__(self, keys):
        self.keys, self.directory_key = keys, keys[0]
        self.logged = [IssuerKeyEntry("issuer.test:1", keys[0].spki, 0, 2**40)]
        self.direct_context, self.log_calls = b"\x00" * 32, []

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/token-issuer-directory":
            return httpx.Response(200, json={"token-keys": [
                {"token-type": 2, "token-key": b64url_encode(self.directory_key.spki)}]})
        if request.url.path == "/pcc/v1/challenge":
            context = b"\x00" * 32 if request.url.host == "relay.test" else self.direct_context
            return httpx.Response(401, headers={"www-authenticate": _header(context, self.directory_key)})
        return httpx.Response(500)

    def logged_keys(self, issuer, refresh):
        self.log_calls.append((issuer, refresh))
        return list(self.logged)


def _header(context, key) -> str:
    from traceless.privacy.privacypass.wire import TokenChallenge

    c = TokenChallenge(2, "issuer.test:1", context, "traceless")
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


def test_a_logged_issuer_key_and_an_agreeing_challenge_are_used(world_keys):
    world = _world(world_keys)
    assert _check(world, "key") == world_keys[0]
    assert _check(world, "challenge").redemption_context == b"\x00" * 32


def test_a_unique_challenge_for_this_client_is_detected(world_keys):
    world = _world(world_keys)
    world.direct_context = b"\x01" * 32  # the gateway tags this fetch
    with pytest.raises(TokenError) as e:
        _check(world, "challenge")
    assert e.value.reason == "challenge_mismatch"


def test_an_issuer_key_that_is_not_logged_is_refused(world_keys):
    world = _world(world_keys)
    world.directory_key = world_keys[1]  # a key for this user only, never logged
    with pytest.raises(TokenError) as e:
        _check(world, "key")
    assert e.value.reason == "issuer_key_not_logged"
    assert ("issuer.test:1", True) in world.log_calls  # it looked at a fresh tree head before refusing


def test_more_live_logged_keys_than_a_rotation_needs_are_refused(world_keys):
    world = _world(world_keys)
    world.logged = [IssuerKeyEntry("issuer.test:1", k.spki, 0, 2**40) for k in world_keys[:MAX_LIVE_ISSUER_KEYS + 1]]
    with pytest.raises(TokenError) as e:
        _check(world, "key")
    assert e.value.reason == "too_many_issuer_keys"
    world.logged[0] = IssuerKeyEntry("issuer.test:1", world_keys[0].spki, 0, 10)  # expired: not live
    world.logged[1] = IssuerKeyEntry("issuer.test:1", world_keys[1].spki, 0, 10)
    with pytest.raises(TokenError):
        _check(world, "key")  # the directory's key 0 has expired in the log: only key 2 is live ...
    world.directory_key = world_keys[2]
    assert _check(world, "key") == world_keys[2]


def test_a_rotated_issuer_key_is_used_once_logged_without_a_restart(world_keys):
    async def run(world):
        http = httpx.AsyncClient(transport=httpx.MockTransport(world.handler))
        wallet = TokenWallet(_config(), http, world.logged_keys)
        try:
            first = await wallet._issuer_key()
            world.directory_key = world_keys[3]  # the issuer rotated (or restarted)
            with pytest.raises(TokenError):
                await wallet._issuer_key()  # not logged yet
            world.logged.append(IssuerKeyEntry("issuer.test:1", world_keys[3].spki, 0, 2**40))
            second = await wallet._issuer_key()
            return first, second
        finally:
            await http.aclose()

    first, second = asyncio.run(run(_world(world_keys)))
    assert first == world_keys[0] and second == world_keys[3]
