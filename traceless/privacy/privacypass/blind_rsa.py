"""RSABSSA: RSA blind signatures with PSS encoding (RFC 9474).

    client                                server
    prepared = prepare(variant, msg)
    b = blind(variant, pk, prepared)  --- b.blinded_msg --->
                                       blind_sig = blind_sign(sk, blinded_msg)
                                  <--- blind_sig ---
    sig = finalize(variant, pk, prepared, blind_sig, b.inv)
    anyone: verify(variant, pk, prepared, sig)

Keys are `cryptography` RSA key objects; the final check is `RSAPublicKey.verify` with PSS
padding. The raw RSA operations (RSAVP1 on the blind, RSASP1 on the blinded message) are
Python integer arithmetic, because `cryptography` offers no unpadded RSA.

Side channels: Python's big-integer `pow` is not constant time. The signer therefore applies
base blinding (RFC 9474 section 7.1): it exponentiates m * u^e for a fresh random u, never the
client-chosen m itself, so timing does not correlate with attacker-chosen inputs. It also
checks s^e == m before releasing s (RFC 9474 section 4.3), which defeats fault attacks on the
CRT computation (a faulty s would reveal a prime factor of n).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from enum import Enum

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from traceless.privacy.privacypass.emsa_pss import emsa_pss_encode
from traceless.privacy.privacypass.errors import (
    BlindingError,
    InvalidInputError,
    InvalidSignatureError,
    SigningFailureError,
)

HASH_NAME = "sha384"
MSG_PREFIX_LEN = 32  # PrepareRandomize prepends 32 random bytes (RFC 9474 section 4.1)
MIN_MODULUS_BITS = 2048
_MAX_BLIND_TRIES = 64  # a non-invertible r has probability ~2^-1023 per draw


class Variant(Enum):
    """The four named RSABSSA variants of RFC 9474 section 5 (all SHA-384, MGF1-SHA-384)."""

    SHA384_PSS_RANDOMIZED = ("RSABSSA-SHA384-PSS-Randomized", 48, True)
    SHA384_PSSZERO_RANDOMIZED = ("RSABSSA-SHA384-PSSZERO-Randomized", 0, True)
    SHA384_PSS_DETERMINISTIC = ("RSABSSA-SHA384-PSS-Deterministic", 48, False)
    SHA384_PSSZERO_DETERMINISTIC = ("RSABSSA-SHA384-PSSZERO-Deterministic", 0, False)

    def __init__(self, rfc_name: str, salt_len: int, randomized: bool) -> None:
        self.rfc_name = rfc_name
        self.salt_len = salt_len  # sLen in bytes
        self.randomized = randomized  # whether prepare() prepends a random msg_prefix

    @classmethod
    def from_rfc_name(cls, rfc_name: str) -> Variant:
        for variant in cls:
            if variant.rfc_name == rfc_name:
                return variant
        raise ValueError(f"unknown RSABSSA variant name {rfc_name!r}")

    def pss_padding(self) -> padding.PSS:
        return padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=self.salt_len)


@dataclass(frozen=True, slots=True)
class BlindingResult:
    """Output of blind(): the blinded message for the server, and inv = r^-1 mod n.

    inv must stay with the client (it links the blinded message to the final signature),
    so it is left out of repr.
    """

    blinded_msg: bytes
    inv: int = field(repr=False)


def prepare(variant: Variant, msg: bytes, *, msg_prefix: bytes | None = None) -> bytes:
    """Prepare (RFC 9474 section 4.1): identity, or msg_prefix || msg for randomized variants.

    msg_prefix is for known-answer tests only; production callers leave it out and a fresh
    32-byte prefix is drawn. The returned prepared message is what blind, finalize and
    verify take as `msg`.
    """
    if not variant.randomized:
        if msg_prefix:
            raise ValueError("deterministic variants take no msg_prefix")
        return msg
    if msg_prefix is None:
        msg_prefix = secrets.token_bytes(MSG_PREFIX_LEN)
    elif len(msg_prefix) != MSG_PREFIX_LEN:
        raise ValueError(f"msg_prefix must be {MSG_PREFIX_LEN} bytes")
    return msg_prefix + msg


def blind(
    variant: Variant,
    public_key: rsa.RSAPublicKey,
    msg: bytes,
    *,
    salt: bytes | None = None,
    r: int | None = None,
) -> BlindingResult:
    """Blind (RFC 9474 section 4.2): EMSA-PSS-encode msg and multiply by r^e mod n.

    `salt` and `r` are for known-answer tests only: production callers leave them out so
    that both are drawn from the OS CSPRNG (RFC 9474 section 7.5 warns that a chosen salt
    can carry information to the signer).
    """
    n, e = _public_ints(public_key)
    if salt is None:
        salt = secrets.token_bytes(variant.salt_len)
    elif len(salt) != variant.salt_len:
        raise ValueError(f"salt must be {variant.salt_len} bytes for {variant.rfc_name}")
    encoded_msg = emsa_pss_encode(msg, n.bit_length() - 1, salt=salt, hash_name=HASH_NAME)
    m = int.from_bytes(encoded_msg, "big")
    if math.gcd(m, n) != 1:
        raise InvalidInputError("invalid input: message representative is not coprime with n")
    r, inv = _blind_factor(n, r)
    x = pow(r, e, n)  # RSAVP1(pk, r)
    z = m * x % n
    return BlindingResult(blinded_msg=z.to_bytes(_modulus_len(n), "big"), inv=inv)


def blind_sign(private_key: rsa.RSAPrivateKey, blinded_msg: bytes) -> bytes:
    """BlindSign (RFC 9474 section 4.3): s = RSASP1(sk, m), released only if s^e == m."""
    numbers = private_key.private_numbers()
    n, e = _public_ints_of(numbers.public_numbers)
    k_len = _modulus_len(n)
    if len(blinded_msg) != k_len:
        raise InvalidInputError("unexpected input size: blinded_msg is not modulus-length")
    m = int.from_bytes(blinded_msg, "big")
    if m >= n:
        raise InvalidInputError("message representative out of range")
    s = _rsasp1(numbers, m)
    if pow(s, e, n) != m:  # RSAVP1(pk, s) must give back m
        raise SigningFailureError("signing failure: s^e != m, signature withheld")
    return s.to_bytes(k_len, "big")


def finalize(
    variant: Variant,
    public_key: rsa.RSAPublicKey,
    msg: bytes,
    blind_sig: bytes,
    inv: int,
) -> bytes:
    """Finalize (RFC 9474 section 4.4): unblind with inv and verify; returns sig."""
    n, _ = _public_ints(public_key)
    k_len = _modulus_len(n)
    if len(blind_sig) != k_len:
        raise InvalidInputError("unexpected input size: blind_sig is not modulus-length")
    if not 1 <= inv < n:
        raise InvalidInputError("inv is not in [1, n)")
    z = int.from_bytes(blind_sig, "big")
    if z >= n:
        raise InvalidSignatureError("invalid signature: blind_sig out of range")
    sig = (z * inv % n).to_bytes(k_len, "big")
    verify(variant, public_key, msg, sig)
    return sig


def verify(variant: Variant, public_key: rsa.RSAPublicKey, msg: bytes, sig: bytes) -> None:
    """RSASSA-PSS-VERIFY with SHA-384, MGF1-SHA-384 and the variant's sLen; raises if invalid.

    For randomized variants msg is the prepared message (msg_prefix || msg).
    """
    n, _ = _public_ints(public_key)
    if len(sig) != _modulus_len(n):
        raise InvalidSignatureError("invalid signature: wrong length")
    try:
        public_key.verify(sig, msg, variant.pss_padding(), hashes.SHA384())
    except InvalidSignature:
        raise InvalidSignatureError("invalid signature") from None


def _rsasp1(numbers: rsa.RSAPrivateNumbers, m: int) -> int:
    """RSASP1 via CRT, on a base-blinded input: returns m^d mod n."""
    n, e = _public_ints_of(numbers.public_numbers)
    u = _random_unit(n)
    c = m * pow(u, e, n) % n  # c^d = m^d * u, so dividing by u at the end gives m^d
    s_p = pow(c, numbers.dmp1, numbers.p)
    s_q = pow(c, numbers.dmq1, numbers.q)
    h = numbers.iqmp * (s_p - s_q) % numbers.p  # iqmp = q^-1 mod p
    s_blinded = s_q + numbers.q * h
    return s_blinded * pow(u, -1, n) % n


def _blind_factor(n: int, r: int | None) -> tuple[int, int]:
    """Draw r uniformly from [1, n) with an inverse mod n (or check an injected one)."""
    if r is not None:
        if not 1 <= r < n:
            raise BlindingError("blinding error: r is not in [1, n)")
        try:
            return r, pow(r, -1, n)
        except ValueError:
            raise BlindingError("blinding error: r has no inverse mod n") from None
    for _ in range(_MAX_BLIND_TRIES):
        r = secrets.randbelow(n - 1) + 1
        if math.gcd(r, n) == 1:
            return r, pow(r, -1, n)
    raise BlindingError("blinding error: no invertible r found")


def _random_unit(n: int) -> int:
    for _ in range(_MAX_BLIND_TRIES):
        u = secrets.randbelow(n - 2) + 2
        if math.gcd(u, n) == 1:
            return u
    raise SigningFailureError("signing failure: no invertible blinding value found")


def _public_ints(public_key: rsa.RSAPublicKey) -> tuple[int, int]:
    return _public_ints_of(public_key.public_numbers())


def _public_ints_of(numbers: rsa.RSAPublicNumbers) -> tuple[int, int]:
    if numbers.n.bit_length() < MIN_MODULUS_BITS:
        raise InvalidInputError(f"RSA modulus shorter than {MIN_MODULUS_BITS} bits")
    return numbers.n, numbers.e


def _modulus_len(n: int) -> int:
    return (n.bit_length() + 7) // 8
