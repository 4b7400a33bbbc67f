"""Which kind of hardware evidence a blob is, from its first bytes (for `traceless attest verify`
without --kind), and hex-text files read as the bytes they spell (vendors' samples often are)."""

from __future__ import annotations

import binascii
import re
import struct

from traceless.privacy.attestation.nvidia_spdm import GET_MEASUREMENTS, SPDM_VERSIONS
from traceless.privacy.attestation.snp_report import REPORT_SIZE, SUPPORTED_VERSIONS
from traceless.privacy.attestation.tdx_quote import ECDSA_P256, HEADER_SIZE, TEE_TDX

KINDS = ("snp", "tdx", "nvidia")
_HEX_TEXT = re.compile(rb"\s*(?:[0-9a-fA-F]{2}\s*)+")


def evidence_bytes(data: bytes) -> bytes:
    """The bytes a file holds: hex text (whitespace allowed) is decoded, anything else kept."""
    if _HEX_TEXT.fullmatch(data):
        try:
            return binascii.unhexlify(b"".join(data.split()))
        except binascii.Error:
            return data
    return data


def detect_kind(data: bytes) -> str | None:
    """ "snp", "tdx" or "nvidia" when the header says so, None otherwise (the verifier decides the rest)."""
    if len(data) == REPORT_SIZE and struct.unpack_from("<I", data)[0] in SUPPORTED_VERSIONS:
        return "snp"
    if len(data) >= HEADER_SIZE:
        version, key_type, tee = struct.unpack_from("<HHI", data)
        if version in (4, 5) and key_type == ECDSA_P256 and tee == TEE_TDX:
            return "tdx"
    if len(data) >= 2 and data[0] in SPDM_VERSIONS and data[1] == GET_MEASUREMENTS:
        return "nvidia"
    return None
