"""Signed tree heads (STH) of the transparency log: the log operator's signed statement that the
tree of `tree_size` leaves has root `root_hash`, as of `timestamp` (ms since the Unix epoch).

Signature: Ed25519 over our canonical encoding of the first three fields (RFC 6962's TreeHeadSignature
fixed-width layout with a domain-separation prefix in place of its version/type bytes):

    b"traceless/sth/v1\\x00" || uint64be(tree_size) || uint64be(timestamp) || root_hash[32]

JSON form (disk and HTTP): {"tree_size": int, "timestamp": int, "root_hash": b64, "signature": b64}.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from traceless.errors import TracelessError
from traceless.privacy.translog.merkle import HASH_SIZE

STH_CONTEXT = b"traceless/sth/v1\x00"


class TreeHeadError(TracelessError):
    """A signed tree head is malformed or its signature does not verify."""


def tree_head_signature_input(tree_size: int, timestamp: int, root_hash: bytes) -> bytes:
    if not (0 <= tree_size < 2**64 and 0 <= timestamp < 2**64 and len(root_hash) == HASH_SIZE):
        raise TreeHeadError("tree head fields out of range")
    return STH_CONTEXT + tree_size.to_bytes(8, "big") + timestamp.to_bytes(8, "big") + root_hash


@dataclass(frozen=True, slots=True)
class SignedTreeHead:
    tree_size: int
    timestamp: int  # milliseconds since the Unix epoch
    root_hash: bytes
    signature: bytes

    def verify(self, public_key: Ed25519PublicKey) -> None:
        data = tree_head_signature_input(self.tree_size, self.timestamp, self.root_hash)
        try:
            public_key.verify(self.signature, data)
        except InvalidSignature:
            raise TreeHeadError("tree head signature does not verify") from None

    def to_json(self) -> dict[str, object]:
        return {
            "tree_size": self.tree_size,
            "timestamp": self.timestamp,
            "root_hash": base64.b64encode(self.root_hash).decode(),
            "signature": base64.b64encode(self.signature).decode(),
        }

    @classmethod
    def from_json(cls, obj: object) -> SignedTreeHead:
        try:
            size, ts = obj["tree_size"], obj["timestamp"]  # type: ignore[index]
            root = base64.b64decode(obj["root_hash"], validate=True)  # type: ignore[index]
            sig = base64.b64decode(obj["signature"], validate=True)  # type: ignore[index]
        except (TypeError, KeyError, ValueError, binascii.Error):
            raise TreeHeadError("tree head is not a JSON object with the four fields") from None
        if not all(type(v) is int and 0 <= v < 2**64 for v in (size, ts)):
            raise TreeHeadError("tree_size and timestamp must be unsigned 64-bit integers")
        if len(root) != HASH_SIZE or len(sig) != 64:
            raise TreeHeadError("root_hash must be 32 bytes and signature 64 bytes")
        return cls(size, ts, root, sig)


def sign_tree_head(key: Ed25519PrivateKey, tree_size: int, timestamp: int, root_hash: bytes) -> SignedTreeHead:
    signature = key.sign(tree_head_signature_input(tree_size, timestamp, root_hash))
    return SignedTreeHead(tree_size, timestamp, root_hash, signature)
