"""Encrypted KV offload: a preempted request's KV blocks, sealed, outside the KV pool.

Each request that is swapped out gets its own AES-256-GCM key, created then and held only in
this process's memory. The sealed blocks go to memory (a dict) or to a spill file in the offload
directory, named at random (no request id on disk). On resume the ciphertext is opened straight
into a staging tensor, copied into fresh blocks, and the staging tensor is zeroed; the file is
unlinked. When the request finishes or is aborted while swapped out, its key is dropped and the
file unlinked: without the key the ciphertext is noise (crypto-shredding).

Plaintext KV never passes through an immutable bytes object: encryption reads the staging
tensor's buffer, decryption writes into one.
"""

from __future__ import annotations

import os
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from traceless.errors import KVRestoreError, KVSpillError
from traceless.model.layers.kv_cache import KVCache
from traceless.modes import KVOffload

NONCE_LEN, TAG_LEN = 12, 16


class OffloadError(KVRestoreError, RuntimeError):
    """A swapped-out request's KV could not be restored (missing, truncated or tampered spill data)."""


class SpillError(KVSpillError, OSError):
    """A request's sealed KV could not be written to the offload directory (full, or not writable)."""


@dataclass
class _Swapped:
    key: bytearray
    num_blocks: int
    nbytes: int
    blob: bytes | None  # memory mode
    path: Path | None  # disk mode


class KVOffloader:
    def __init__(self, cache: KVCache, mode: KVOffload, directory: str | Path | None = None):
        if mode not in (KVOffload.MEMORY, KVOffload.DISK):  # NONE, or not a member at all
            raise ValueError("kv offload mode must be memory or disk")
        self.cache = cache
        self.mode = mode
        self.directory = Path(directory) if directory is not None else None
        if mode is KVOffload.DISK:
            if self.directory is None:
                raise ValueError("disk offload needs a directory (--kv-offload-dir)")
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._swapped: dict[str, _Swapped] = {}
        self.bytes_out = self.bytes_in = 0

    # --- staging: the request's blocks as one flat uint8 tensor ------------------------------------
    def _gather(self, block_ids: list[int]) -> torch.Tensor:
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.cache.k.device)
        k, v = self.cache.k[:, idx], self.cache.v[:, idx]  # [L, n, ...] copies
        flat = torch.cat([k.reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)])
        staged = flat.cpu() if flat.is_cuda else flat
        # Every device temporary that held the K/V is zeroed before the allocator may reuse it.
        k.zero_()
        v.zero_()
        if flat.is_cuda:
            flat.zero_()
        return staged

    def _scatter(self, block_ids: list[int], staged: torch.Tensor) -> None:
        self.cache.flush()  # zeroing still pending for these (just freed) blocks must not come after
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.cache.k.device)
        kshape = (self.cache.k.shape[0], len(block_ids), *self.cache.k.shape[2:])
        vshape = (self.cache.v.shape[0], len(block_ids), *self.cache.v.shape[2:])
        half = staged.numel() // 2
        k = staged[:half].view(self.cache.k.dtype).view(kshape).to(self.cache.k.device)
        v = staged[half:].view(self.cache.v.dtype).view(vshape).to(self.cache.v.device)
        self.cache.k[:, idx] = k
        self.cache.v[:, idx] = v
        if k.is_cuda:  # device copies of the plaintext K/V: zeroed, not left to the allocator
            k.zero_()
            v.zero_()

    @staticmethod
    def _aad(num_blocks: int, nbytes: int) -> bytes:
        return b"traceless/kv-offload/v1" + struct.pack("<QQ", num_blocks, nbytes)

    # --- the three operations ----------------------------------------------------------------------
    def save(self, request_id: str, block_ids: list[int]) -> None:
        """Seal the KV of these blocks (the caller then frees and zeroes them)."""
        staged = self._gather(block_ids)
        key = bytearray(secrets.token_bytes(32))
        nonce = secrets.token_bytes(NONCE_LEN)
        try:
            ct = AESGCM(key).encrypt(nonce, staged.numpy().data, self._aad(len(block_ids), staged.numel()))
        finally:
            staged.zero_()
        entry = _Swapped(key, len(block_ids), staged.numel(), None, None)
        if self.mode is KVOffload.MEMORY:
            entry.blob = nonce + ct
        else:
            if self.directory is None:  # cannot happen: __init__ refuses disk mode without a directory
                raise RuntimeError("disk offload has no directory")
            entry.path = self.directory / secrets.token_hex(16)
            try:
                _write_spill(entry.path, nonce + ct)
            except OSError:
                self._forget(entry)  # the key is wiped and a partial file unlinked: nothing stays behind
                raise SpillError("the KV offload directory could not hold a sealed request") from None
        self._swapped[request_id] = entry
        self.bytes_out += staged.numel()

    def restore(self, request_id: str, block_ids: list[int]) -> None:
        """Open the request's sealed KV into these (fresh) blocks, then forget it."""
        entry = self._swapped.pop(request_id, None)
        if entry is None or len(block_ids) != entry.num_blocks:
            raise OffloadError("no swapped-out KV of that size for this request")
        staged = torch.empty(entry.nbytes, dtype=torch.uint8)
        try:
            if entry.blob is not None:
                data = entry.blob
            elif entry.path is not None:
                data = entry.path.read_bytes()
            else:
                raise OffloadError("swapped-out KV has neither a blob nor a spill file")
            AESGCM(entry.key).decrypt_into(
                data[:NONCE_LEN], data[NONCE_LEN:], self._aad(entry.num_blocks, entry.nbytes), staged.numpy().data
            )
        except Exception:
            # decrypt_into writes the unauthenticated plaintext before it checks the tag and raises
            # InvalidTag: none of it may outlive the failure.
            staged.zero_()
            raise OffloadError("swapped-out KV failed to decrypt") from None
        finally:
            self._forget(entry)
        try:
            self._scatter(block_ids, staged)
        finally:
            staged.zero_()
        self.bytes_in += entry.nbytes

    def discard(self, request_id: str) -> None:
        """The request ended while swapped out: destroy its key and its ciphertext."""
        entry = self._swapped.pop(request_id, None)
        if entry is not None:
            self._forget(entry)

    def _forget(self, entry: _Swapped) -> None:
        entry.key[:] = bytes(len(entry.key))
        entry.blob = None
        if entry.path is not None:
            entry.path.unlink(missing_ok=True)

    def is_swapped(self, request_id: str) -> bool:
        return request_id in self._swapped

    def num_swapped(self) -> int:
        return len(self._swapped)


def _write_spill(path: Path, data: bytes) -> None:
    """Create `path` (0600, never an existing file) holding `data`; OSError when the directory is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
