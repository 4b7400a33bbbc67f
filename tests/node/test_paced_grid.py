"""A shaped stream's chunks leave at instants fixed when its request arrived, whatever the engine
does: the first on the prefill budget's tick even when the first token (and so the inner response's
head) comes later, every other one tick after it, all of one size, and the times independent of when
the tokens came. Driven through the node's service with a fake engine on virtual time (an exact clock
that no machine load disturbs); the client decodes what it always decoded."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.virtual_clock import run_virtual
from traceless.http.errors import ApiError
from traceless.node.framing import framer_for
from traceless.node.identity import NodeIdentity
from traceless.node.service import NodeService
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.software import SoftwareAttester
from traceless.privacy.ohttp.call import encapsulate_call, open_response
from traceless.privacy.shape import STREAM_CHUNK, ShapePolicy, split_sse
from traceless.server.telemetry import Telemetry

TICK, BUDGET = 0.1, 0.3  # a 1 KiB request's first tick: 0.3 s after it arrived
POLICY = ShapePolicy(tick_ms=100, prefill_ms_per_kib=300, decode_ms_per_token=500)
MAX_TOKENS = 4  # decode budget: 4 x 0.5 s = 20 ticks
EVENTS = [b'data: {"t": %d}\n\n' % i for i in range(MAX_TOKENS)] + [b"data: [DONE]\n\n"]
TAG, NONCE = 16, 16


class FakeApi:
    """An OpenAI service whose prefill takes `prefill` seconds and whose events come after `gaps`;
    `fail` answers an error after the prefill instead."""

    def __init__(self, prefill: float, gaps: list[float], fail: bool = False):
        self.prefill, self.gaps, self.fail = prefill, gaps, fail
        self.cancelled = self.closed = False

    def handlers(self):
        return {"completions": self.completions}

    async def completions(self, parsed):
        try:
            await asyncio.sleep(self.prefill)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if self.fail:
            raise ApiError(400, "max_tokens must be at least 1", param="max_tokens")
        return self._events()

    async def _events(self):
        try:
            for gap, event in zip(self.gaps, EVENTS):
                await asyncio.sleep(gap)
                yield event
        finally:
            self.closed = True


IDENTITY = NodeIdentity(SoftwareAttester(), Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32))


def service(api: FakeApi, policy: ShapePolicy = POLICY) -> NodeService:
    return NodeService(IDENTITY, api, Telemetry(), framer_for(policy, 0, 128))  # type: ignore[arg-type]


def request():
    body = {"model": "tiny", "prompt": "w5 w6", "max_tokens": MAX_TOKENS, "stream": True}
    return encapsulate_call(
        IDENTITY.keys.current.key_config, b"/v1/completions", json.dumps(body).encode(), stream=True
    )


async def emit(api: FakeApi, policy: ShapePolicy = POLICY):
    """(outer head's time, [(chunk's time, chunk)]) relative to the request's arrival, and the call."""
    loop, call = asyncio.get_running_loop(), request()
    t0 = loop.time()
    response = await service(api, policy).handle(call.body, chunked=True)
    head = loop.time() - t0
    chunks = [(loop.time() - t0, c) async for c in response.body_iterator]
    return head, chunks, call


def sizes(chunks) -> list[int]:
    return [len(c) - (NONCE if i == 0 else 0) for i, (_, c) in enumerate(chunks)]


def on_grid(times: list[float]) -> bool:
    return all(abs(t - (BUDGET + k * TICK)) < 1e-9 for k, t in enumerate(times))


def test_a_prefill_longer_than_its_budget_still_starts_the_stream_on_the_budget_tick():
    api = FakeApi(prefill=0.75, gaps=[0.0, 0.05, 0.13, 0.3, 0.01])
    head, chunks, call = run_virtual(emit(api))
    times = [t for t, _ in chunks]
    assert abs(head - BUDGET) < 1e-9, head  # the outer head: not at the first token (0.75 s) or the tick after
    assert on_grid(times), times
    assert len(chunks) == MAX_TOKENS * 0.5 / TICK
    assert set(sizes(chunks)[:-1]) == {STREAM_CHUNK + TAG + 2}  # 2: the chunk's varint length
    got = open_response(call, b"".join(c for _, c in chunks))
    assert got.status == 200 and split_sse(got.content) == EVENTS  # what the client decodes is unchanged


@pytest.mark.parametrize(
    "prefill,gaps",
    [
        (0.01, [0.0] * 5),  # everything at once, before the first tick
        (0.2, [0.31, 0.002, 0.4, 0.05, 0.33]),  # slow and irregular tokens
        (1.1, [0.0, 0.9, 0.0, 0.0, 0.0]),  # a prefill past the budget, then a token that falls behind
    ],
)
def test_the_chunks_times_and_sizes_do_not_depend_on_when_the_tokens_came(prefill, gaps):
    reference = run_virtual(emit(FakeApi(0.0, [0.0] * 5)))
    head, chunks, call = run_virtual(emit(FakeApi(prefill, gaps)))
    assert head == pytest.approx(reference[0], abs=1e-9)
    assert [t for t, _ in chunks] == pytest.approx([t for t, _ in reference[1]], abs=1e-9)
    assert sizes(chunks) == sizes(reference[1])
    got = open_response(call, b"".join(c for _, c in chunks))
    assert got.status == 200 and split_sse(got.content) == EVENTS


def test_an_error_found_after_the_budget_is_framed_on_the_same_grid_and_readable():
    head, chunks, call = run_virtual(emit(FakeApi(prefill=0.72, gaps=[], fail=True)))
    assert abs(head - BUDGET) < 1e-9 and on_grid([t for t, _ in chunks])
    assert set(sizes(chunks)[:-1]) == {STREAM_CHUNK + TAG + 2} and len(chunks) == 8  # a JSON body: pow2 ticks
    got = open_response(call, b"".join(c for _, c in chunks))
    assert got.status == 400 and json.loads(got.content)["error"]["param"] == "max_tokens"


def test_a_client_that_leaves_stops_the_inner_work():
    async def leave_before_the_first_tick(api):
        task = asyncio.ensure_future(service(api).handle(request().body, chunked=True))
        await asyncio.sleep(BUDGET / 2)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def leave_mid_stream(api):
        response = await service(api).handle(request().body, chunked=True)
        body = response.body_iterator
        for _ in range(4):
            await body.__anext__()
        await body.aclose()

    api = FakeApi(prefill=1.0, gaps=[0.0] * 5)
    run_virtual(leave_before_the_first_tick(api))
    assert api.cancelled  # the engine request is aborted while its prefill runs
    api = FakeApi(prefill=0.1, gaps=[0.0, 0.0, 5.0, 0.0, 0.0])
    run_virtual(leave_mid_stream(api))
    assert api.closed  # its events are closed
