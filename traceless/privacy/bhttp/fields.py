"""Validation of binary HTTP control data and field lines (RFC 9292 §3.4-§3.6, §6).

Field names and values follow HTTP/2's rules (RFC 9113 §8.2.1), as RFC 9292 §3.6 requires;
the pseudo-fields that carry control data in HTTP/2 are invalid as fields here (RFC 9292 §6).
Each check raises `BhttpError` naming the part and rule, never quoting the bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

from traceless.privacy.bhttp.errors import BhttpError

FieldLine = tuple[bytes, bytes]

# tchar (RFC 9110 §5.6.2): a method is a token.
_TCHAR = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
# HTTP/2 field names: no 0x00-0x20, no uppercase 0x41-0x5a, no 0x7f-0xff; ':' only as a prefix.
_NAME_BYTES = frozenset(range(0x21, 0x7F)) - frozenset(range(0x41, 0x5B)) - {ord(":")}
_FORBIDDEN_VALUE_BYTES = frozenset(b"\x00\r\n")
_WHITESPACE = frozenset(b" \t")
_CONTROL_PSEUDO_FIELDS = frozenset((b":method", b":scheme", b":authority", b":path", b":status"))
# Request-target parts travel as visible ASCII: no controls, spaces or bytes >= 0x7f.
_VISIBLE_ASCII = frozenset(range(0x21, 0x7F))


def as_bytes(value: object, what: str) -> bytes:
    """`value` as immutable bytes; anything but a bytes-like object is an error (no str, no int)."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise BhttpError(f"{what} must be bytes, got {type(value).__name__}")
    return bytes(value)


def check_method(method: bytes) -> None:
    if not method or not _TCHAR.issuperset(method):
        raise BhttpError("method must be a non-empty token (RFC 9110 §9.1)")


def check_target_part(value: bytes, what: str) -> None:
    if not _VISIBLE_ASCII.issuperset(value):
        raise BhttpError(f"{what} holds a control, space or non-ASCII byte")


def check_final_status(status: int) -> None:
    if not 200 <= status <= 599:
        raise BhttpError(f"final status code must be in 200..599, got {status}")


def check_informational_status(status: int) -> None:
    if not 100 <= status <= 199:
        raise BhttpError(f"informational status code must be in 100..199, got {status}")


def check_field_name(name: bytes, what: str) -> None:
    body = name[1:] if name.startswith(b":") else name
    if not body or not _NAME_BYTES.issuperset(body):
        raise BhttpError(f"invalid {what} field name (RFC 9113 §8.2.1)")


def check_field_value(value: bytes, what: str) -> None:
    if not _FORBIDDEN_VALUE_BYTES.isdisjoint(value):
        raise BhttpError(f"{what} field value holds NUL, CR or LF")
    if value and (value[0] in _WHITESPACE or value[-1] in _WHITESPACE):
        raise BhttpError(f"{what} field value starts or ends with whitespace")


def normalize_fields(fields: Iterable[FieldLine], what: str) -> tuple[FieldLine, ...]:
    """Validated, immutable copy of a field section; pseudo-fields must come first."""
    out: list[FieldLine] = []
    seen_regular = False
    for line in fields:
        if not isinstance(line, (tuple, list)) or len(line) != 2:
            raise BhttpError(f"{what} field lines must be (name, value) pairs")
        name = as_bytes(line[0], f"{what} field name")
        value = as_bytes(line[1], f"{what} field value")
        check_field_name(name, what)
        check_field_value(value, what)
        if name.startswith(b":"):
            if name in _CONTROL_PSEUDO_FIELDS:
                raise BhttpError(f"{what} carries a control-data pseudo-field (RFC 9292 §6)")
            if seen_regular:
                raise BhttpError(f"{what} has a pseudo-field after a regular field (RFC 9292 §6)")
        else:
            seen_regular = True
        out.append((name, value))
    return tuple(out)
