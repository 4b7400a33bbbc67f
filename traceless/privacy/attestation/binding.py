"""What a hardware-backed node binds into its CPU report's REPORT_DATA and its GPU report's nonce.

A node's attestation document is a compact JWS whose signing input (`header.payload`, the ASCII
bytes the signature covers) holds, among its claims, the client's nonce (`eat_nonce`), the SHA-256
of the node's OHTTP key configuration and the release manifest digest (`measurements.combined`),
and whose header holds the node's in-TEE public key. Binding the whole signing input binds all of
them at once, and anything a later version adds to the claims, with no second encoding to keep in
step:

    report_data = SHA-512("traceless attestation binding v1" || 0x00 || signing_input)   # 64 bytes
    gpu_nonce   = SHA-256("traceless gpu nonce v1"           || 0x00 || signing_input)   # 32 bytes

SEV-SNP and TDX reports carry 64 bytes of REPORT_DATA; an NVIDIA SPDM GET_MEASUREMENTS request
carries a 32-byte nonce. The two labels keep the values distinct, so neither can stand for the
other. A report that carries these bytes was produced for exactly this document: evidence cannot
be replayed for another key, another nonce or another release.
"""

from __future__ import annotations

import hashlib

REPORT_DATA_LABEL = b"traceless attestation binding v1\x00"
GPU_NONCE_LABEL = b"traceless gpu nonce v1\x00"
REPORT_DATA_SIZE = 64
GPU_NONCE_SIZE = 32


def signing_input(document: str) -> bytes:
    """The bytes a compact JWS's signature covers: its first two segments and the dot between."""
    parts = document.split(".") if isinstance(document, str) else []
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise ValueError("not a JWS compact serialization")
    return f"{parts[0]}.{parts[1]}".encode("ascii")


def report_data(document_signing_input: bytes) -> bytes:
    """REPORT_DATA (64 bytes) binding a CPU report to the document with this signing input."""
    return hashlib.sha512(REPORT_DATA_LABEL + document_signing_input).digest()


def gpu_nonce(document_signing_input: bytes) -> bytes:
    """The SPDM nonce (32 bytes) binding a GPU report to the document with this signing input."""
    return hashlib.sha256(GPU_NONCE_LABEL + document_signing_input).digest()
