"""KV cache groups: which layers share a block table. No torch.

Layers that see every key (global) keep every block of a request; layers with a sliding window
(local) need only the blocks of the last W keys. A model mixing both (Gemma 2 alternating, Gemma 3
with five local layers to one global) so keeps one block table per *group* of layers: a local
group's blocks behind the window are freed while the request runs, the global group's are not.

Every block of the one shared pool has the same size (the scheduler counts free blocks in one
number), so every group has the same number of layers, S: the fewest layers of any kind. A kind
with more layers gets several groups (the last one may have unused slots). The cache tensors hold
S layer *slots*, not one per layer:

    k: [S, num_blocks, kv_heads, head_dim, block_size]     layer i lives in slot slot[i]
    block b belongs to one group at a time: slot s of b holds layer (group of b, s)

    Gemma 3, 12 layers (L L L L L G) x 2:  S = 2; groups: G {5, 11}, L {0, 1}, L {2, 3}, L {4, 6}, ...

A model whose layers are all of one kind has one group of every layer (S = L): the plain cache.
Global groups come first, so group 0 holds every block of a request whenever any layer is global.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KVGroups:
    windows: tuple[int, ...]  # per group: the keys its layers see behind a query (0: every key)
    layer_group: tuple[int, ...]  # per layer: its group
    layer_slot: tuple[int, ...]  # per layer: its slot in the cache tensors' first dimension
    num_slots: int  # S: layers per group, the cache tensors' first dimension

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def hybrid(self) -> bool:
        """Whether some groups keep every block and others free theirs (local and global layers)."""
        return len(set(self.windows)) > 1


def kv_groups(layer_windows: Sequence[int], num_layers: int) -> KVGroups:
    """The groups of a model whose layer i sees layer_windows[i] keys (0: all; empty: all layers 0)."""
    windows = list(layer_windows) or [0] * num_layers
    kinds = sorted(set(windows))  # 0 (global) first
    if len(kinds) == 1:
        return KVGroups((kinds[0],), (0,) * num_layers, tuple(range(num_layers)), num_layers)
    by_kind = {w: [i for i, x in enumerate(windows) if x == w] for w in kinds}
    size = min(len(layers) for layers in by_kind.values())
    group_windows: list[int] = []
    layer_group, layer_slot = [0] * num_layers, [0] * num_layers
    for w in kinds:
        layers = by_kind[w]
        for start in range(0, len(layers), size):
            for slot, layer in enumerate(layers[start : start + size]):
                layer_group[layer], layer_slot[layer] = len(group_windows), slot
            group_windows.append(w)
    return KVGroups(tuple(group_windows), tuple(layer_group), tuple(layer_slot), size)
