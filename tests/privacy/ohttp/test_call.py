"""One call over OHTTP (privacy/ohttp/call.py): what the client, the audits, the benchmarks and the
tests all send, and how each reads the answer."""

from __future__ import annotations

import pytest

from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.bhttp.stream import ResponseStreamEncoder
from traceless.privacy.ohttp.call import AUTHORITY, JSON_FIELDS, encapsulate_call, encode_call, open_response
from traceless.privacy.ohttp.gateway import OhttpServer
from traceless.privacy.ohttp.media import OHTTP_CHUNKED_REQ, OHTTP_REQ
from traceless.privacy.shape import BUCKETS


def test_a_post_is_json_to_the_one_authority_padded_to_its_bucket():
    inner = encode_call(b"/v1/completions", b'{"prompt": "hi"}')
    assert len(inner) in BUCKETS
    req = bhttp.decode_request(inner)
    assert (req.method, req.scheme, req.authority, req.path) == (b"POST", b"https", AUTHORITY, b"/v1/completions")
    assert req.headers == JSON_FIELDS and req.content == b'{"prompt": "hi"}'
    unpadded = encode_call(b"/v1/completions", b'{"prompt": "hi"}', pad=False)
    assert inner.startswith(unpadded) and not inner[len(unpadded) :].strip(b"\0") and len(unpadded) < len(inner)


def test_a_get_has_no_fields_and_no_content():
    req = bhttp.decode_request(encode_call(b"/v1/models", None))
    assert (req.method, req.authority, req.headers, req.content) == (b"GET", AUTHORITY, (), b"")
    assert bhttp.decode_request(encode_call(b"/tokenize", b"{}", method=b"GET")).method == b"GET"


@pytest.mark.parametrize("status", [200, 400])
def test_whole_and_chunked_answers_open(status):
    server = OhttpServer()
    call = encapsulate_call(server.key_config, b"/v1/completions", b"{}", stream=False)
    assert call.media_type == OHTTP_REQ and not call.chunked
    inner, ctx = server.decapsulate_request(call.body)
    assert bhttp.decode_request(inner).path == b"/v1/completions"
    got = open_response(call, ctx.encapsulate(bhttp.encode_response(bhttp.Response(status, (), b'{"a": 1}'))))
    assert (got.status, got.content) == (status, b'{"a": 1}')

    call = encapsulate_call(server.key_config, b"/v1/completions", b"{}", stream=True)
    assert call.media_type == OHTTP_CHUNKED_REQ and call.chunked
    inner, chunked_ctx = server.decapsulate_chunked_request(call.body)
    assert bhttp.decode_request(inner).content == b"{}"
    enc, msg = chunked_ctx.encryptor(), ResponseStreamEncoder()
    body = (
        enc.seal_chunk(msg.head(status, ()))
        + enc.seal_chunk(msg.chunk(b"data: 1\n\n"))
        + enc.seal_final(msg.chunk(b"data: 2\n\n") + msg.end())
    )
    got = open_response(call, body)
    assert (got.status, got.content) == (status, b"data: 1\n\ndata: 2\n\n")
