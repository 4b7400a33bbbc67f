"""The client's resend rule (issue 12, finding 5): a prompt is sent again, to another node, only when
the first send provably never left (the connection failed before the body was sent); after a 5xx or a
truncated stream the error is surfaced and nothing is resent."""
import asyncio

import httpx
import pytest

from traceless.client.node_verifier import VerifiedNode
from traceless.client.private_client import AsyncPrivateClient, ClientConfig, PrivateClientError
from traceless.privacy.ohttp.gateway import OhttpServer
from traceless.privacy.privacypass.wire import Token

SERVERS = [OhttpServer(key_id=1), OhttpServer(key_id=2)]
NODES = [VerifiedNode(f"node{i}", 1, s.key_config, b"\x00" * 32, f"kid{i}", 0.0) for i, s in enumerate(SERVERS)]


def _client(handler):
    config = ClientConfig("http://issuer", "k", "http://relay", "http://log", b"\x00" * 32, (), "m")
    client = AsyncPrivateClient(config, http=httpx.AsyncClient(transport=httpx.MockTransport(handler)))

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
    posts, go = _run(lambda request, n: httpx.Response(200, content=b"\x00" * 10,
                                                         headers={"content-type": "message/ohttp-res"}))
    with pytest.raises(PrivateClientError):
        asyncio.run(go())
    assert len(posts) == 1


def test_a_connection_that_never_opened_is_retried_on_another_node():
    def handler(request, n):
        if n == 1:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(503, json={"error": {"message": "busy"}})

    posts, go = _run(handler)
    with pytest.raises(PrivateClientError):
        asyncio.run(go())
    assert len(posts) == 2 and posts[0] != posts[1]  # the second send went to the other node


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
        return httpx.Response(200, headers={"content-type": "message/ohttp-chunked-res"},
                              stream=_Silent(first))

    return handler


@pytest.mark.parametrize("with_head", [False, True])
def test_a_silent_stream_fails_with_a_timeout_error_and_is_not_resent(with_head):
    """A node that stalls before its response head, or between chunks, does not hold the request
    forever: PathTimeoutError after the configured silence, and the prompt went out once."""
    from traceless.client.private_client import PathTimeoutError

    posts = []

    def record(request):
        posts.append(request.url.path)
        return _stalling(with_head)(request, len(posts))

    config = ClientConfig("http://issuer", "k", "http://relay", "http://log", b"\x00" * 32, (), "m",
                          first_byte_timeout_s=0.3, idle_timeout_s=0.3)
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

    with pytest.raises(PathTimeoutError, match="nothing arrived for 0.3s while waiting for the " +
                       ("next chunk" if with_head else "response head")):
        asyncio.run(asyncio.wait_for(go(), 10))
    assert len(posts) == 1
