"""The issuer's token signing key, kept across restarts.

Wallets use only the newest issuer key in the transparency log. An issuer that drew a new key at
every start would need every restart logged, and until it was, no wallet would take tokens (and a
log growing one key per restart lets clients of different moments hold different keys). With
`--key-file`, the key is made once (RSA-2048, PKCS#8 PEM, written 0600 from its first byte) and
read back at every start, so a restart keeps the logged key. A rotation is a new file whose key is
logged before the issuer starts with it.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from traceless.privacy.privacypass.protocol import Issuer
from traceless.private_files import write_private


class IssuerKeyFileError(Exception):
    """The key file exists but does not hold an RSA-2048 private key (or is readable by others)."""


def load_or_create_issuer(path: str | Path) -> Issuer:
    """The Issuer whose key is in `path`, creating the file with a fresh key if it does not exist."""
    target = Path(path)
    if not target.exists():
        issuer = Issuer.generate()
        pem = issuer.private_key_pem()
        write_private(target, pem)
        return issuer
    if target.stat().st_mode & 0o077:
        raise IssuerKeyFileError(f"{target} is readable by others: it must be mode 0600")
    try:
        key = serialization.load_pem_private_key(target.read_bytes(), password=None)
        if not isinstance(key, rsa.RSAPrivateKey):
            raise ValueError("not an RSA key")
        return Issuer(key)
    except ValueError as exc:
        raise IssuerKeyFileError(f"{target} does not hold an RSA-2048 private key in PEM: {exc}") from None
