"""TokenWallet's refill logic: every token handed out once, refills ahead of need, failures reported."""
import asyncio
import itertools
from types import SimpleNamespace

import pytest

from traceless.client.tokens import TokenWallet


class FakeIssuerWallet(TokenWallet):
    """The wallet's own logic; the issuer, key and challenge are stand-ins (tokens are integers)."""

    def __init__(self, batch: int, delay: float = 0.005, fail_after: int | None = None):
        super().__init__(SimpleNamespace(token_batch=batch), http=None)
        self._ids = itertools.count()
        self.delay, self.fail_after = delay, fail_after

    async def _issuer_key(self):
        return "key"

    async def _current_challenge(self, key):
        if self._challenge is None:
            self._challenge = object()
        return self._challenge

    async def _fetch(self, challenge, key):
        await asyncio.sleep(self.delay)
        self.issuer_calls += 1
        if self.fail_after is not None and self.issuer_calls > self.fail_after:
            raise RuntimeError("issuer down")
        return [next(self._ids) for _ in range(self._config.token_batch)], challenge


@pytest.mark.parametrize("batch", [1, 4, 5, 8, 16])
def test_every_token_is_handed_out_once(batch):
    async def run():
        w = FakeIssuerWallet(batch)
        sequential = [await w.take() for _ in range(60)]  # drains faster than the background refill
        concurrent = await asyncio.gather(*(w.take() for _ in range(60)))
        return sequential + list(concurrent), w.issuer_calls

    tokens, calls = asyncio.run(run())
    assert len(set(tokens)) == len(tokens) == 120
    assert calls <= 120 // batch + 2  # nothing fetched twice over


def test_background_refill_means_requests_rarely_wait():
    async def run():
        w = FakeIssuerWallet(8, delay=0.01)
        waited = 0
        for _ in range(40):
            t0 = asyncio.get_running_loop().time()
            await w.take()
            waited += asyncio.get_running_loop().time() - t0 > 0.005
            await asyncio.sleep(0.02)  # requests spaced wider than one issuer call
        return waited

    assert asyncio.run(run()) == 1  # only the very first take waits for the issuer


def test_an_issuer_failure_reaches_the_request_that_needs_a_token():
    async def run():
        w = FakeIssuerWallet(4, fail_after=1)
        got = [await w.take() for _ in range(4)]
        with pytest.raises(RuntimeError, match="issuer down"):
            await w.take()
        return got

    assert asyncio.run(run()) == [3, 2, 1, 0]
