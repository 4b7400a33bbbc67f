"""One call over OHTTP, as the client sends it: an HTTP request encoded as binary HTTP (RFC 9292),
zero-padded to its size bucket, encapsulated (RFC 9458; chunked when the answer streams), and the
answer decapsulated and decoded.

Everything that calls a node through OHTTP (the client, the audits that measure what it sends, the
benchmarks, the tests) encodes here, so an attack harness sees exactly the client's bytes:

    POST  https://traceless{path}   content-type: application/json   {JSON body}   [zero padding]
    GET   https://traceless{path}   (no fields, no content)                        [zero padding]

The authority is fixed: the node serves one origin, and a per-sender authority would be one more
thing that tells senders apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.bhttp.errors import BhttpError
from traceless.privacy.bhttp.stream import ResponseHead, ResponseStreamDecoder
from traceless.privacy.ohttp.chunked import ChunkedClientResponse, encapsulate_chunked_request, split_chunks
from traceless.privacy.ohttp.gateway import ClientResponse, encapsulate_request
from traceless.privacy.ohttp.keys import KeyConfig
from traceless.privacy.ohttp.media import OHTTP_CHUNKED_REQ, OHTTP_REQ
from traceless.privacy.shape import bucket_padding

AUTHORITY = b"traceless"
JSON_FIELDS = ((b"content-type", b"application/json"),)


def encode_call(path: bytes, body: bytes | None, *, pad: bool = True, method: bytes | None = None) -> bytes:
    """The binary HTTP request of one call: a POST of JSON `body`, or with `body` None a GET.
    `method` overrides the verb (a test of a wrong one); `pad`: zero padding to the size bucket, so
    the prompt's length is hidden (RFC 9292 §3.8)."""
    if body is None:
        inner = bhttp.encode_request(bhttp.Request(method or b"GET", b"https", AUTHORITY, path, (), b""))
    else:
        inner = bhttp.encode_request(bhttp.Request(method or b"POST", b"https", AUTHORITY, path, JSON_FIELDS, body))
    return inner + bytes(bucket_padding(len(inner))) if pad else inner


@dataclass(frozen=True, slots=True, repr=False)
class OhttpCall:
    """One encapsulated call: the outer body and its media type, and what reads its answer."""

    body: bytes
    media_type: str
    context: ClientResponse | ChunkedClientResponse

    @property
    def chunked(self) -> bool:
        return isinstance(self.context, ChunkedClientResponse)


def encapsulate_call(
    config: KeyConfig, path: bytes, body: bytes | None, *, stream: bool, pad: bool = True, method: bytes | None = None
) -> OhttpCall:
    """`encode_call` encapsulated to `config`: chunked (message/ohttp-chunked-req) when `stream`."""
    inner = encode_call(path, body, pad=pad, method=method)
    if stream:
        enc, chunked_ctx = encapsulate_chunked_request(config, split_chunks(inner))
        return OhttpCall(enc, OHTTP_CHUNKED_REQ, chunked_ctx)
    enc, ctx = encapsulate_request(config, inner)
    return OhttpCall(enc, OHTTP_REQ, ctx)


@dataclass(frozen=True, slots=True, repr=False)
class CallResponse:
    """A whole inner response: its head and its content (for a stream, the SSE bytes as sent,
    padding included: privacy/shape.py split_sse reads events out of them)."""

    head: ResponseHead
    content: bytes

    @property
    def status(self) -> int:
        return self.head.status


def open_response(call: OhttpCall, outer_body: bytes) -> CallResponse:
    """Decapsulate and decode the whole outer response body of `call` (raises the privacy errors on
    a response that does not decrypt or decode)."""
    if isinstance(call.context, ClientResponse):
        msg = bhttp.decode_response(call.context.decapsulate(outer_body))
        return CallResponse(ResponseHead(msg.status, msg.headers), msg.content)
    decryptor, parser = call.context.decryptor(), ResponseStreamDecoder()
    items = [i for plain in [*decryptor.feed(outer_body), decryptor.finish()] for i in parser.feed(plain)]
    if not items or not isinstance(items[0], ResponseHead):
        raise BhttpError("the chunked response has no head")
    return CallResponse(items[0], b"".join(items[1:]))
