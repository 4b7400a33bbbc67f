"""Which layers share a block table: the KV groups of local and global layers."""

from traceless.model.kv_groups import kv_groups


def test_one_kind_of_layer_is_one_group_of_every_layer():
    for windows in ((), (0, 0, 0), (32, 32, 32)):
        g = kv_groups(windows, 3)
        assert g.num_groups == 1 and g.num_slots == 3 and not g.hybrid
        assert g.layer_group == (0, 0, 0) and g.layer_slot == (0, 1, 2)
    assert kv_groups((32, 32), 2).windows == (32,)


def test_gemma3_pattern_makes_equal_groups_global_first():
    windows = (32, 32, 32, 32, 32, 0) * 2  # five local layers to one global, twice
    g = kv_groups(windows, 12)
    assert g.num_slots == 2 and g.hybrid
    assert g.windows == (0, 32, 32, 32, 32, 32)
    assert g.layer_group[5] == g.layer_group[11] == 0  # the global layers share group 0's blocks
    assert [g.layer_group[i] for i in (0, 1, 2, 3, 4, 6)] == [1, 1, 2, 2, 3, 3]
    # every (group, slot) holds exactly one layer: no two layers write the same cache memory
    assert len({(g.layer_group[i], g.layer_slot[i]) for i in range(12)}) == 12
    assert all(0 <= s < g.num_slots for s in g.layer_slot)


def test_uneven_counts_leave_unused_slots_in_the_last_group():
    g = kv_groups((8, 0, 8, 8, 8, 0, 8), 7)  # 5 local, 2 global: groups of 2
    assert g.num_slots == 2 and g.windows == (0, 8, 8, 8)
    assert sorted(g.layer_group) == [0, 0, 1, 1, 2, 2, 3]  # the last local group holds one layer
    assert len({(g.layer_group[i], g.layer_slot[i]) for i in range(7)}) == 7


def test_gemma2_alternating_layers_make_two_groups():
    g = kv_groups((16, 0) * 3, 6)
    assert g.windows == (0, 16) and g.num_slots == 3
    assert g.layer_group == (1, 0) * 3 and g.layer_slot == (0, 0, 1, 1, 2, 2)
