"""PrivateClient: an OpenAI call over the private path (docs/private-path.md).

    tokens      issuer /token-request-batch (API key)      -> Privacy Pass type-2 tokens, unlinkable
    candidates  relay -> gateway /pcc/v1/nodes              -> K nodes, capacity-weighted at random
    verify      attestation (trusted attester key, expiry, OHTTP key binding)
                + measurement included in the transparency log (signed tree head, consistent
                  with the last one seen)                    -> refuse anything else, before sending
    request     OHTTP (chunked when streaming) via relay -> gateway -> node, PrivateToken header
    retry       once, on the next verified candidate, if the node fails before answering

The client also watches which nodes it is offered and warns when one gets implausibly more than
its capacity share (a client-side check that routing is not aimed at it).
"""
from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

import httpx

from traceless.client.node_verifier import NodeVerifier, VerifiedNode
from traceless.client.routing_watch import RoutingWatch
from traceless.client.tokens import TokenWallet
from traceless.events import emit
from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.bhttp.stream import ResponseStreamDecoder
from traceless.privacy.ohttp.chunked import split_chunks
from traceless.privacy.ohttp.errors import OHTTP_ERRORS
from traceless.privacy.ohttp.gateway import encapsulate_chunked_request, encapsulate_request
from traceless.privacy.privacypass.http import format_authorization


@dataclass(frozen=True, slots=True)
class ClientConfig:
    issuer_url: str
    api_key: str
    relay_url: str
    log_url: str
    log_public_key: bytes  # pinned Ed25519 key of the transparency log
    attester_keys: tuple[bytes, ...]  # Ed25519 keys trusted to sign node attestations
    model: str
    origin_name: str = "traceless"
    candidates: int = 3
    token_batch: int = 16
    timeout_s: float = 300.0


class PrivateClientError(Exception):
    """The private path could not complete the call (no verifiable node, transport failure)."""


class UpstreamError(PrivateClientError):
    """The node answered with an OpenAI-style error (status and JSON body, already decrypted)."""

    def __init__(self, status: int, body: dict):
        super().__init__(f"node answered HTTP {status}")
        self.status, self.body = status, body


class AsyncPrivateClient:
    def __init__(self, config: ClientConfig, http: httpx.AsyncClient | None = None):
        self.config = config
        self._http = http or httpx.AsyncClient(timeout=config.timeout_s)
        self._relay = config.relay_url.rstrip("/")
        self.wallet = TokenWallet(config, self._http)
        self.verifier = NodeVerifier(config)
        self.routing = RoutingWatch()

    async def aclose(self) -> None:
        await self._http.aclose()
        self.verifier.close()

    async def _candidates(self) -> list[VerifiedNode]:
        r = await self._http.get(self._relay + "/pcc/v1/nodes", params={"model": self.config.model,
                                                                         "k": self.config.candidates})
        if r.status_code != 200:
            raise PrivateClientError(f"no candidate nodes (gateway answered HTTP {r.status_code})")
        offered = r.json().get("nodes", [])
        verified = await asyncio.to_thread(self.verifier.verify_all, offered)
        if offered:
            warning = self.routing.observe(offered[0], offered)
            if warning:
                warnings.warn(warning, RuntimeWarning, stacklevel=3)
        if not verified:
            raise PrivateClientError("no offered node could be verified; nothing was sent")
        return verified

    def _encapsulate(self, node: VerifiedNode, path: bytes, body: bytes, stream: bool):
        inner = bhttp.encode_request(bhttp.Request(b"POST", b"https", b"traceless", path,
                                                   ((b"content-type", b"application/json"),), body))
        if stream:
            enc, chunked_ctx = encapsulate_chunked_request(node.key_config, split_chunks(inner))
            return enc, chunked_ctx, "message/ohttp-chunked-req"
        enc, ctx = encapsulate_request(node.key_config, inner)
        return enc, ctx, "message/ohttp-req"

    async def request(self, path: str, body: dict) -> dict | AsyncIterator[bytes]:
        """POST an OpenAI call (`/v1/chat/completions` or `/v1/completions`) through the private
        path: the response dict, or an async iterator of SSE event bytes when body asks to stream."""
        stream = body.get("stream") is True
        payload = json.dumps(body).encode()
        candidates = asyncio.create_task(self._candidates())  # overlaps with taking a token
        try:
            token = await self.wallet.take()
        finally:
            nodes = await candidates
        last: Exception | None = None
        attempts = 0
        for node in nodes[:2]:  # retry once on another candidate
            for _ in range(2):  # and once with a fresh challenge if the gateway rejected the token
                attempts += 1
                try:
                    result = await self._send(node, path.encode(), payload, stream, token)
                    emit("client.request", ok=True, attempts=attempts, stream=stream)
                    return result
                except _TokenRejected:
                    self.wallet.invalidate()
                    token = await self.wallet.take()
                except (httpx.TransportError, _NodeFailed) as exc:
                    last = exc
                    token = await self.wallet.take()  # that token may have been spent
                    break
        emit("client.request", ok=False, attempts=attempts, stream=stream)
        raise PrivateClientError("the chosen nodes failed to answer") from last

    async def _send(self, node: VerifiedNode, path: bytes, payload: bytes, stream: bool, token):
        enc, ctx, kind = self._encapsulate(node, path, payload, stream)
        headers = {"content-type": kind, "authorization": format_authorization(token)}
        url = f"{self._relay}/pcc/v1/ohttp/{node.node_id}"
        if not stream:
            r = await self._http.post(url, content=enc, headers=headers)
            if r.status_code >= 500 or r.headers.get("content-type", "").split(";")[0] != "message/ohttp-res":
                _raise_outer(r.status_code, r.content)
            try:
                msg = bhttp.decode_response(ctx.decapsulate(r.content))
            except OHTTP_ERRORS:
                raise PrivateClientError("the response failed to decrypt") from None
            data = json.loads(msg.content)
            if msg.status != 200:
                raise UpstreamError(msg.status, data)
            return data
        return await self._open_stream(url, enc, headers, ctx)

    async def _open_stream(self, url: str, enc: bytes, headers: dict, ctx) -> AsyncIterator[bytes]:
        req = self._http.build_request("POST", url, content=enc, headers=headers)
        r = await self._http.send(req, stream=True)
        if r.status_code != 200 or r.headers.get("content-type", "").split(";")[0] != "message/ohttp-chunked-res":
            body = await r.aread()
            await r.aclose()
            _raise_outer(r.status_code, body)
        decryptor, parser = ctx.decryptor(), ResponseStreamDecoder()
        it = r.aiter_raw()
        head, first = await _read_head(it, decryptor, parser, r)
        if head.status != 200:
            rest = first + b"".join([c async for c in _events(it, decryptor, parser, r)])
            raise UpstreamError(head.status, json.loads(rest or b"{}"))
        return _stream_with(first, _events(it, decryptor, parser, r))


class _NodeFailed(Exception):
    pass


class _TokenRejected(Exception):
    pass


def _raise_outer(status: int, body: bytes) -> None:
    """An error outside the encryption (gateway, relay, or a node that could not decrypt)."""
    if status >= 500:
        raise _NodeFailed(f"upstream answered HTTP {status}")
    if status == 401:  # the gateway's challenge rotated under the wallet's tokens
        raise _TokenRejected()
    try:
        data = json.loads(body)
    except ValueError:
        data = {"error": {"message": f"upstream answered HTTP {status}", "type": "upstream_error"}}
    raise UpstreamError(status, data)


async def _read_head(it, decryptor, parser, response):
    """Decrypt until the inner response head; returns (head, content already received)."""
    head, got = None, []
    try:
        async for raw in it:
            for plain in decryptor.feed(raw):
                for item in parser.feed(plain):
                    if head is None:
                        head = item
                    else:
                        got.append(item)
            if head is not None:
                return head, b"".join(got)
    except OHTTP_ERRORS:
        await response.aclose()
        raise PrivateClientError("the response stream failed to decrypt") from None
    except httpx.HTTPError:
        pass  # the node failed before answering: retry elsewhere
    await response.aclose()
    raise _NodeFailed("the stream ended before the response head")


async def _events(it, decryptor, parser, response) -> AsyncGenerator[bytes, None]:
    try:
        async for raw in it:
            for plain in decryptor.feed(raw):
                for item in parser.feed(plain):
                    yield item
        for item in parser.feed(decryptor.finish()):  # the final chunk (raises if the stream was cut before it)
            yield item
        if not parser.complete:
            raise PrivateClientError("the response stream was truncated")
    except OHTTP_ERRORS:
        raise PrivateClientError("the response stream failed to decrypt") from None
    except httpx.HTTPError:
        raise PrivateClientError("the response stream broke off (the node or a hop failed)") from None
    finally:
        parser.wipe()
        await response.aclose()


async def _stream_with(first: bytes, rest: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    try:
        if first:
            yield first
        async for chunk in rest:
            yield chunk
    finally:
        await rest.aclose()


class PrivateClient:
    """Synchronous facade over AsyncPrivateClient (runs its own event loop thread)."""

    def __init__(self, config: ClientConfig):
        import threading

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="private-client")
        self._thread.start()
        self._client = self._run(_make_async(config))

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def chat(self, body: dict):
        return self._wrap(self._run(self._client.request("/v1/chat/completions", body)))

    def completions(self, body: dict):
        return self._wrap(self._run(self._client.request("/v1/completions", body)))

    def _wrap(self, result):
        if isinstance(result, dict):
            return result

        def gen():
            try:
                while True:
                    try:
                        yield self._run(result.__anext__())
                    except StopAsyncIteration:
                        return
            finally:
                self._run(result.aclose())

        return gen()

    @property
    def routing(self) -> RoutingWatch:
        return self._client.routing

    def close(self) -> None:
        self._run(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


async def _make_async(config: ClientConfig) -> AsyncPrivateClient:
    return AsyncPrivateClient(config)
