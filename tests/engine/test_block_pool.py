import pytest

from traceless.engine.block_pool import NULL_BLOCK_ID, BlockPool, FreeBlockQueue, KVBlock


class Recorder:
    def __init__(self):
        self.zeroed: list[list[int]] = []

    def __call__(self, ids):
        self.zeroed.append(list(ids))


def test_allocate_is_all_or_nothing_and_skips_the_null_block():
    pool = BlockPool(5, Recorder())
    assert pool.num_free_blocks == 4
    assert pool.allocate(5) is None and pool.num_free_blocks == 4
    blocks = pool.allocate(4)
    assert [b.block_id for b in blocks] == [1, 2, 3, 4]
    assert NULL_BLOCK_ID not in [b.block_id for b in blocks]
    assert pool.allocate(1) is None


def test_free_zeroes_before_the_block_can_be_reused():
    zero = Recorder()
    pool = BlockPool(4, zero)
    a = pool.allocate(2)
    pool.free(a)
    assert zero.zeroed == [[1, 2]]
    # LRU: the freed blocks go to the tail; the untouched block 3 comes first
    assert [b.block_id for b in pool.allocate(3)] == [3, 1, 2]


def test_shared_blocks_are_zeroed_only_when_the_last_reference_goes():
    zero = Recorder()
    pool = BlockPool(3, zero)
    (b,) = pool.allocate(1)
    b.ref_cnt += 1  # a second owner
    pool.free([b])
    assert zero.zeroed == [] and pool.num_free_blocks == 1
    pool.free([b])
    assert zero.zeroed == [[b.block_id]] and pool.num_free_blocks == 2


def test_double_free_is_an_error():
    pool = BlockPool(3, Recorder())
    blocks = pool.allocate(1)
    pool.free(blocks)
    with pytest.raises(ValueError, match="double free"):
        pool.free(blocks)


def test_free_queue_remove_from_the_middle_is_constant_time_bookkeeping():
    blocks = [KVBlock(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    q.remove(blocks[2])
    assert [b.block_id for b in q] == [0, 1, 3, 4] and q.num_free == 4
    with pytest.raises(ValueError):
        q.remove(blocks[2])
    assert q.popleft() is blocks[0]
    q.append(blocks[2])
    assert [b.block_id for b in q] == [1, 3, 4, 2]


def test_integrity_reports_leaks_and_clean_pools():
    pool = BlockPool(4, Recorder())
    assert pool.check_integrity() == []
    pool.allocate(1)[0].ref_cnt = 0  # lost without being freed
    assert any("leak" in p for p in pool.check_integrity())
