"""Streaming Binary HTTP responses (RFC 9292 §3.2, indeterminate length).

A chunked OHTTP response (draft-ietf-ohai-chunked-ohttp) carries an indeterminate-length binary
HTTP response so that its content can be sent as it is produced:

    framing indicator 3 | [1xx status | field lines ... 0]* | status | field lines ... 0
                        | content chunks (length, bytes) ... 0 | trailers ... 0

`ResponseStreamEncoder` emits those pieces one at a time (an informational response of an exact
length stands for bytes that must leave before the final head is known: padding only);
`ResponseStreamDecoder` parses them from arbitrary byte slices as they arrive and yields the head
once, then content chunks.
Informational (1xx) responses are skipped by the decoder. Malformed input raises BhttpError.
"""

from __future__ import annotations

from dataclasses import dataclass

from traceless.privacy.bhttp.errors import BhttpError
from traceless.privacy.bhttp.fields import FieldLine, check_final_status, normalize_fields
from traceless.privacy.bhttp.message import INDETERMINATE_LENGTH_RESPONSE
from traceless.privacy.wire import encode_varint, peek_varint

MAX_FIELD_BYTES = 64 << 10
# The informational response that carries padding before a final head (RFC 9110 §15.2: a client
# parses and may ignore any 1xx it did not ask for; our decoder skips them)
PADDING_STATUS = 100
PADDING_FIELD = b"padding"


def _field_section(fields: tuple[FieldLine, ...]) -> bytes:
    out = bytearray()
    for name, value in fields:
        out += encode_varint(len(name)) + name + encode_varint(len(value)) + value
    return bytes(out + encode_varint(0))


class ResponseStreamEncoder:
    """Pieces of one indeterminate-length response, in order: informational()*, head(), chunk()*, end()."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state = "start"

    @property
    def head_sent(self) -> bool:
        return self._state in ("content", "done")

    def _framing(self) -> bytes:
        return encode_varint(INDETERMINATE_LENGTH_RESPONSE) if self._state == "start" else b""

    def informational(self, total: int) -> bytes:
        """Exactly `total` bytes (at least 16): a 100 response whose one field holds padding (dots),
        after the framing indicator if nothing was encoded yet. A decoder skips it."""
        if self.head_sent:
            raise BhttpError("informational responses go before the final head")
        fixed = len(self._framing()) + len(encode_varint(PADDING_STATUS)) + 1 + len(PADDING_FIELD) + 1
        for n in (1, 2, 4):
            value = total - fixed - n
            if value >= 0 and len(encode_varint(value)) == n:
                padding = _field_section(((PADDING_FIELD, b"." * value),))
                piece = self._framing() + encode_varint(PADDING_STATUS) + padding
                self._state = "informational"
                return piece
        raise BhttpError(f"no informational response is exactly {total} bytes")

    def head(self, status: int, headers: tuple[FieldLine, ...] = ()) -> bytes:
        if self.head_sent:
            raise BhttpError("the response head was already encoded")
        check_final_status(status)
        piece = self._framing() + encode_varint(status) + _field_section(normalize_fields(headers, "header"))
        self._state = "content"
        return piece

    def chunk(self, data: bytes) -> bytes:
        if self._state != "content":
            raise BhttpError("content chunks go between head() and end()")
        if not data:
            return b""  # a zero-length chunk would end the content
        return encode_varint(len(data)) + data

    def end(self) -> bytes:
        """Content terminator and an empty trailer section."""
        if self._state != "content":
            raise BhttpError("end() follows head() exactly once")
        self._state = "done"
        return encode_varint(0) + encode_varint(0)


@dataclass(frozen=True, slots=True)
class ResponseHead:
    status: int
    headers: tuple[FieldLine, ...]

    def header(self, name: bytes) -> bytes | None:
        return next((v for n, v in self.headers if n == name), None)


class ResponseStreamDecoder:
    """Feed bytes as they arrive; `feed` returns [ResponseHead?, content bytes...]."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._state = "framing"
        self._status = 0
        self._fields: list[FieldLine] = []

    @property
    def complete(self) -> bool:
        return self._state == "done"

    def _varint(self) -> int | None:
        got = peek_varint(self._buf)
        if got is None:
            return None
        value, size = got
        del self._buf[:size]
        return value

    def _field_line(self) -> bool | None:
        """Parse one field line or the section terminator; None if more bytes are needed."""
        got = peek_varint(self._buf)
        if got is None:
            return None
        name_len, size = got
        if name_len == 0:
            del self._buf[:size]
            return False
        if name_len > MAX_FIELD_BYTES:
            raise BhttpError("field name too long")
        value_at = peek_varint(self._buf[size + name_len :]) if len(self._buf) >= size + name_len else None
        if value_at is None:
            return None
        value_len, value_size = value_at
        if value_len > MAX_FIELD_BYTES:
            raise BhttpError("field value too long")
        end = size + name_len + value_size + value_len
        if len(self._buf) < end:
            return None
        name = bytes(self._buf[size : size + name_len])
        value = bytes(self._buf[size + name_len + value_size : end])
        del self._buf[:end]
        self._fields.append((name, value))
        return True

    def feed(self, data: bytes) -> list:
        if self._state == "done":
            if data.strip(b"\0"):
                raise BhttpError("data after the end of the response")
            return []
        self._buf += data
        out: list = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list) -> bool:
        """Advance the parser by one element; False when it needs more bytes."""
        state = self._state
        if state == "framing":
            return self._framing()
        if state == "status":
            return self._status_code()
        if state in ("fields", "trailers"):
            more = self._field_line()
            if more is None:
                return False
            return True if more else self._section_done(out)
        if state == "content":
            return self._content(out)
        return False

    def _framing(self) -> bool:
        v = self._varint()
        if v is None:
            return False
        if v != INDETERMINATE_LENGTH_RESPONSE:
            raise BhttpError("not an indeterminate-length response")
        self._state = "status"
        return True

    def _status_code(self) -> bool:
        v = self._varint()
        if v is None:
            return False
        if not 100 <= v <= 599:
            raise BhttpError("invalid status code")
        self._status, self._fields, self._state = v, [], "fields"
        return True

    def _section_done(self, out: list) -> bool:
        if self._state == "trailers":
            self._state = "done"
            return False
        if self._status < 200:  # informational response: skip it, a final one follows
            self._state = "status"
            return True
        check_final_status(self._status)
        out.append(ResponseHead(self._status, tuple(self._fields)))
        self._state = "content"
        return True

    def _content(self, out: list) -> bool:
        got = peek_varint(self._buf)
        if got is None:
            return False
        length, size = got
        if length == 0:
            del self._buf[:size]
            self._fields, self._state = [], "trailers"
            return True
        if len(self._buf) < size + length:
            return False
        out.append(bytes(self._buf[size : size + length]))
        self._buf[: size + length] = b""
        return True

    def wipe(self) -> None:
        self._buf[:] = bytes(len(self._buf))
        self._buf.clear()
