"""The decode-graph ladder and which steps may be replayed (CPU-side logic of cuda_graphs.py)."""
import pytest

from traceless.runner.batch import SeqInput
from traceless.runner.cuda_graphs import capture_sizes, is_plain_decode, padded_size


def test_capture_sizes_follow_vllms_ladder():
    assert capture_sizes(1) == [1]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(32) == [1, 2, 4, 8, 16, 24, 32]
    assert capture_sizes(130)[-3:] == [120, 128, 130]


@pytest.mark.parametrize(("n", "want"), [(1, 1), (3, 4), (4, 4), (5, 8), (17, 24), (32, 32), (33, None)])
def test_a_batch_pads_up_to_the_next_captured_size(n, want):
    assert padded_size(n, capture_sizes(32)) == want


def test_only_one_token_one_logit_steps_are_replayed():
    decode = SeqInput([1, 2], 20, [5], 1)
    assert is_plain_decode([decode, decode])
    assert not is_plain_decode([decode, SeqInput([1, 2], 0, [5, 6], 1)])  # a prefill chunk
    assert not is_plain_decode([SeqInput([1, 2], 20, [5, 8], 2)])  # a draft to verify
    assert not is_plain_decode([SeqInput([1, 2], 10, [5], 0)])  # a chunk that samples nothing
