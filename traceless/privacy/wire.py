"""Bounded byte reading and QUIC variable-length integers (RFC 9000 §16).

Binary HTTP (RFC 9292 §3) and chunked Oblivious HTTP use QUIC varints for every length and
number. `ByteReader` is the only way the parsers here touch input: each read checks the bound
first and raises the caller's typed error, so truncated input can never surface as IndexError
or as a silently short slice.
"""

from __future__ import annotations

from traceless.privacy.errors import MalformedMessageError

VARINT_MAX = (1 << 62) - 1

# The two high bits of the first byte give the encoded length: 00 -> 1, 01 -> 2, 10 -> 4, 11 -> 8.
_VARINT_LENGTHS = (1, 2, 4, 8)


def encode_varint(value: int) -> bytes:
    """Shortest QUIC encoding of `value` (0 <= value < 2**62)."""
    if not 0 <= value <= VARINT_MAX:
        raise ValueError(f"varint needs 0 <= value < 2**62, got {value.bit_length()} bits")
    if value < 1 << 6:
        return value.to_bytes(1, "big")
    if value < 1 << 14:
        return (value | 0x4000).to_bytes(2, "big")
    if value < 1 << 30:
        return (value | 0x8000_0000).to_bytes(4, "big")
    return (value | 0xC000_0000_0000_0000).to_bytes(8, "big")


def varint_length(first_byte: int) -> int:
    """Number of bytes of a varint whose first byte is `first_byte`."""
    return _VARINT_LENGTHS[first_byte >> 6]


def _varint_value(raw: bytes | bytearray) -> int:
    return int.from_bytes(raw, "big") & ((1 << (8 * len(raw) - 2)) - 1)


def peek_varint(buffer: bytes | bytearray) -> tuple[int, int] | None:
    """(value, encoded length) of the varint at the start of `buffer`; None if incomplete."""
    if not buffer or len(buffer) < varint_length(buffer[0]):
        return None
    n = varint_length(buffer[0])
    return _varint_value(buffer[:n]), n


class ByteReader:
    """A cursor over bytes. Every read is bounds-checked and raises `error` on underrun.

    A bytearray is read in place (not copied), so a caller holding decrypted data in a buffer it
    will wipe does not get an unwipeable copy of the whole message; `read_buffer` returns a part
    as a new bytearray, wipeable too.

    `error` is the typed error the caller wants (e.g. BhttpError); `what` names the field in the
    message, so errors say which part was short without quoting any of the data.
    """

    __slots__ = ("_data", "_pos", "_error")

    def __init__(self, data: bytes | bytearray, error: type[MalformedMessageError] = MalformedMessageError) -> None:
        self._data = memoryview(data if isinstance(data, bytearray) else bytes(data))
        self._pos = 0
        self._error = error

    @property
    def remaining(self) -> int:
        return len(self._data) - self._pos

    def at_end(self) -> bool:
        return self._pos == len(self._data)

    def fail(self, message: str) -> MalformedMessageError:
        """Build (not raise) this reader's error type; parsers `raise reader.fail(...)`."""
        return self._error(message)

    def read(self, n: int, what: str) -> bytes:
        if n < 0 or n > self.remaining:
            raise self._error(f"truncated {what}: needs {n} bytes, {self.remaining} left")
        start = self._pos
        self._pos += n
        return bytes(self._data[start : self._pos])

    def read_buffer(self, n: int, what: str) -> bytearray:
        if n < 0 or n > self.remaining:
            raise self._error(f"truncated {what}: needs {n} bytes, {self.remaining} left")
        start = self._pos
        self._pos += n
        return bytearray(self._data[start : self._pos])

    def release(self) -> None:
        """Drop the view of the input (a bytearray under a view cannot be resized or cleared)."""
        self._data.release()

    def read_uint(self, n: int, what: str) -> int:
        return int.from_bytes(self.read(n, what), "big")

    def read_varint(self, what: str) -> int:
        if self.at_end():
            raise self._error(f"truncated {what}: needs a varint, 0 bytes left")
        return _varint_value(self.read(varint_length(self._data[self._pos]), what))

    def read_length_prefixed(self, what: str) -> bytes:
        """A varint length followed by that many bytes (RFC 9292 length-prefixed fields)."""
        length = self.read_varint(f"{what} length")
        return self.read(length, what)

    def read_rest(self) -> bytes:
        return self.read(self.remaining, "rest")
