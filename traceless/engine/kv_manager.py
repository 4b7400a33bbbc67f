"""Which KV blocks each request owns, per KV group, and prefix-cache hits and inserts. No torch.

A model's layers form KV groups (model/kv_groups.py): one group of every layer, or, when local
(sliding-window) and global layers mix (Gemma 2/3), groups of each kind. Every group keeps its own
block table per request over the one shared pool: blocks for the computed tokens plus the ones it
is about to compute, ceil((num_computed + num_new) / block_size) entries. Allocating for a request
takes the blocks of every group at once, or none. With prefix caching, leading entries may be
cached blocks shared (by reference) with requests of the same domain; each block is registered in
the cache, under its group, as soon as it is full. Freeing a request returns every reference;
blocks that reach zero references are zeroed unless they stay cached (until reuse, eviction or
expiry).

Sliding window (a group whose layers see only the last W keys: Mistral's every layer, Gemma's local
ones): the query at position p reads keys (p - W, p], so once a request has computed c tokens the
group's blocks holding only keys below c - W + 1 are dead for every later query. They are freed
(zeroed, or left in the prefix cache like any freed cached block) right after the step that killed
them, and their entry becomes None (block id 0, the null block, in the table): the group holds
about W / block_size + 1 blocks however long the request grows, while a global group holds all.

             dead (freed)          live: the window of the next query at c
    |  None  |  None  | None |  b3  |  b4  |  b5  |
                             ^ (c - W + 1) // block_size

A prefix hit of n blocks needs, in every global group, all n blocks cached, and in every windowed
group only the blocks its window still reads at position n * block_size (the ones below were
freed, possibly evicted and zeroed: never taken). Preemption by swapping seals and restores the
live blocks of every group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


def _group_key(block_hash: bytes, group: int) -> bytes:
    """The prefix cache's key of a group's block: one chain of hashes, one block per group."""
    return block_hash if group == 0 else block_hash + group.to_bytes(2, "little")


def _last_missing(found: list[KVBlock | None]) -> list[int]:
    """out[i]: the last index j < i with found[j] None, -1 when none (len(found) + 1 entries)."""
    out, last = [-1], -1
    for j, b in enumerate(found):
        if b is None:
            last = j
        out.append(last)
    return out


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """The request's leading full blocks whose KV is cached: per group, the cached block of each
    (None where the group's window no longer reads it), and the chain of their hashes."""

    blocks: tuple[tuple[KVBlock | None, ...], ...]  # [group][block index < num_blocks]
    hashes: tuple[bytes, ...]

    @property
    def num_blocks(self) -> int:
        return len(self.hashes)


class KVCacheManager:
    def __init__(
        self,
        pool: BlockPool,
        block_size: int,
        cache: PrefixCacheConfig | None = None,
        offloader=None,
        windows: Sequence[int] = (0,),
    ):
        """`offloader` (runner/offload.py: save, restore, discard, is_swapped) seals a preempted
        request's KV instead of letting it be recomputed; None = preemption by recompute.
        `windows`: per KV group, the keys its layers see behind a query, 0 for all (ModelInfo.kv_windows)."""
        if not windows or any(w < 0 for w in windows):
            raise ValueError("every KV group needs a window >= 0 (0: every key)")
        self.pool = pool
        self.block_size = block_size
        self.cache = cache or PrefixCacheConfig(CacheMode.OFF)
        self.offloader = offloader
        self.windows = tuple(windows)
        self._windowed = tuple(g for g, w in enumerate(self.windows) if w)  # the groups that free blocks
        # per request, per group: its blocks (None: freed out of the window)
        self._blocks: dict[str, list[list[KVBlock | None]]] = {}
        self._hashes: dict[str, list[bytes]] = {}  # hash chain of the request's cached leading blocks
        self._live_from: dict[str, list[int]] = {}  # per group: index of the first block not yet freed

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    def _dead_blocks(self, group: int, next_position: int) -> int:
        """Leading blocks of a group that no query at next_position or later reads (0 without a window)."""
        w = self.windows[group]
        return max(0, next_position - w + 1) // self.block_size if w else 0

    @property
    def caching(self) -> bool:
        return self.cache.mode is not CacheMode.OFF

    def prefix_hit(self, request: Request) -> PrefixHit | None:
        """Cached blocks holding the request's leading tokens (its domain or public), the longest
        run every group has; at least one token is always left to compute (its logits give the
        next token). None without a hit."""
        if not self.caching:
            return None
        tokens = request.token_ids(0, request.num_tokens)
        chain = block_hashes(self.cache, tokens, request.domain, self.block_size, parent=_root(request))
        chain = chain[: (request.num_tokens - 1) // self.block_size]
        found = self._lookup(chain)
        n = self._hit_length(found)
        if n == 0:
            return None
        blocks = tuple(
            tuple(b if i >= self._dead_blocks(g, n * self.block_size) else None for i, b in enumerate(f[:n]))
            for g, f in enumerate(found)
        )
        return PrefixHit(blocks, tuple(h for h, _ in chain[:n]))

    def _lookup(self, chain: list[tuple[bytes, tuple[int, ...]]]) -> list[list[KVBlock | None]]:
        """Per group, its cached block of each chained hash (None where it has none): a global group's
        run up to its first miss, a windowed group's up to the shortest global run so far."""
        found: list[list[KVBlock | None]] = []
        limit = len(chain)
        for g, w in enumerate(self.windows):
            f: list[KVBlock | None] = []
            for h, chunk in chain[:limit]:
                block = self.pool.lookup(_group_key(h, g), chunk)
                if block is None and not w:
                    break
                f.append(block)
            limit = limit if w else len(f)
            found.append(f)
        return found

    def _hit_length(self, found: list[list[KVBlock | None]]) -> int:
        """The most leading blocks n such that every group has the blocks it reads at n * block_size."""
        n = min(len(f) for f in found)
        # a windowed group needs only blocks [dead, n): the last block it lacks below n must lie below
        # dead. missing[g][i]: the last index < i whose block group g lacks (-1: none).
        missing = {g: _last_missing(found[g]) for g in self._windowed}
        while n > 0 and any(missing[g][n] >= self._dead_blocks(g, n * self.block_size) for g in self._windowed):
            n -= 1
        return n

    def allocate_slots(self, request: Request, num_new_tokens: int, hit: PrefixHit | None = None) -> bool:
        """Reference the hit's blocks (for a request that starts now) and allocate every group's
        blocks for num_new_tokens more tokens after them; False (nothing taken) if the pool is short."""
        rid = request.request_id
        existing = self._blocks.get(rid)
        owned = existing or [[] for _ in self.windows]
        n_hit = hit.num_blocks if hit is not None else 0
        start = request.num_computed_tokens + n_hit * self.block_size
        total = blocks_for(start + num_new_tokens, self.block_size)
        if existing and total <= len(existing[0]):  # (every group's table is as long): nothing to take
            return True
        # per group, new entries [len(owned), total): None below the window, then hits, then new blocks
        plans: list[tuple[int, list[KVBlock], int]] = []  # per group: (entries left None, hits, new blocks)
        for g, own in enumerate(owned):
            lo = max(len(own), min(self._dead_blocks(g, start), total))
            hits = [b for b in (hit.blocks[g][lo:] if hit is not None else ()) if b is not None]
            plans.append((lo - len(own), hits, total - lo - len(hits)))
        need = sum(max(0, new) for _, _, new in plans)
        revived = sum(1 for _, hits, _ in plans for b in hits if b.ref_cnt == 0)  # leave the free queue
        if need > 0 and need > self.pool.num_free_blocks - revived:
            return False
        if hit is not None:
            self._hashes[rid] = list(hit.hashes)
        live = self._live_from.setdefault(rid, [0] * self.num_groups)
        for g, (own, (skip, hits, new)) in enumerate(zip(owned, plans)):
            for b in hits:
                self.pool.touch(b)
            if skip:  # (only a request that owns nothing yet starts behind its window)
                live[g] = len(own) + skip
            own.extend([None] * skip)
            own.extend(hits)
            if new > 0:
                got = self.pool.allocate(new)
                if got is None:  # cannot happen: `need` was checked against the free blocks above
                    raise RuntimeError("the block pool ran short after its free-block check")
                own.extend(got)
        self._blocks[rid] = owned
        return True

    def blocks_to_reach(self, request_id: str, num_tokens: int) -> int:
        """Blocks allocating for num_tokens would take at most (every group, none freed first)."""
        owned = self._blocks.get(request_id) or [[] for _ in self.windows]
        return sum(max(0, blocks_for(num_tokens, self.block_size) - len(own)) for own in owned)

    def cache_full_blocks(self, request: Request) -> None:
        """Register the request's newly filled blocks in the prefix cache, in every group."""
        if not self.caching:
            return
        hashes = self._hashes.setdefault(request.request_id, [])
        n_full = request.num_computed_tokens // self.block_size
        if n_full <= len(hashes):
            return
        owned = self._blocks[request.request_id]
        tokens = request.token_ids(0, n_full * self.block_size)
        new = block_hashes(
            self.cache,
            tokens,
            request.domain,
            self.block_size,
            start=len(hashes),
            parent=hashes[-1] if hashes else _root(request),
        )
        for i, (h, chunk) in enumerate(new, start=len(hashes)):
            for g, own in enumerate(owned):
                block = own[i]
                if block is not None:  # (a block is cached before the window can free it)
                    self.pool.cache(block, _group_key(h, g), chunk)  # False if an identical one is cached
            hashes.append(h)

    def free_out_of_window(self, request: Request) -> int:
        """Free the request's blocks that no later query reads (windowed groups); how many."""
        owned = self._blocks.get(request.request_id)
        if not owned or not self._windowed:
            return 0
        live = self._live_from[request.request_id]
        out: list[KVBlock] = []
        for g in self._windowed:
            own = owned[g]
            dead = min(self._dead_blocks(g, request.num_computed_tokens), len(own))
            if dead > live[g]:
                out += [b for b in own[live[g] : dead] if b is not None]
                own[live[g] : dead] = [None] * (dead - live[g])
                live[g] = dead
        if out:
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
        """Ids of the blocks holding the request's computed tokens that the windows kept, group by
        group (a resumed request gets as many per group: its windows start at the same place)."""
        n = blocks_for(request.num_computed_tokens, self.block_size)
        return [b.block_id for own in self._blocks[request.request_id] for b in own[:n] if b is not None]

    def free(self, request: Request) -> None:
        """The request is over: release its blocks and destroy any sealed copy of its KV."""
        if self.offloader is not None:
            self.offloader.discard(request.request_id)
        self._release(request)

    def _release(self, request: Request) -> None:
        self._hashes.pop(request.request_id, None)
        self._live_from.pop(request.request_id, None)
        owned = self._blocks.pop(request.request_id, None)
        for blocks in owned or ():
            # Tail first: a request's last blocks are its least reusable, so they go to the LRU
            # position that is evicted first.
            self.pool.free(b for b in reversed(blocks) if b is not None)

    def num_blocks(self, request_id: str) -> int:
        """Entries of the request's block table (group 0's; every group's has as many)."""
        owned = self._blocks.get(request_id)
        return len(owned[0]) if owned else 0

    def block_ids(self, request_id: str, group: int = 0) -> list[int]:
        """A group's block table of the request; a block freed out of the window reads as the null block."""
        owned = self._blocks.get(request_id)
        return [NULL_BLOCK_ID if b is None else b.block_id for b in owned[group]] if owned else []

    def group_tables(self, request_id: str) -> tuple[tuple[int, ...], ...]:
        """The block tables of groups 1.. (the plan's ScheduledSeq.group_tables)."""
        if self.num_groups == 1:
            return ()
        return tuple(tuple(self.block_ids(request_id, g)) for g in range(1, self.num_groups))

    def num_live_blocks(self, request_id: str, group: int | None = None) -> int:
        """Blocks the request holds now: in one group, or in all of them."""
        owned = self._blocks.get(request_id) or []
        groups = owned if group is None else owned[group : group + 1]
        return sum(1 for own in groups for b in own if b is not None)

    def live_blocks_by_group(self) -> list[int]:
        """Blocks the requests hold now in each group (all requests together)."""
        return [
            sum(1 for owned in self._blocks.values() for b in owned[g] if b is not None) for g in range(self.num_groups)
        ]

    def num_owners(self) -> int:
        return len(self._blocks)

    def check_integrity(self) -> list[str]:
        problems = self.pool.check_integrity()
        if self._blocks or self._hashes:
            problems.append(f"{len(self._blocks)} request(s) still own KV blocks")
        if self._live_from and any(self.windows):
            problems.append(f"{len(self._live_from)} request(s) still have sliding-window bookkeeping")
        for rid, owned in self._blocks.items():
            live = self._live_from.get(rid, [0] * self.num_groups)
            for own, first in zip(owned, live):
                if any(b is None for b in own[first:]) or any(b is not None for b in own[:first]):
                    problems.append("a request's freed-block marks disagree with its window bookkeeping")
        if self.offloader is not None and self.offloader.num_swapped():
            problems.append(f"{self.offloader.num_swapped()} request(s) still have swapped-out KV")
        return problems
