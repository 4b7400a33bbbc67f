"""Witness cosignatures of signed tree heads, and the client's rule for accepting a tree head.

A witness is an independent party with its own Ed25519 key. It cosigns a log's tree head only if
the head extends (RFC 9162 2.1.4) the last head it cosigned for that log, so a log operator who
shows two different histories (a fork: e.g. two different heads of the same size) cannot get both
cosigned by the same witness. A client that requires a cosignature from a witness it trusts can
therefore only be shown the history that witness saw.

A cosignature also says *when* the witness saw the head as the log's latest: its `timestamp`. A
witness re-cosigns the current head on every poll, so the newest cosignature's age bounds how old a
view the log can hold a client in (`WitnessPolicy.max_age_s`), even when the log has not appended
anything for a long time (the log's own timestamp only moves on appends).

Signature: Ed25519 over

    b"traceless/cosignature/v1\\x00" || SHA-256(log public key, raw 32 bytes)
        || uint64be(tree_size) || uint64be(sth.timestamp) || root_hash[32] || uint64be(timestamp)

JSON form: {"witness_key": b64 raw Ed25519 key, "timestamp": int ms, "signature": b64}.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from traceless.errors import TracelessError
from traceless.privacy.translog.tree_head import STH_CONTEXT, SignedTreeHead, tree_head_signature_input

COSIGNATURE_CONTEXT = b"traceless/cosignature/v1\x00"
# Cosignature timestamps this far ahead of the verifier's clock are accepted (skew), no further.
FUTURE_LEEWAY_MS = 60_000


class CosignatureError(TracelessError):
    """A cosignature is malformed or does not verify."""


def raw_public_key(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def cosignature_input(log_public_key: bytes, sth: SignedTreeHead, timestamp: int) -> bytes:
    if len(log_public_key) != 32 or not 0 <= timestamp < 2**64:
        raise CosignatureError("cosignature fields out of range")
    head = tree_head_signature_input(sth.tree_size, sth.timestamp, sth.root_hash)
    return (
        COSIGNATURE_CONTEXT
        + hashlib.sha256(log_public_key).digest()
        + head[len(STH_CONTEXT) :]
        + timestamp.to_bytes(8, "big")
    )


@dataclass(frozen=True, slots=True)
class Cosignature:
    witness_key: bytes  # raw Ed25519 public key of the witness
    timestamp: int  # ms since the Unix epoch: when the witness saw the head as the log's latest
    signature: bytes

    def verify(self, log_public_key: bytes, sth: SignedTreeHead) -> None:
        try:
            key = Ed25519PublicKey.from_public_bytes(self.witness_key)
            key.verify(self.signature, cosignature_input(log_public_key, sth, self.timestamp))
        except (InvalidSignature, ValueError):
            raise CosignatureError("cosignature does not verify") from None

    def to_json(self) -> dict[str, object]:
        return {
            "witness_key": base64.b64encode(self.witness_key).decode(),
            "timestamp": self.timestamp,
            "signature": base64.b64encode(self.signature).decode(),
        }

    @classmethod
    def from_json(cls, obj: object) -> Cosignature:
        try:
            key = base64.b64decode(obj["witness_key"], validate=True)  # type: ignore[index]
            sig = base64.b64decode(obj["signature"], validate=True)  # type: ignore[index]
            ts = obj["timestamp"]  # type: ignore[index]
        except (TypeError, KeyError, ValueError, binascii.Error):
            raise CosignatureError("cosignature is not a JSON object with the three fields") from None
        if type(ts) is not int or not 0 <= ts < 2**64 or len(key) != 32 or len(sig) != 64:
            raise CosignatureError("cosignature fields have the wrong type or size")
        return cls(key, ts, sig)


def cosign(witness_key: Ed25519PrivateKey, log_public_key: bytes, sth: SignedTreeHead, timestamp: int) -> Cosignature:
    signature = witness_key.sign(cosignature_input(log_public_key, sth, timestamp))
    return Cosignature(raw_public_key(witness_key.public_key()), timestamp, signature)


@dataclass(frozen=True, slots=True)
class WitnessPolicy:
    """What a client requires of a tree head beyond the log's own signature."""

    witness_keys: tuple[bytes, ...]  # raw Ed25519 keys of the witnesses the client trusts
    max_age_s: float = 600.0  # the newest trusted cosignature may be at most this old
    min_cosignatures: int = 1  # from distinct trusted witnesses

    def __post_init__(self) -> None:
        if any(len(k) != 32 for k in self.witness_keys) or self.max_age_s <= 0 or self.min_cosignatures < 1:
            raise ValueError("witness keys are 32 bytes, max_age_s > 0 and min_cosignatures >= 1")


class MissingCosignatureError(CosignatureError):
    """Fewer valid cosignatures from trusted witnesses than the policy requires."""


class StaleTreeHeadError(CosignatureError):
    """The newest trusted cosignature is older than the policy's bound (or from the future)."""


def check_cosigned(
    policy: WitnessPolicy, log_public_key: bytes, sth: SignedTreeHead, cosignatures: Iterable[Cosignature], now_ms: int
) -> int:
    """Check `sth` against the policy; the newest valid trusted cosignature's timestamp.

    Cosignatures from keys the policy does not name are ignored (anyone may witness); an invalid one
    from a trusted key does not count. Raises MissingCosignatureError or StaleTreeHeadError.
    """
    if not policy.witness_keys:
        raise MissingCosignatureError("no witness key is configured: a tree head cannot be accepted")
    trusted = set(policy.witness_keys)
    newest: dict[bytes, int] = {}
    for cosig in cosignatures:
        if cosig.witness_key not in trusted:
            continue
        try:
            cosig.verify(log_public_key, sth)
        except CosignatureError:
            continue
        if cosig.timestamp > now_ms + FUTURE_LEEWAY_MS:
            continue
        newest[cosig.witness_key] = max(newest.get(cosig.witness_key, 0), cosig.timestamp)
    if len(newest) < policy.min_cosignatures:
        raise MissingCosignatureError(
            f"the tree head has {len(newest)} valid cosignature(s) from trusted witnesses, "
            f"{policy.min_cosignatures} required"
        )
    latest = max(newest.values())
    if now_ms - latest > policy.max_age_s * 1000:
        raise StaleTreeHeadError(
            f"the newest witness cosignature is {(now_ms - latest) / 1000:.0f} s old (bound: {policy.max_age_s:.0f} s)"
        )
    return latest
