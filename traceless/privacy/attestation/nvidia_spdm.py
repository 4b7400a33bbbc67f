"""NVIDIA GPU attestation report: an SPDM 1.1 GET_MEASUREMENTS request followed by the signed
MEASUREMENTS response (DMTF DSP0274 1.1, sections 10.11; NVIDIA's local GPU verifier reads it the
same way). Little-endian integers.

    request (37 bytes):  SPDMVersion 0x11 | 0xE0 | Param1 (bit 0: signature requested) | Param2
                         (0xFF: all blocks) | Nonce [32] | SlotID
    response:            SPDMVersion | 0x60 | Param1 | Param2 | NumberOfBlocks u8
                         | MeasurementRecordLength u24 | MeasurementRecord | Nonce [32]
                         | OpaqueLength u16 | OpaqueData | Signature [96: r, s big-endian, P-384]
    measurement block:   Index u8 | MeasurementSpecification u8 (1: DMTF) | size u16
                         | DMTF value type u8 | value size u16 | value
    opaque data:         (type u16 | size u16 | value)* ; NVIDIA's types, e.g. 3 driver version,
                         6 VBIOS version, 20 FWID (48 bytes)

The GPU signs request || response minus the signature with its attestation key (ECDSA P-384,
SHA-384), so the verifier's nonce in the request is covered by the signature.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from traceless.privacy.attestation.evidence import MalformedEvidenceError, UnsupportedEvidenceError

REQUEST_SIZE = 37
SIGNATURE_SIZE = 96
NONCE_SIZE = 32
GET_MEASUREMENTS, MEASUREMENTS = 0xE0, 0x60
SPDM_VERSIONS = (0x11,)
OPAQUE_DRIVER_VERSION, OPAQUE_VBIOS_VERSION, OPAQUE_FWID = 3, 6, 20


@dataclass(frozen=True, slots=True)
class SpdmReport:
    spdm_version: int
    nonce: bytes  # the requester's (verifier's) nonce, from the request
    responder_nonce: bytes
    measurements: Mapping[int, bytes]  # block index -> measurement value (a digest), read-only
    opaque: Mapping[int, bytes]  # opaque field type -> value, read-only
    signed_bytes: bytes  # request || response without the signature
    signature: bytes  # r || s, big-endian

    @property
    def fwid(self) -> bytes | None:
        return self.opaque.get(OPAQUE_FWID)

    @property
    def driver_version(self) -> str | None:
        raw = self.opaque.get(OPAQUE_DRIVER_VERSION)
        return raw.rstrip(b"\x00").decode("ascii", "replace") if raw is not None else None

    @property
    def vbios_version(self) -> str | None:
        raw = self.opaque.get(OPAQUE_VBIOS_VERSION)
        if raw is None or len(raw) < 5:
            return None
        # NVIDIA's local verifier prints bytes 3, 2, 1, 0, 4 as dotted hex ("96.00.9F.00.01").
        return ".".join(f"{b:02X}" for b in (raw[3], raw[2], raw[1], raw[0], raw[4]))


def _blocks(record: bytes, count: int) -> dict[int, bytes]:
    blocks: dict[int, bytes] = {}
    pos = 0
    for _ in range(count):
        if pos + 4 > len(record):
            raise MalformedEvidenceError("measurement record ends inside a block header")
        index, spec, size = struct.unpack_from("<BBH", record, pos)
        block = record[pos + 4 : pos + 4 + size]
        pos += 4 + size
        if len(block) != size or size < 3:
            raise MalformedEvidenceError(f"measurement block {index} runs past the record or is too short")
        if spec != 1:
            raise UnsupportedEvidenceError(f"measurement block {index} is not in DMTF format")
        (value_size,) = struct.unpack_from("<H", block, 1)
        if value_size != size - 3:
            raise MalformedEvidenceError(f"measurement block {index}: value size {value_size} != block size - 3")
        if index in blocks:
            raise MalformedEvidenceError(f"measurement block {index} appears twice")
        blocks[index] = block[3:]
    if pos != len(record):
        raise MalformedEvidenceError(f"measurement record has {len(record) - pos} bytes after its blocks")
    return blocks


def _opaque(data: bytes) -> dict[int, bytes]:
    fields: dict[int, bytes] = {}
    pos = 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise MalformedEvidenceError("opaque data ends inside a field header")
        kind, size = struct.unpack_from("<HH", data, pos)
        value = data[pos + 4 : pos + 4 + size]
        if len(value) != size:
            raise MalformedEvidenceError(f"opaque field {kind} runs past the opaque data")
        fields[kind] = value
        pos += 4 + size
    return fields


def parse_spdm_report(data: bytes) -> SpdmReport:
    data = bytes(data)
    if len(data) < REQUEST_SIZE + 8 + NONCE_SIZE + 2 + SIGNATURE_SIZE:
        raise MalformedEvidenceError(f"GPU attestation report is {len(data)} bytes: too short")
    version, code, param1, _ = data[:4]
    if version not in SPDM_VERSIONS or code != GET_MEASUREMENTS:
        raise UnsupportedEvidenceError(f"request is SPDM 0x{version:02x} code 0x{code:02x}, not 1.1 GET_MEASUREMENTS")
    if not param1 & 1:
        raise MalformedEvidenceError("the request did not ask for a signature (Param1 bit 0)")
    response = data[REQUEST_SIZE:]
    r_version, r_code, _, _, count = response[:5]
    if r_version != version or r_code != MEASUREMENTS:
        raise MalformedEvidenceError(f"response is SPDM 0x{r_version:02x} code 0x{r_code:02x}, not MEASUREMENTS")
    record_len = int.from_bytes(response[5:8], "little")
    pos = 8 + record_len
    tail = response[pos:]
    if len(tail) < NONCE_SIZE + 2:
        raise MalformedEvidenceError("measurement record length runs past the response")
    (opaque_len,) = struct.unpack_from("<H", tail, NONCE_SIZE)
    end = pos + NONCE_SIZE + 2 + opaque_len
    if len(response) != end + SIGNATURE_SIZE:
        raise MalformedEvidenceError(f"response is {len(response)} bytes, its fields say {end + SIGNATURE_SIZE}")
    return SpdmReport(
        spdm_version=version,
        nonce=data[4 : 4 + NONCE_SIZE],
        responder_nonce=tail[:NONCE_SIZE],
        measurements=MappingProxyType(_blocks(response[8:pos], count)),
        opaque=MappingProxyType(_opaque(response[end - opaque_len : end])),
        signed_bytes=data[:-SIGNATURE_SIZE],
        signature=data[-SIGNATURE_SIZE:],
    )
