import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vectors import shared_vectors
from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.bhttp.errors import BhttpError
from traceless.privacy.bhttp.stream import ResponseHead, ResponseStreamDecoder, ResponseStreamEncoder


def encode(status, headers, chunks):
    enc = ResponseStreamEncoder()
    return enc.head(status, headers) + b"".join(enc.chunk(c) for c in chunks) + enc.end()


def decode_all(data: bytes, cut_points=()):
    dec = ResponseStreamDecoder()
    out, last = [], 0
    for cut in sorted(cut_points) + [len(data)]:
        out += dec.feed(data[last:cut])
        last = cut
    assert dec.complete
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=300), max_size=8), st.lists(st.integers(0, 4000), max_size=6))
def test_round_trip_at_any_split(chunks, cuts):
    data = encode(200, ((b"content-type", b"text/event-stream"),), chunks)
    out = decode_all(data, [c for c in cuts if c < len(data)])
    assert out[0] == ResponseHead(200, ((b"content-type", b"text/event-stream"),))
    assert b"".join(out[1:]) == b"".join(chunks)
    assert all(piece for piece in out[1:])


def test_the_standard_decoder_reads_what_we_stream():
    data = encode(200, ((b"content-type", b"text/event-stream"), (b"x-a", b"1")), [b"data: one\n\n", b"data: two\n\n"])
    msg = bhttp.decode_response(data)
    assert msg.status == 200 and msg.content == b"data: one\n\ndata: two\n\n"


def test_rfc9292_indeterminate_example_decodes_incrementally():
    """RFC 9292 section 5's indeterminate-length response (with a 102 interim response), fed a few
    bytes at a time, gives what the whole-message decoder gives."""
    raw = bytes.fromhex(
        shared_vectors("bhttp/rfc9292-section5-examples.json")["examples"]["indefinite_length_response_with_interim"][
            "hex"
        ]
    )
    whole = bhttp.decode_response(raw)
    out = decode_all(raw, range(1, len(raw), 3))
    assert out[0].status == whole.status == 200
    assert out[0].headers == tuple(whole.headers)
    assert b"".join(out[1:]) == whole.content and whole.content


@pytest.mark.parametrize("bad", [b"\x01\x40\xc8\x00\x00", b"\x03\x41\xf4\x00\x00\x00", b"\x03\x40\xc8\x05ab"])
def test_malformed_streams_are_rejected(bad):
    dec = ResponseStreamDecoder()
    with pytest.raises(BhttpError):
        dec.feed(bad)
        dec.feed(b"\xff" * 20)
        if not dec.complete:
            raise BhttpError("incomplete")


def test_encoder_order_is_enforced():
    enc = ResponseStreamEncoder()
    with pytest.raises(BhttpError):
        enc.chunk(b"x")
    enc.head(200)
    assert enc.chunk(b"") == b""
    enc.end()
    with pytest.raises(BhttpError):
        enc.end()


@pytest.mark.parametrize("framing", ["known", "indeterminate"])
def test_decode_request_buffer_keeps_content_wipeable(framing):
    from tests.vectors import shared_vectors as sv

    key = "known_length_request" if framing == "known" else "indefinite_length_request"
    raw = bytes.fromhex(sv("bhttp/rfc9292-section5-examples.json")["examples"][key]["hex"])
    req = bhttp.Request(
        b"POST",
        b"https",
        b"node",
        b"/v1/chat/completions",
        ((b"content-type", b"application/json"),),
        b'{"secret": "canary"}',
    )
    for data in (raw, bhttp.encode_request(req)):
        whole = bhttp.decode_request(data)
        buf = bytearray(data)
        head, content = bhttp.decode_request_buffer(buf)
        assert isinstance(content, bytearray) and bytes(content) == whole.content
        assert (head.method, head.path, head.headers) == (whole.method, whole.path, tuple(whole.headers))
        assert head.content == b""
        buf[:] = bytes(len(buf))  # the input can be wiped (no view holds it)
        buf.clear()
    with pytest.raises(BhttpError):
        bhttp.decode_request_buffer(bytearray(bhttp.encode_request(req))[:-3])


@pytest.mark.parametrize("total", [16, 63, 64, 4096, 20_000])
def test_informational_padding_has_its_exact_length_and_is_skipped(total):
    """Bytes that leave before the final head is known: 1xx responses of padding, exactly `total`
    bytes each; both decoders yield what they would without them."""
    enc = ResponseStreamEncoder()
    pads = [enc.informational(total), enc.informational(total)]
    assert [len(p) for p in pads] == [total, total] and not enc.head_sent
    head = enc.head(200, ((b"content-type", b"text/event-stream"),))
    data = b"".join(pads) + head + enc.chunk(b"data: x\n\n") + enc.end()
    out = decode_all(data, [1, total - 3, total + 5])
    assert out == [ResponseHead(200, ((b"content-type", b"text/event-stream"),)), b"data: x\n\n"]
    msg = bhttp.decode_response(data)
    assert msg.status == 200 and msg.content == b"data: x\n\n"
    with pytest.raises(BhttpError):
        enc.informational(total)  # not after the head


def test_informational_padding_refuses_a_length_it_cannot_have():
    with pytest.raises(BhttpError):
        ResponseStreamEncoder().informational(10)
