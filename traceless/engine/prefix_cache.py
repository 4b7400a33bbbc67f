"""Prefix caching with isolation domains. No torch.

A full block's hash chains SHA-256 over (parent hash, the block's tokens, the domain):

    h_0 = H(root    || tokens[0:B]   || domain_0)
    h_i = H(h_{i-1} || tokens[iB:(i+1)B] || domain_i)

so a block can only be found by a request with the same tokens before it *and* the same domain.
A LongRoPE request longer than the original context starts its chain at LONG_CONTEXT_ROOT instead
of ROOT (its KV was computed on other factors).
Domains:
  isolated  a request's domain is derived from its `cache_salt` (a client secret that travels
            inside the encryption); no salt, no caching. Operator-declared public prefixes (exact
            system prompts that are not user data) are hashed in the shared "public" domain; the
            request's own blocks after them chain on in its own domain.
  global    one domain for everyone: vLLM's shared cache, kept only as the insecure baseline.
  off       nothing is cached.
Every hit also compares the block's stored tokens (BlockPool.lookup), not only the hash.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from traceless.errors import InvalidRequestError
from traceless.modes import CacheMode

ROOT = b"\x00" * 32
LONG_CONTEXT_ROOT = hashlib.sha256(b"traceless/long-context").digest()  # LongRoPE's long-factor KV
PUBLIC = b"public"
SALT_PATTERN = re.compile(r"^[A-Za-z0-9_-]{22,256}={0,2}$")  # >= 22 base64url chars: >= 128 bits


@dataclass(frozen=True, slots=True)
class PrefixCacheConfig:
    mode: CacheMode = CacheMode.ISOLATED
    ttl_s: float = 60.0
    public_prefixes: tuple[tuple[int, ...], ...] = ()  # token sequences

    def __post_init__(self) -> None:
        if self.ttl_s < 0:
            raise ValueError("prefix cache ttl must be >= 0")


def check_salt(salt: object) -> str:
    if not isinstance(salt, str) or not SALT_PATTERN.match(salt):
        raise InvalidRequestError(
            "cache_salt must be at least 22 base64url characters (128 bits of randomness) and at most 256"
        )
    return salt


def domain_of(config: PrefixCacheConfig, salt: str | None) -> bytes | None:
    """The domain a request's own blocks are cached in, or None when they must not be cached."""
    if config.mode is CacheMode.OFF:
        return None
    if config.mode is CacheMode.GLOBAL:
        return b"global"
    if salt is None:
        return None
    return hashlib.sha256(b"traceless/cache-salt\x00" + check_salt(salt).encode()).digest()


def hash_block(parent: bytes, tokens: Sequence[int], domain: bytes) -> bytes:
    h = hashlib.sha256(parent)
    h.update(struct.pack(f"<{len(tokens)}Q", *tokens))
    h.update(struct.pack("<I", len(domain)) + domain)
    return h.digest()


def public_blocks(config: PrefixCacheConfig, tokens: Sequence[int], block_size: int) -> int:
    """How many leading full blocks of `tokens` lie inside a declared public prefix."""
    if config.mode is not CacheMode.ISOLATED:
        return 0
    best = 0
    for prefix in config.public_prefixes:
        n = len(prefix)
        if n > best and len(tokens) >= n and tuple(tokens[:n]) == prefix:
            best = n
    return best // block_size


def block_hashes(
    config: PrefixCacheConfig,
    tokens: Sequence[int],
    domain: bytes | None,
    block_size: int,
    start: int = 0,
    parent: bytes = ROOT,
) -> list[tuple[bytes, tuple[int, ...]]]:
    """(hash, tokens) of the full blocks from block index `start` on that may be cached:
    public-prefix blocks, then (if the request has a domain) its own blocks. Stops at the first
    block that may not be cached."""
    n_public = public_blocks(config, tokens, block_size)
    out = []
    for i in range(start, len(tokens) // block_size):
        d = PUBLIC if i < n_public else domain
        if d is None:
            break
        chunk = tuple(tokens[i * block_size : (i + 1) * block_size])
        parent = hash_block(parent, chunk, d)
        out.append((parent, chunk))
    return out
