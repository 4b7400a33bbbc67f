"""Binary HTTP (RFC 9292): section 5 examples, round trips, truncation and malformed input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vectors import shared_vectors
from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.bhttp.errors import BhttpError
from traceless.privacy.bhttp.message import InformationalResponse, Request, Response

EXAMPLES = shared_vectors("bhttp/rfc9292-section5-examples.json")["examples"]
REQUEST_EXAMPLES = {k: v for k, v in EXAMPLES.items() if v["decoded"]["framing"] in (0, 2)}
RESPONSE_EXAMPLES = {k: v for k, v in EXAMPLES.items() if v["decoded"]["framing"] in (1, 3)}


def _l1(s: str) -> bytes:
    return s.encode("latin-1")


def _fields(pairs: list) -> tuple:
    return tuple((_l1(n), _l1(v)) for n, v in pairs)


def _expected_request(d: dict) -> Request:
    return Request(
        _l1(d["method"]),
        _l1(d["scheme"]),
        _l1(d["authority"]),
        _l1(d["path"]),
        _fields(d["headers"]),
        _l1(d["content"]),
        _fields(d["trailers"]),
    )


def _expected_response(d: dict) -> Response:
    interim = tuple(InformationalResponse(s, _fields(h)) for s, h in d["informational"])
    return Response(d["status"], _fields(d["headers"]), _l1(d["content"]), _fields(d["trailers"]), interim)


def test_all_examples_are_exercised() -> None:
    assert len(EXAMPLES) == 6
    assert len(REQUEST_EXAMPLES) + len(RESPONSE_EXAMPLES) == len(EXAMPLES)


@pytest.mark.parametrize("name", sorted(REQUEST_EXAMPLES))
def test_request_examples_decode(name: str) -> None:
    ex = REQUEST_EXAMPLES[name]
    assert bhttp.decode_request(bytes.fromhex(ex["hex"])) == _expected_request(ex["decoded"])
    with pytest.raises(BhttpError):  # a request is not a response
        bhttp.decode_response(bytes.fromhex(ex["hex"]))


@pytest.mark.parametrize("name", sorted(RESPONSE_EXAMPLES))
def test_response_examples_decode(name: str) -> None:
    ex = RESPONSE_EXAMPLES[name]
    assert bhttp.decode_response(bytes.fromhex(ex["hex"])) == _expected_response(ex["decoded"])
    with pytest.raises(BhttpError):
        bhttp.decode_request(bytes.fromhex(ex["hex"]))


# Known-length examples and whether their encoding omits trailing empty sections (§3.8).
KNOWN_LENGTH_TRUNCATION = {
    "known_length_request": False,  # RFC 9292 §5.1 keeps the empty content and trailers
    "known_length_response_chunked_example": True,  # nothing empty at the end: no difference
    "ohttp_rfc9458_request_truncated": True,
    "ohttp_rfc9458_response_truncated": True,
}


def test_known_length_table_covers_every_known_length_example() -> None:
    known = {k for k, v in EXAMPLES.items() if v["decoded"]["framing"] in (0, 1)}
    assert set(KNOWN_LENGTH_TRUNCATION) == known


@pytest.mark.parametrize("name", sorted(KNOWN_LENGTH_TRUNCATION))
def test_known_length_examples_reencode_byte_for_byte(name: str) -> None:
    d = EXAMPLES[name]["decoded"]
    options = {"truncate": KNOWN_LENGTH_TRUNCATION[name], "padding": d["padding"]}
    if d["framing"] == 0:
        out = bhttp.encode_request(_expected_request(d), **options)
    else:
        out = bhttp.encode_response(_expected_response(d), **options)
    assert out == bytes.fromhex(EXAMPLES[name]["hex"])


def test_padding_and_allowed_truncation_do_not_change_meaning() -> None:
    ex = EXAMPLES["indefinite_length_request"]
    data = bytes.fromhex(ex["hex"])
    want = _expected_request(ex["decoded"])
    # RFC 9292 §5.1: up to 12 bytes (10 padding + 2 empty sections) can go without effect.
    for cut in range(0, 13):
        assert bhttp.decode_request(data[: len(data) - cut]) == want
    with pytest.raises(BhttpError):  # 13 bytes cuts into the header section's terminator
        bhttp.decode_request(data[:-13])


def test_non_zero_padding_is_invalid() -> None:
    data = bytes.fromhex(EXAMPLES["known_length_request"]["hex"])
    assert bhttp.decode_request(data + bytes(5)) == bhttp.decode_request(data)
    with pytest.raises(BhttpError, match="padding"):
        bhttp.decode_request(data + b"\x00\x01")


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_truncation_is_a_message_or_a_typed_error(name: str) -> None:
    data = bytes.fromhex(EXAMPLES[name]["hex"])
    is_request = EXAMPLES[name]["decoded"]["framing"] in (0, 2)
    decode = bhttp.decode_request if is_request else bhttp.decode_response
    full = decode(data)
    decoded_prefixes = 0
    for n in range(len(data)):
        try:
            msg = decode(data[:n])
        except BhttpError:
            continue
        decoded_prefixes += 1
        # A prefix that decodes lost only empty parts (or padding): same control data.
        assert getattr(msg, "method", None) == getattr(full, "method", None)
        assert getattr(msg, "status", None) == getattr(full, "status", None)
    assert decoded_prefixes < len(data)


@pytest.mark.parametrize(
    "hex_data",
    [
        "",  # empty
        "04",  # framing indicator 4 is undefined
        "00",  # no control data
        "000347455405",  # truncated scheme
        "0000000000",  # empty method
        "0003474554056874747073000a2f68656c6c6f2e74787409",  # header section length beyond end
        "0003474554000000" + "04" + "00" + "01" + "61",  # zero-length field name in a section
        "0003474554000000" + "03" + "01" + "41" + "00",  # uppercase field name
        "0003474554000000" + "0a" + "07" + "3a6d6574686f64" + "01" + "78",  # :method as a field
        "0003474554000000" + "04" + "01" + "61" + "01" + "0a",  # LF in a field value
        "0003474554000000" + "04" + "01" + "61" + "01" + "20",  # value is only whitespace
        "0003474554000000" + "00" + "05" + "6869",  # content shorter than its length
        "0203474554000000" + "01" + "61" + "00",  # indeterminate: missing header terminator
        "0203474554000000" + "00" + "03" + "616263",  # indeterminate: no content terminator
        "0140c8" + "8000",  # truncated 4-byte varint
        "0140c7",  # status 199 has no field section after it, then nothing
        "014064",  # status 100 with nothing after it
        "0142bc",  # status 700
        "01405a",  # status 90
        "0003474554" + "ff",  # 8-byte varint length with 0 bytes
        "000320455400000000",  # space inside the method
    ],
)
def test_malformed_input_is_a_typed_error(hex_data: str) -> None:
    data = bytes.fromhex(hex_data)
    with pytest.raises(BhttpError):
        (bhttp.decode_response if data[:1] in (b"\x01", b"\x03") else bhttp.decode_request)(data)


def test_constructor_validates_and_repr_redacts() -> None:
    with pytest.raises(BhttpError):
        Request(b"GET", b"https", b"h", b"/", headers=((b"Host", b"x"),))
    with pytest.raises(BhttpError):
        Request("GET", b"https", b"h", b"/")  # type: ignore[arg-type]
    with pytest.raises(BhttpError):
        Response(200, headers=((b"a", 3),))  # type: ignore[arg-type]
    with pytest.raises(BhttpError):
        Response(200, headers=((b"x", b"1"), (b":custom", b"1")))  # pseudo after regular
    assert Response(200, headers=((b":custom", b"1"), (b"x", b"1"))).headers[0][0] == b":custom"
    req = Request(b"POST", b"https", b"secret.example", b"/secret-path", content=b"secret prompt")
    assert "secret" not in repr(req) and "POST" in repr(req)
    assert "secret" not in repr(Response(200, content=b"secret answer"))


# ---- properties -------------------------------------------------------------------------------

_token = st.binary(min_size=1, max_size=8).map(lambda b: bytes(0x61 + x % 26 for x in b))
_visible = st.binary(max_size=24).map(lambda b: bytes(0x21 + x % 94 for x in b))
_value = st.binary(max_size=40).map(lambda b: bytes(0x21 + x % 94 for x in b))
_fields_st = st.lists(st.tuples(_token, _value), max_size=5).map(tuple)


@st.composite
def requests(draw) -> Request:
    return Request(
        draw(_token.map(bytes.upper)),
        draw(_visible),
        draw(_visible),
        draw(_visible),
        draw(_fields_st),
        draw(st.binary(max_size=300)),
        draw(_fields_st),
    )


@st.composite
def responses(draw) -> Response:
    interim_st = st.builds(InformationalResponse, st.integers(100, 199), _fields_st)
    interim = draw(st.lists(interim_st, max_size=3))
    return Response(
        draw(st.integers(200, 599)),
        draw(_fields_st),
        draw(st.binary(max_size=300)),
        draw(_fields_st),
        tuple(interim),
    )


@settings(max_examples=150, deadline=None)
@given(req=requests(), truncate=st.booleans(), padding=st.integers(0, 20))
def test_request_round_trip(req: Request, truncate: bool, padding: int) -> None:
    encoded = bhttp.encode_request(req, truncate=truncate, padding=padding)
    assert bhttp.decode_request(encoded) == req


@settings(max_examples=150, deadline=None)
@given(resp=responses(), truncate=st.booleans(), padding=st.integers(0, 20))
def test_response_round_trip(resp: Response, truncate: bool, padding: int) -> None:
    encoded = bhttp.encode_response(resp, truncate=truncate, padding=padding)
    assert bhttp.decode_response(encoded) == resp


@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_never_crash_the_decoder(data: bytes) -> None:
    for decode in (bhttp.decode_request, bhttp.decode_response):
        try:
            decode(data)
        except BhttpError:
            pass
