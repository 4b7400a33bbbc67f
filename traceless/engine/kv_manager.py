"""Which KV blocks each request owns. No torch.

A request owns exactly the blocks that hold its computed tokens plus the ones it is about to
compute: ceil((num_computed + num_new) / block_size). Freeing a request (whatever way it ended)
returns all of them to the pool, which zeroes them.
"""
from __future__ import annotations

from traceless.engine.block_pool import BlockPool, KVBlock
from traceless.engine.request import Request


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class KVCacheManager:
    def __init__(self, pool: BlockPool, block_size: int):
        self.pool = pool
        self.block_size = block_size
        self._blocks: dict[str, list[KVBlock]] = {}

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Make room for num_new_tokens more computed tokens; False (nothing taken) if full."""
        owned = self._blocks.setdefault(request.request_id, [])
        need = blocks_for(request.num_computed_tokens + num_new_tokens, self.block_size) - len(owned)
        if need <= 0:
            return True
        new = self.pool.allocate(need)
        if new is None:
            return False
        owned.extend(new)
        return True

    def free(self, request: Request) -> None:
        blocks = self._blocks.pop(request.request_id, None)
        if blocks:
            # Tail first: with prefix caching, a request's last blocks are the least reusable,
            # so they should be the first evicted.
            self.pool.free(reversed(blocks))

    def block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self._blocks.get(request_id, ())]

    def num_owners(self) -> int:
        return len(self._blocks)

    def check_integrity(self) -> list[str]:
        problems = self.pool.check_integrity()
        if self._blocks:
            problems.append(f"{len(self._blocks)} request(s) still own KV blocks")
        return problems
