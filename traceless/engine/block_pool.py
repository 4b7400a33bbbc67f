"""Fixed-size KV blocks: reference counts, an O(1) free queue, and zero on free.

No torch here: the pool tracks block ids; the tensors live in the model runner, which hands the
pool a `zero(block_ids)` callback. Invariant: a block that reaches the free queue holds zeros.
The pool calls `zero` before the block becomes allocatable, on every path that frees a block
(finish, stop, abort, error, preemption).

Block 0 is the null block: never allocated, always zero. Padded block tables point at it, so
padding never reads another request's KV.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

NULL_BLOCK_ID = 0


class KVBlock:
    __slots__ = ("block_id", "ref_cnt", "prev_free", "next_free")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.prev_free: KVBlock | None = None
        self.next_free: KVBlock | None = None

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt})"


class FreeBlockQueue:
    """Doubly linked list of free blocks: popleft, append and remove-from-middle are O(1).

    Freed blocks go to the tail and allocation takes from the head, so the least recently freed
    block is reused first (LRU order, which prefix caching relies on for eviction).
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
        self.remove(block)
        return block

    def __iter__(self):
        block = self._head.next_free
        while block is not self._tail:
            yield block
            block = block.next_free


class BlockPool:
    def __init__(self, num_blocks: int, zero: Callable[[list[int]], None]):
        if num_blocks < 2:
            raise ValueError("the KV pool needs at least 2 blocks (block 0 is reserved)")
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._zero = zero
        self.free_queue = FreeBlockQueue(self.blocks[1:])

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
        """n zeroed blocks with ref_cnt 1, or None (and nothing taken) if fewer are free."""
        if n > self.free_queue.num_free:
            return None
        out = []
        for _ in range(n):
            block = self.free_queue.popleft()
            block.ref_cnt = 1
            out.append(block)
        return out

    def free(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference from each block; blocks that reach zero are zeroed, then freed."""
        released = []
        for block in blocks:
            if block.ref_cnt <= 0:
                raise ValueError(f"double free of block {block.block_id}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                released.append(block)
        if released:
            self._zero([b.block_id for b in released])
            for block in released:
                self.free_queue.append(block)

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
        return problems
