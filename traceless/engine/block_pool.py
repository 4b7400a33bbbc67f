"""Fixed-size KV blocks: reference counts, an O(1) free queue, zero on free, and the prefix cache's
block index.

No torch here: the pool tracks block ids; the tensors live in the model runner, which hands the
pool a `zero(block_ids)` callback. Invariant: every block in the free queue holds zeros, except a
*cached* block (one with a block hash: prefix caching), which keeps its KV until it is reused for
another prefix hit, evicted for space, or expires -- and eviction and expiry zero it.

Block 0 is the null block: never allocated, always zero. Padded block tables point at it, so
padding never reads another request's KV.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator

NULL_BLOCK_ID = 0


class KVBlock:
    __slots__ = ("block_id", "ref_cnt", "prev_free", "next_free", "block_hash", "tokens", "released_at")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.prev_free: KVBlock | None = None
        self.next_free: KVBlock | None = None
        self.block_hash: bytes | None = None  # set while the block is in the prefix cache
        self.tokens: tuple[int, ...] | None = None  # what the cached KV was computed from (checked on hits)
        self.released_at = 0.0

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """Doubly linked list of free blocks: popleft, append and remove-from-middle are O(1).

    Freed blocks go to the tail and allocation takes from the head, so the least recently freed
    block is reused first (LRU order: cached prefixes are evicted oldest first, and expiry can stop
    at the first cached block that is still young).
    """

    def __init__(self, blocks: Iterable[KVBlock]):
        self._head = KVBlock(-1)  # sentinels
        self._tail = KVBlock(-1)
        self._head.next_free, self._tail.prev_free = self._tail, self._head
        self.num_free = 0
        for b in blocks:
            self.append(b)

    def append(self, block: KVBlock) -> None:
        last = self._tail.prev_free
        if last is None:
            raise RuntimeError("free queue is broken: the tail sentinel is unlinked")
        last.next_free, block.prev_free = block, last
        block.next_free, self._tail.prev_free = self._tail, block
        self.num_free += 1

    def remove(self, block: KVBlock) -> None:
        if block.prev_free is None or block.next_free is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        block.prev_free.next_free, block.next_free.prev_free = block.next_free, block.prev_free
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def popleft(self) -> KVBlock:
        block = self._head.next_free
        if block is self._tail:
            raise IndexError("no free blocks")
        if block is None:
            raise RuntimeError("free queue is broken: the head sentinel is unlinked")
        self.remove(block)
        return block

    def __iter__(self) -> Iterator[KVBlock]:
        block = self._head.next_free
        while block is not self._tail:
            if block is None:
                raise RuntimeError("free queue is broken: a block before the tail is unlinked")
            yield block
            block = block.next_free


class BlockPool:
    def __init__(self, num_blocks: int, zero: Callable[[list[int]], None], clock: Callable[[], float] = time.monotonic):
        if num_blocks < 2:
            raise ValueError("the KV pool needs at least 2 blocks (block 0 is reserved)")
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._zero = zero
        self._clock = clock
        self.free_queue = FreeBlockQueue(self.blocks[1:])
        self.cached: dict[bytes, KVBlock] = {}
        # cached blocks that are free, oldest release first: what expiry walks (not the whole queue)
        self._cached_free: OrderedDict[int, KVBlock] = OrderedDict()

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free

    @property
    def num_usable_blocks(self) -> int:
        return len(self.blocks) - 1

    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def allocate(self, n: int) -> list[KVBlock] | None:
        """n zeroed blocks with ref_cnt 1, or None (and nothing taken) if fewer are free.
        Cached blocks taken from the free queue are evicted from the prefix cache and zeroed."""
        if n > self.free_queue.num_free:
            return None
        out = [self.free_queue.popleft() for _ in range(n)]
        evicted = [b for b in out if b.block_hash is not None]
        for b in evicted:
            self._cached_free.pop(b.block_id, None)
            self._uncache(b)
        if evicted:
            self._zero([b.block_id for b in evicted])
        for b in out:
            b.ref_cnt = 1
        return out

    def free(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference from each block. A block that reaches zero is zeroed and freed,
        unless it is in the prefix cache: then it stays resident (until reuse, eviction or expiry)."""
        released, to_zero = [], []
        now = self._clock()
        for block in blocks:
            if block.ref_cnt <= 0:
                raise ValueError(f"double free of block {block.block_id}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                block.released_at = now
                released.append(block)
                if block.block_hash is None:
                    to_zero.append(block.block_id)
        if to_zero:
            self._zero(to_zero)
        for block in released:
            self.free_queue.append(block)
            if block.block_hash is not None:
                self._cached_free[block.block_id] = block

    # --- prefix cache index -----------------------------------------------------------------------
    def lookup(self, block_hash: bytes, tokens: tuple[int, ...]) -> KVBlock | None:
        """The cached block for this hash *and* these exact tokens, or None."""
        block = self.cached.get(block_hash)
        if block is None or block.tokens != tokens:
            return None
        return block

    def touch(self, block: KVBlock) -> None:
        """Take a reference on a cached block found by lookup (reviving it if it was free)."""
        if block.ref_cnt == 0:
            self.free_queue.remove(block)
            self._cached_free.pop(block.block_id, None)
        block.ref_cnt += 1

    def cache(self, block: KVBlock, block_hash: bytes, tokens: tuple[int, ...]) -> bool:
        """Register a computed, full block under its hash; False if another block already has it."""
        if block_hash in self.cached or block.block_hash is not None:
            return False
        block.block_hash, block.tokens = block_hash, tokens
        self.cached[block_hash] = block
        return True

    def _uncache(self, block: KVBlock) -> None:
        if block.block_hash is None:
            raise RuntimeError(f"block {block.block_id} is not in the prefix cache")
        del self.cached[block.block_hash]
        block.block_hash, block.tokens = None, None

    def expire(self, ttl_s: float, now: float | None = None) -> int:
        """Evict and zero cached free blocks released more than ttl_s ago; returns how many."""
        now = self._clock() if now is None else now
        expired = []
        for block in self._cached_free.values():  # release order: stop at the first one still young
            if block.released_at + ttl_s > now:
                break
            expired.append(block)
        for block in expired:
            del self._cached_free[block.block_id]
            self.free_queue.remove(block)
            self._uncache(block)
        if expired:
            self._zero([b.block_id for b in expired])
            for block in expired:  # zero now: back to the tail of the free queue as a plain block
                self.free_queue.append(block)
        return len(expired)

    def drop_cache(self) -> int:
        """Evict and zero every cached free block (shutdown; tests)."""
        return self.expire(-1.0, now=float("inf"))

    def check_integrity(self) -> list[str]:
        """Problems found in the pool's bookkeeping (empty list when consistent)."""
        problems = []
        free_ids = [b.block_id for b in self.free_queue]
        if len(free_ids) != self.free_queue.num_free:
            problems.append("free queue length does not match its counter")
        if len(set(free_ids)) != len(free_ids):
            problems.append("a block is in the free queue twice")
        if NULL_BLOCK_ID in free_ids:
            problems.append("the null block is in the free queue")
        for b in self.blocks[1:]:
            in_queue = b.prev_free is not None
            if in_queue and b.ref_cnt != 0:
                problems.append(f"block {b.block_id} is free but referenced")
            if not in_queue and b.ref_cnt == 0:
                problems.append(f"block {b.block_id} is unreferenced but not free (leak)")
            if b.block_hash is not None and self.cached.get(b.block_hash) is not b:
                problems.append(f"block {b.block_id} has a hash the cache index does not map to it")
        if any(block.block_hash != h for h, block in self.cached.items()):
            problems.append("the cache index maps a hash to a block with another hash")
        if self.cached:
            problems.append(f"{len(self.cached)} block(s) still in the prefix cache")
        return problems
