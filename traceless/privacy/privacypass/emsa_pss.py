"""EMSA-PSS-ENCODE and MGF1 (RFC 8017 section 9.1.1 and appendix B.2.1).

`cryptography` signs and verifies PSS but never exposes the encoded message EM, and blind
RSA needs EM itself: the client blinds the integer of EM before the signer sees it. So the
encoding is written here, step for step as in the RFC, on top of `hashlib`'s hashes. The
salt is an input: the caller draws it (or a test injects a known-answer value).
"""

from __future__ import annotations

import hashlib

from traceless.privacy.privacypass.errors import MessageEncodingError


def mgf1(mgf_seed: bytes, mask_len: int, hash_name: str) -> bytes:
    """MGF1 (RFC 8017 B.2.1): Hash(seed || C(0)) || Hash(seed || C(1)) || ..., cut to mask_len."""
    h_len = hashlib.new(hash_name).digest_size
    if mask_len < 0 or mask_len > (h_len << 32):
        raise MessageEncodingError("MGF1 mask too long")
    blocks = []
    for counter in range(-(-mask_len // h_len)):  # ceil(mask_len / hLen) blocks
        blocks.append(hashlib.new(hash_name, mgf_seed + counter.to_bytes(4, "big")).digest())
    return b"".join(blocks)[:mask_len]


def emsa_pss_encode(m: bytes, em_bits: int, *, salt: bytes, hash_name: str) -> bytes:
    """EMSA-PSS-ENCODE (RFC 8017 9.1.1) with MGF1 over the same hash; sLen = len(salt).

    Returns EM, an octet string of length emLen = ceil(em_bits / 8). For blind RSA
    em_bits = bit_len(n) - 1 (RFC 9474 section 4.2).
    """
    # Step 1 ("message too long") is about the hash's input limit (2^125 bytes for
    # SHA-384): a Python bytes object cannot reach it, so there is nothing to check.
    m_hash = hashlib.new(hash_name, m).digest()  # step 2
    h_len = len(m_hash)
    s_len = len(salt)
    em_len = -(-em_bits // 8)
    if em_len < h_len + s_len + 2:  # step 3
        raise MessageEncodingError("encoding error: modulus too small for hash and salt")
    m_prime = b"\x00" * 8 + m_hash + salt  # step 5
    h = hashlib.new(hash_name, m_prime).digest()  # step 6
    ps = b"\x00" * (em_len - s_len - h_len - 2)  # step 7
    db = ps + b"\x01" + salt  # step 8: length emLen - hLen - 1
    db_mask = mgf1(h, em_len - h_len - 1, hash_name)  # step 9
    masked_db = bytearray(a ^ b for a, b in zip(db, db_mask))  # step 10
    # Step 11: clear the leftmost 8*emLen - emBits bits so that EM, read as an integer,
    # has at most em_bits bits and is therefore below the modulus.
    masked_db[0] &= 0xFF >> (8 * em_len - em_bits)
    return bytes(masked_db) + h + b"\xbc"  # step 12
