"""The client's failure rule: a failed request is never resent onto a fresh draw; its draw is kept for
the next request, so a gateway that fails requests (and a caller that retries them) cannot re-roll the
client's draw. After a 5xx, a refused token or a truncated stream the error is surfaced with its cause
and nothing is resent; the one resend is to the same node under a new id after a gateway restart."""

import asyncio
import random

import httpx
import pytest

from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.ohttp.gateway import OhttpServer
from traceless.privacy.privacypass.wire import Token
from traceless_tools.client.node_verifier import VerifiedNode
from traceless_tools.client.private_client import AsyncPrivateClient, ClientConfig, PrivateClientError

SERVERS = [OhttpServer(key_id=1), OhttpServer(key_id=2)]
NODES = [VerifiedNode(f"node{i}", 1, s.key_config, b"\x00" * 32, f"kid{i}", 0.0) for i, s in enumerate(SERVERS)]


def _client(handler, rng=None):
    config = ClientConfig("http://issuer", "k", "http://relay", "http://log", b"\x00" * 32, (), "m")
    client = AsyncPrivateClient(config, http=httpx.AsyncClient(transport=httpx.MockTransport(handler)), rng=rng)

    async def candidates():
        return list(NODES)

    async def take():
        return Token(2, b"\x00" * 32, b"\x01" * 32, b"\x02" * 32, b"\x03" * 256)

    client._verified_candidates = candidates
    client.wallet.take = take
    return client


def _run(handler):
    posts = []

    def record(request):
        posts.append(request.url.path)
        return handler(request, len(posts))

    client = _client(record)

    async def go():
        try:
            return await client.request("/v1/completions", {"model": "m", "prompt": "secret", "max_tokens": 1})
        finally:
            await client.aclose()

    return posts, go


def test_no_resend_after_a_5xx():
    posts, go = _run(lambda request, n: httpx.Response(502, json={"error": {"message": "x"}}))
    with pytest.raises(PrivateClientError):
        asyncio.run(go())
    assert len(posts) == 1  # the prompt went out once


def test_no_resend_after_a_broken_response():
    posts, go = _run(
        lambda request, n: httpx.Response(200, content=b"\x00" * 10, headers={"content-type": "message/ohttp-res"})
    )
    with pytest.raises(PrivateClientError):
        asyncio.run(go())
    assert len(posts) == 1


def _answer(request: httpx.Request, server: OhttpServer) -> httpx.Response:
    """What a node answers: the request decrypted, a 200 JSON reply encrypted to it."""
    _, context = server.decapsulate_request(request.content)
    reply = bhttp.encode_response(bhttp.Response(200, content=b'{"object": "chat.completion"}'))
    return httpx.Response(200, content=context.encapsulate(reply), headers={"content-type": "message/ohttp-res"})


def _cause(error: PrivateClientError) -> str | None:
    cause = getattr(error, "cause", None)
    return getattr(cause, "value", None)


def test_a_refused_token_fails_the_request_and_causes_no_refill():
    """Forced refill: a 401 made the client drop its tokens, wait for the next batch and resend the
    instant it landed; issuer and gateway then line the two up. Now the request fails, nothing is
    resent and the wallet keeps its tokens."""
    posts, go = _run(lambda request, n: httpx.Response(401, json={"error": {"message": "x"}}))
    with pytest.raises(PrivateClientError) as e:
        asyncio.run(go())
    assert len(posts) == 1 and _cause(e.value) == "token_refused"


def test_a_gateway_failing_requests_bound_for_honest_nodes_gains_nothing_from_retries():
    """Retry steering: the gateway answers 502 to every request not bound for its own node, and the
    caller (the openai SDK) retries each failure twice. Each retry used to draw afresh, so the
    attacker's node answered almost every request; the failed request's draw is now kept."""
    evil = NODES[1].node_id

    def gateway(request):
        if request.url.path.endswith("/" + evil):
            return _answer(request, SERVERS[1])
        return httpx.Response(502, json={"error": {"message": "bad gateway"}})

    client = _client(gateway, random.Random(7))

    async def go():
        answered = 0
        for _ in range(100):
            for _attempt in range(3):  # the SDK's default: the call and two retries
                try:
                    await client.request("/v1/completions", {"model": "m", "prompt": "p", "max_tokens": 1})
                    answered += 1
                    break
                except PrivateClientError:
                    continue
        await client.aclose()
        return answered

    # The honest node's draw is kept: every later request goes there (and fails); the attacker answers
    # only the requests drawn for it before the first honest draw, about one.
    assert asyncio.run(go()) <= 10


def test_a_renamed_node_is_followed_to_its_new_id_and_nothing_else():
    """After a gateway restart the cached node ids are unknown (404): the round is fetched again and the
    request goes to the same node (by attester key) under its new id, never to a fresh draw."""
    renamed = [VerifiedNode(f"new{i}", 1, s.key_config, b"\x00" * 32, f"kid{i}", 0.0) for i, s in enumerate(SERVERS)]
    sent_to: list[str] = []

    def gateway(request):
        node_id = request.url.path.rsplit("/", 1)[1]
        sent_to.append(node_id)
        if node_id.startswith("node"):
            return httpx.Response(404, json={"error": {"message": "no such node", "code": "node_not_found"}})
        return _answer(request, SERVERS[int(node_id[-1])])

    client = _client(gateway)
    rounds = iter([list(NODES), renamed])
    client._verified_candidates = lambda: asyncio.sleep(0, next(rounds))

    async def go():
        try:
            return await client.request("/v1/completions", {"model": "m", "prompt": "p", "max_tokens": 1})
        finally:
            await client.aclose()

    assert asyncio.run(go()) == {"object": "chat.completion"}
    assert len(sent_to) == 2 and sent_to[1] == "new" + sent_to[0][-1]


def test_a_relay_that_cannot_be_reached_names_its_cause():
    def handler(request, n):
        raise httpx.ConnectError("connection refused", request=request)

    posts, go = _run(handler)
    with pytest.raises(PrivateClientError) as e:
        asyncio.run(go())
    assert len(posts) == 1 and _cause(e.value) == "relay_unreachable"


class _Silent(httpx.AsyncByteStream):
    """A node's chunked response that sends `first` (the response head, or nothing) and then goes
    silent, as a stalled node does."""

    def __init__(self, first: list[bytes]):
        self.first = first

    async def __aiter__(self):
        for piece in self.first:
            yield piece
        await asyncio.sleep(60)


def _stalling(with_head: bool):
    from traceless.privacy.bhttp.stream import ResponseStreamEncoder

    def handler(request, n):
        server = SERVERS[int(request.url.path.rsplit("node", 1)[1])]
        _, context = server.decapsulate_chunked_request(request.content)
        encryptor = context.encryptor()
        first = [encryptor.seal_chunk(ResponseStreamEncoder().head(200))] if with_head else []
        return httpx.Response(200, headers={"content-type": "message/ohttp-chunked-res"}, stream=_Silent(first))

    return handler


@pytest.mark.parametrize("with_head", [False, True])
def test_a_silent_stream_fails_with_a_timeout_error_and_is_not_resent(with_head):
    """A node that stalls before its response head, or between chunks, does not hold the request
    forever: PathTimeoutError after the configured silence, and the prompt went out once."""
    from traceless_tools.client.private_client import PathTimeoutError

    posts = []

    def record(request):
        posts.append(request.url.path)
        return _stalling(with_head)(request, len(posts))

    config = ClientConfig(
        "http://issuer",
        "k",
        "http://relay",
        "http://log",
        b"\x00" * 32,
        (),
        "m",
        first_byte_timeout_s=0.3,
        idle_timeout_s=0.3,
    )
    client = AsyncPrivateClient(config, http=httpx.AsyncClient(transport=httpx.MockTransport(record)))

    async def candidates():
        return list(NODES)

    async def take():
        return Token(2, b"\x00" * 32, b"\x01" * 32, b"\x02" * 32, b"\x03" * 256)

    client._verified_candidates, client.wallet.take = candidates, take

    async def go():
        try:
            events = await client.request("/v1/completions", {"model": "m", "prompt": "p", "stream": True})
            async for _ in events:
                pass
        finally:
            await client.aclose()

    with pytest.raises(
        PathTimeoutError,
        match="nothing arrived for 0.3s while waiting for the " + ("next chunk" if with_head else "response head"),
    ):
        asyncio.run(asyncio.wait_for(go(), 10))
    assert len(posts) == 1


class _Shaped(httpx.AsyncByteStream):
    """A node's shaped stream: the answer's events, then padding chunks until its budget; `sent`
    counts the chunks the client pulled."""

    def __init__(self, chunks: list[bytes]):
        self.chunks, self.sent = chunks, 0

    async def __aiter__(self):
        for chunk in self.chunks:
            self.sent += 1
            yield chunk
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("leaves", ["closes", "is_cancelled"])
def test_a_stream_left_at_done_is_still_read_to_its_shaped_end(leaves):
    """The openai SDK stops reading at `[DONE]` and hangs up (the proxy's handler is cancelled);
    closing the upstream then would end the stream at the relay where the answer ended (its natural
    length), not where the node's padding ends. The client reads the rest, unread, so the hops see
    the whole shaped stream."""
    from traceless.privacy.bhttp.stream import ResponseStreamEncoder

    streams: list[_Shaped] = []

    def handler(request):
        _, context = SERVERS[0].decapsulate_chunked_request(request.content)
        enc, msg = context.encryptor(), ResponseStreamEncoder()
        chunks = [
            enc.seal_chunk(msg.head(200, ((b"content-type", b"text/event-stream"),))),
            enc.seal_chunk(msg.chunk(b'data: {"choices": []}\n\n')),
            enc.seal_chunk(msg.chunk(b"data: [DONE]\n\n")),
        ]
        chunks += [enc.seal_chunk(msg.chunk(b": padding\n\n")) for _ in range(8)]
        chunks.append(enc.seal_final(msg.end()))
        streams.append(_Shaped(chunks))
        return httpx.Response(200, headers={"content-type": "message/ohttp-chunked-res"}, stream=streams[-1])

    client = _client(handler)
    client._verified_candidates = lambda: asyncio.sleep(0, [NODES[0]])

    async def read_until_done(events):
        async for event in events:
            if event.startswith(b"data: [DONE]"):
                if leaves == "closes":
                    return  # what the SDK does
                await asyncio.sleep(60)  # then hangs up: the handler reading the stream is cancelled

    async def go():
        try:
            events = await client.request("/v1/completions", {"model": "m", "prompt": "p", "stream": True})
            reader = asyncio.ensure_future(read_until_done(events))
            await asyncio.sleep(0.05)
            if leaves == "is_cancelled":
                reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            await events.aclose()
            for _ in range(200):
                if streams[0].sent == len(streams[0].chunks):
                    break
                await asyncio.sleep(0.01)
        finally:
            await client.aclose()

    asyncio.run(asyncio.wait_for(go(), 10))
    assert streams[0].sent == len(streams[0].chunks)
