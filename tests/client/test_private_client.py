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
