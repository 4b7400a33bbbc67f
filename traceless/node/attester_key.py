"""A software-attested node's signing key kept across restarts (`traceless node --attester-key-file`).

What a client pins for a software-attested node is its attester public key; a key made afresh at
every start would be refused after each restart until every client is told the new one. So a
deployment may keep that one key in a file of the node's state: 32 raw bytes (an Ed25519 private
key), mode 0600, created on first start. Only the signing identity persists. The OHTTP keys, which
decrypt requests, are still made in memory at every start and never written (a restart remains a
cryptographic erase of every request key); whoever reads this file can sign documents as the node,
which for the software attester the operator always could (docs/attestation.md). A hardware
attester's key is born in the confidential VM and is never kept.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from traceless.private_files import write_private

KEY_BYTES = 32


class AttesterKeyFileError(ValueError):
    """The key file cannot be used (readable by others, wrong size, not a file)."""


def load_or_create(path: str | Path) -> Ed25519PrivateKey:
    """The key in `path`, or a new one written there (0600) when the file does not exist."""
    target = Path(path)
    if not target.exists():
        key = Ed25519PrivateKey.generate()
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        raw = bytearray(key.private_bytes_raw())
        try:
            write_private(target, bytes(raw))
        finally:
            raw[:] = bytes(len(raw))
        return key
    info = target.stat()
    if not target.is_file():
        raise AttesterKeyFileError("the attester key file is not a regular file")
    if info.st_mode & 0o077:
        raise AttesterKeyFileError(
            "the attester key file is readable or writable by others than its owner (chmod 600 it)"
        )
    if info.st_uid != os.getuid():
        raise AttesterKeyFileError("the attester key file belongs to another user")
    raw = bytearray(target.read_bytes())
    try:
        if len(raw) != KEY_BYTES:
            raise AttesterKeyFileError(f"the attester key file must hold {KEY_BYTES} raw bytes")
        return Ed25519PrivateKey.from_private_bytes(bytes(raw))
    finally:
        raw[:] = bytes(len(raw))
