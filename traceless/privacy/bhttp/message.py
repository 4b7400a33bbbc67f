"""Binary HTTP messages (RFC 9292): known-length encoding, known- and indeterminate-length
decoding of requests and responses.

    §3.1 known-length messages        encode_request / encode_response, and decoding
    §3.2 indeterminate-length         decoding only (for interoperability)
    §3.3 framing indicator            0/1 known-length request/response, 2/3 indeterminate
    §3.4-§3.6 control data, fields    validated in bhttp_fields (RFC 9113 §8.2.1 rules)
    §3.5.1 informational responses    decoded (and encoded) before the final status
    §3.8 padding and truncation       trailing empty sections may be omitted; zero padding

Decoding is strict: any truncation at a point §3.8 does not allow, non-zero padding, an
out-of-range status or an invalid field raises `BhttpError`; never IndexError, never a partial
message. Messages hold user content, so their repr shows only sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from traceless.privacy.bhttp.errors import BhttpError
from traceless.privacy.bhttp.fields import (
    FieldLine,
    as_bytes,
    check_final_status,
    check_informational_status,
    check_method,
    check_target_part,
    normalize_fields,
)
from traceless.privacy.wire import ByteReader, encode_varint

KNOWN_LENGTH_REQUEST = 0
KNOWN_LENGTH_RESPONSE = 1
INDETERMINATE_LENGTH_REQUEST = 2
INDETERMINATE_LENGTH_RESPONSE = 3


@dataclass(frozen=True, slots=True, repr=False)
class Request:
    """A request: control data (§3.4), header fields, content and trailer fields."""

    method: bytes
    scheme: bytes
    authority: bytes
    path: bytes
    headers: tuple[FieldLine, ...] = ()
    content: bytes = b""
    trailers: tuple[FieldLine, ...] = ()

    def __post_init__(self) -> None:
        for name in ("method", "scheme", "authority", "path", "content"):
            object.__setattr__(self, name, as_bytes(getattr(self, name), name))
        check_method(self.method)
        for name in ("scheme", "authority", "path"):
            check_target_part(getattr(self, name), name)
        object.__setattr__(self, "headers", normalize_fields(self.headers, "header"))
        object.__setattr__(self, "trailers", normalize_fields(self.trailers, "trailer"))

    def __repr__(self) -> str:
        return (
            f"Request(method={self.method!r}, <redacted: path {len(self.path)} B, "
            f"{len(self.headers)} headers, content {len(self.content)} B, "
            f"{len(self.trailers)} trailers>)"
        )


@dataclass(frozen=True, slots=True)
class InformationalResponse:
    """An interim 1xx response and its header fields (§3.5.1)."""

    status: int
    headers: tuple[FieldLine, ...] = ()

    def __post_init__(self) -> None:
        check_informational_status(self.status)
        object.__setattr__(self, "headers", normalize_fields(self.headers, "informational header"))

    def __repr__(self) -> str:
        return f"InformationalResponse(status={self.status}, <{len(self.headers)} headers>)"


@dataclass(frozen=True, slots=True, repr=False)
class Response:
    """A final response (§3.5), optionally preceded by informational responses."""

    status: int
    headers: tuple[FieldLine, ...] = ()
    content: bytes = b""
    trailers: tuple[FieldLine, ...] = ()
    informational: tuple[InformationalResponse, ...] = ()

    def __post_init__(self) -> None:
        check_final_status(self.status)
        object.__setattr__(self, "content", as_bytes(self.content, "content"))
        object.__setattr__(self, "headers", normalize_fields(self.headers, "header"))
        object.__setattr__(self, "trailers", normalize_fields(self.trailers, "trailer"))
        interim = tuple(self.informational)
        if not all(isinstance(i, InformationalResponse) for i in interim):
            raise BhttpError("informational must hold InformationalResponse values")
        object.__setattr__(self, "informational", interim)

    def __repr__(self) -> str:
        return (
            f"Response(status={self.status}, <redacted: {len(self.informational)} informational, "
            f"{len(self.headers)} headers, content {len(self.content)} B, "
            f"{len(self.trailers)} trailers>)"
        )


# ---- encoding (known-length, §3.1) ------------------------------------------------------------


def _length_prefixed(value: bytes) -> bytes:
    return encode_varint(len(value)) + value


def _field_section(fields: tuple[FieldLine, ...]) -> bytes:
    lines = b"".join(_length_prefixed(name) + _length_prefixed(value) for name, value in fields)
    return _length_prefixed(lines)


def _finish(head: bytes, tail: list[bytes], truncate: bool, padding: int) -> bytes:
    """Join control data and [headers, content, trailers]; §3.8 allows dropping empty tails."""
    if padding < 0:
        raise BhttpError("padding must be >= 0")
    if truncate:
        while tail and tail[-1] == b"\x00":  # an empty section encodes as a single zero length
            tail.pop()
    return head + b"".join(tail) + bytes(padding)


def encode_request(request: Request, *, truncate: bool = True, padding: int = 0) -> bytes:
    """Known-length encoding. `truncate` omits trailing empty sections; `padding` adds zeros."""
    control_data = (request.method, request.scheme, request.authority, request.path)
    head = encode_varint(KNOWN_LENGTH_REQUEST) + b"".join(map(_length_prefixed, control_data))
    tail = [
        _field_section(request.headers),
        _length_prefixed(request.content),
        _field_section(request.trailers),
    ]
    return _finish(head, tail, truncate, padding)


def encode_response(response: Response, *, truncate: bool = True, padding: int = 0) -> bytes:
    """Known-length encoding, informational responses first. Options as for encode_request."""
    head = encode_varint(KNOWN_LENGTH_RESPONSE) + b"".join(
        encode_varint(i.status) + _field_section(i.headers) for i in response.informational
    )
    head += encode_varint(response.status)
    tail = [
        _field_section(response.headers),
        _length_prefixed(response.content),
        _field_section(response.trailers),
    ]
    return _finish(head, tail, truncate, padding)


# ---- decoding (§3.1, §3.2) --------------------------------------------------------------------


def _read_field_line(r: ByteReader, what: str) -> FieldLine:
    name = r.read_length_prefixed(f"{what} field name")
    if not name:
        raise BhttpError(f"{what} field name is empty")
    return name, r.read_length_prefixed(f"{what} field value")


def _read_field_section(r: ByteReader, known_length: bool, what: str) -> list[FieldLine]:
    lines: list[FieldLine] = []
    if known_length:
        section = ByteReader(r.read_length_prefixed(f"{what} section"), BhttpError)
        while not section.at_end():
            lines.append(_read_field_line(section, what))
        return lines
    while True:  # indeterminate: field lines until a zero Content Terminator
        name_length = r.read_varint(f"{what} field name length")
        if name_length == 0:
            return lines
        name = r.read(name_length, f"{what} field name")
        lines.append((name, r.read_length_prefixed(f"{what} field value")))


def _read_content(r: ByteReader, known_length: bool) -> bytes:
    if known_length:
        return r.read_length_prefixed("content")
    chunks: list[bytes] = []
    while (length := r.read_varint("content chunk length")) != 0:
        chunks.append(r.read(length, "content chunk"))
    return b"".join(chunks)


def _read_body(r: ByteReader, known_length: bool) -> dict:
    """Header section, content, trailer section and padding; each may be truncated away."""
    body: dict = {}
    if not r.at_end():
        body["headers"] = _read_field_section(r, known_length, "header")
    if not r.at_end():
        body["content"] = _read_content(r, known_length)
    if not r.at_end():
        body["trailers"] = _read_field_section(r, known_length, "trailer")
    if any(r.read_rest()):
        raise BhttpError("non-zero padding")
    return body


def _read_framing(r: ByteReader, known: int, indeterminate: int, what: str) -> bool:
    framing = r.read_varint("framing indicator")
    if framing not in (known, indeterminate):
        raise BhttpError(f"framing indicator {framing} is not a {what}")
    return framing == known


def _read_control_data(r: ByteReader) -> tuple[bytes, bytes, bytes, bytes]:
    """Method, scheme, authority and path (§3.4), each length-prefixed."""
    return (
        r.read_length_prefixed("method"),
        r.read_length_prefixed("scheme"),
        r.read_length_prefixed("authority"),
        r.read_length_prefixed("path"),
    )


def decode_request(data: bytes) -> Request:
    """Decode a known- or indeterminate-length request (framing indicator 0 or 2)."""
    r = ByteReader(data, BhttpError)
    known_length = _read_framing(r, KNOWN_LENGTH_REQUEST, INDETERMINATE_LENGTH_REQUEST, "request")
    control_data = _read_control_data(r)
    return Request(*control_data, **_read_body(r, known_length))


def decode_request_buffer(buf: bytearray) -> tuple[Request, bytearray]:
    """As decode_request, for a decrypted request held in a bytearray the caller will wipe: the
    content comes back as a separate bytearray (wipeable), and the returned Request has empty
    content. Nothing of the content is copied into immutable bytes."""
    r = ByteReader(buf, BhttpError)
    try:
        known_length = _read_framing(r, KNOWN_LENGTH_REQUEST, INDETERMINATE_LENGTH_REQUEST, "request")
        control_data = _read_control_data(r)
        headers = _read_field_section(r, known_length, "header") if not r.at_end() else []
        content = bytearray()
        if not r.at_end():
            if known_length:
                content = r.read_buffer(r.read_varint("content length"), "content")
            else:
                while (length := r.read_varint("content chunk length")) != 0:
                    content += r.read_buffer(length, "content chunk")
        trailers = _read_field_section(r, known_length, "trailer") if not r.at_end() else []
        if any(r.read_rest()):
            raise BhttpError("non-zero padding")
        return Request(*control_data, headers=tuple(headers), trailers=tuple(trailers)), content
    finally:
        r.release()


def decode_response(data: bytes) -> Response:
    """Decode a known- or indeterminate-length response (framing indicator 1 or 3)."""
    r = ByteReader(data, BhttpError)
    known_length = _read_framing(r, KNOWN_LENGTH_RESPONSE, INDETERMINATE_LENGTH_RESPONSE, "response")
    informational: list[InformationalResponse] = []
    status = r.read_varint("status code")
    while status < 200:
        check_informational_status(status)
        headers = _read_field_section(r, known_length, "informational header")
        informational.append(InformationalResponse(status, tuple(headers)))
        status = r.read_varint("status code")
    check_final_status(status)
    return Response(status, informational=tuple(informational), **_read_body(r, known_length))
