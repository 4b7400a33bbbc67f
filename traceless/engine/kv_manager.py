"""Which KV blocks each request owns, and prefix-cache hits and inserts. No torch.

A request owns the blocks that hold its computed tokens plus the ones it is about to compute:
ceil((num_computed + num_new) / block_size). With prefix caching, its leading blocks may be
cached blocks it shares (by reference) with requests of the same domain; each block it fills is
registered in the cache as soon as it is full. Freeing a request returns every reference; blocks
that reach zero references are zeroed unless they stay cached (until reuse, eviction or expiry).

Sliding window (every layer of the model sees only the last W keys: Mistral, Phi-3): the query at
position p reads keys (p - W, p], so once a request has computed c tokens, the blocks holding only
keys below c - W + 1 are dead for every later query. They are freed (zeroed, or left in the prefix
cache like any freed cached block) right after the step that killed them, and their slot in the
request's list becomes None (block id 0, the null block, in its table): a long generation holds
about W / block_size + 1 blocks.

             dead (freed)          live: the window of the next query at c
    |  None  |  None  | None |  b3  |  b4  |  b5  |
                             ^ (c - W + 1) // block_size

A prefix hit still needs every leading block resident (the chained hashes are looked up in
order), but takes references only on the hit blocks inside its window; the dead ones are counted
and skipped. Preemption by swapping seals and restores the live blocks only.
"""
from __future__ import annotations

from collections.abc import Sequence

from traceless.engine.block_pool import NULL_BLOCK_ID, BlockPool, KVBlock
from traceless.engine.prefix_cache import LONG_CONTEXT_ROOT, ROOT, PrefixCacheConfig, block_hashes
from traceless.engine.request import Request
from traceless.modes import CacheMode


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def _root(request: Request) -> bytes:
    """The parent of a request's first block hash: LongRoPE's long-factor KV differs from the
    short-factor KV of the same tokens, so the two chains never meet."""
    return LONG_CONTEXT_ROOT if request.long_context else ROOT


class KVCacheManager:
    def __init__(self, pool: BlockPool, block_size: int, cache: PrefixCacheConfig | None = None, offloader=None,
                 window: int | None = None):
        """`offloader` (runner/offload.py: save, restore, discard, is_swapped) seals a preempted
        request's KV instead of letting it be recomputed; None = preemption by recompute.
        `window`: the model's sliding window when every layer has it (ModelInfo.kv_window)."""
        self.pool = pool
        self.block_size = block_size
        self.cache = cache or PrefixCacheConfig(CacheMode.OFF)
        self.offloader = offloader
        self.window = window
        self._blocks: dict[str, list[KVBlock | None]] = {}  # None: a block freed out of the window
        self._hashes: dict[str, list[bytes]] = {}  # hash chain of the request's cached leading blocks
        self._live_from: dict[str, int] = {}  # window: index of the request's first block not yet freed

    def _dead_blocks(self, next_position: int) -> int:
        """Leading blocks no query at next_position or later reads (0 without a window)."""
        if self.window is None:
            return 0
        return max(0, next_position - self.window + 1) // self.block_size

    @property
    def caching(self) -> bool:
        return self.cache.mode is not CacheMode.OFF

    def computed_blocks(self, request: Request) -> list[KVBlock]:
        """Cached blocks holding the request's leading tokens (its domain or public), longest
        verified run; at least one token is always left to compute (its logits give the next token)."""
        if not self.caching:
            return []
        tokens = request.token_ids(0, request.num_tokens)
        hits = []
        for h, chunk in block_hashes(self.cache, tokens, request.domain, self.block_size, parent=_root(request)):
            block = self.pool.lookup(h, chunk)
            if block is None:
                break
            hits.append(block)
        if hits and len(hits) * self.block_size >= request.num_tokens:
            hits.pop()
        return hits

    def allocate_slots(self, request: Request, num_new_tokens: int, computed: Sequence[KVBlock] = ()) -> bool:
        """Reference `computed` (prefix hits, for a request that starts now) and allocate blocks
        for num_new_tokens more tokens after them; False (nothing taken) if the pool is short."""
        owned = self._blocks.setdefault(request.request_id, [])
        start = request.num_computed_tokens + len(computed) * self.block_size
        total = blocks_for(start + num_new_tokens, self.block_size)
        # new entries [len(owned), total): None below the window, then the hits, then new blocks
        skip = max(0, min(self._dead_blocks(start), total) - len(owned))
        hits = list(computed[skip:])
        need = total - len(owned) - max(skip, len(computed))
        revived = sum(1 for b in hits if b.ref_cnt == 0)  # free cached blocks leave the free queue
        if need > 0 and need > self.pool.num_free_blocks - revived:
            if not owned:
                del self._blocks[request.request_id]
            return False
        if computed:
            hashes = [b.block_hash for b in computed if b.block_hash is not None]
            if len(hashes) != len(computed):
                raise RuntimeError("a prefix hit is not in the prefix cache")
            self._hashes[request.request_id] = hashes
        for b in hits:
            self.pool.touch(b)
        owned.extend([None] * skip)
        owned.extend(hits)
        if need > 0:
            new = self.pool.allocate(need)
            if new is None:  # cannot happen: `need` was checked against the free blocks above
                raise RuntimeError("the block pool ran short after its free-block check")
            owned.extend(new)
        if self.window is not None:
            self._live_from[request.request_id] = max(self._live_from.get(request.request_id, 0), skip)
        return True

    def cache_full_blocks(self, request: Request) -> None:
        """Register the request's newly filled blocks in the prefix cache."""
        if not self.caching:
            return
        hashes = self._hashes.setdefault(request.request_id, [])
        n_full = request.num_computed_tokens // self.block_size
        if n_full <= len(hashes):
            return
        owned = self._blocks[request.request_id]
        tokens = request.token_ids(0, n_full * self.block_size)
        new = block_hashes(self.cache, tokens, request.domain, self.block_size, start=len(hashes),
                           parent=hashes[-1] if hashes else _root(request))
        for i, (h, chunk) in enumerate(new, start=len(hashes)):
            block = owned[i]
            if block is not None:  # (a block is cached before the window can free it)
                self.pool.cache(block, h, chunk)  # False if an identical block is already cached
            hashes.append(h)

    def free_out_of_window(self, request: Request) -> int:
        """Free the request's blocks that no later query reads (sliding window); how many."""
        owned = self._blocks.get(request.request_id)
        if self.window is None or not owned:
            return 0
        first = self._live_from.get(request.request_id, 0)
        dead = min(self._dead_blocks(request.num_computed_tokens), len(owned))
        if dead <= first:
            return 0
        out = [b for b in owned[first:dead] if b is not None]
        owned[first:dead] = [None] * (dead - first)
        self._live_from[request.request_id] = dead
        self.pool.free(out)
        return len(out)

    # --- encrypted offload -------------------------------------------------------------------------
    @property
    def can_offload(self) -> bool:
        return self.offloader is not None

    def is_swapped(self, request: Request) -> bool:
        return self.offloader is not None and self.offloader.is_swapped(request.request_id)

    def swap_out(self, request: Request) -> None:
        """Seal the KV of the request's computed tokens, then release its blocks (zeroed)."""
        self.free_out_of_window(request)
        self.offloader.save(request.request_id, self._live_ids(request))
        self._release(request)

    def swap_in(self, request: Request) -> None:
        """Restore the sealed KV into the request's (just allocated) leading blocks."""
        self.offloader.restore(request.request_id, self._live_ids(request))

    def _live_ids(self, request: Request) -> list[int]:
        """Ids of the blocks holding the request's computed tokens that the window kept."""
        n = blocks_for(request.num_computed_tokens, self.block_size)
        return [b.block_id for b in self._blocks[request.request_id][:n] if b is not None]

    def free(self, request: Request) -> None:
        """The request is over: release its blocks and destroy any sealed copy of its KV."""
        if self.offloader is not None:
            self.offloader.discard(request.request_id)
        self._release(request)

    def _release(self, request: Request) -> None:
        self._hashes.pop(request.request_id, None)
        self._live_from.pop(request.request_id, None)
        blocks = self._blocks.pop(request.request_id, None)
        if blocks:
            # Tail first: a request's last blocks are its least reusable, so they go to the LRU
            # position that is evicted first.
            self.pool.free(b for b in reversed(blocks) if b is not None)

    def num_blocks(self, request_id: str) -> int:
        return len(self._blocks.get(request_id, ()))

    def block_ids(self, request_id: str) -> list[int]:
        """The request's block table; a block freed out of the window reads as the null block."""
        return [NULL_BLOCK_ID if b is None else b.block_id for b in self._blocks.get(request_id, ())]

    def num_live_blocks(self, request_id: str) -> int:
        return sum(1 for b in self._blocks.get(request_id, ()) if b is not None)

    def num_owners(self) -> int:
        return len(self._blocks)

    def check_integrity(self) -> list[str]:
        problems = self.pool.check_integrity()
        if self._blocks or self._hashes:
            problems.append(f"{len(self._blocks)} request(s) still own KV blocks")
        if self._live_from:
            problems.append(f"{len(self._live_from)} request(s) still have sliding-window bookkeeping")
        for rid, owned in self._blocks.items():
            first = self._live_from.get(rid, 0)
            if any(b is None for b in owned[first:]) or any(b is not None for b in owned[:first]):
                problems.append("a request's freed-block marks disagree with its window bookkeeping")
        if self.offloader is not None and self.offloader.num_swapped():
            problems.append(f"{self.offloader.num_swapped()} request(s) still have swapped-out KV")
        return problems
