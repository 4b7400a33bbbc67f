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


class _Replay:
    """A captured graph stand-in: a replay reads the metadata buffer the real one would."""

    def __init__(self, graphs, out):
        self.graphs, self.out, self.seen = graphs, out, []

    def replay(self):
        self.seen.append(self.graphs.buf.clone())
        self.out.fill_(1.0)


def test_a_replayed_step_and_its_scrub_never_wait_for_the_device(monkeypatch):
    import numpy as np
    import torch

    from traceless.runner.cuda_graphs import DecodeGraphs
    from traceless.runner.step_meta import fill_idle

    waits = []

    class Stream:
        def synchronize(self):
            waits.append("stream")

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: waits.append("device"))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: Stream())
    monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda self: waits.append("event"))

    class Model:
        def logits(self, h):
            return h.float()

    g = DecodeGraphs(Model(), [1, 2, 4], block_size=4, max_model_len=32, device=torch.device("cpu"), scale=1.0)
    replays = {n: _Replay(g, torch.zeros(n, 3)) for n in g.sizes}
    g._graphs = {n: (r, r.out) for n, r in replays.items()}
    idle = np.zeros(g.layout.size, dtype=np.int32)
    fill_idle(idle, g.layout)
    for step in range(3):  # the two pinned host buffers in turn
        seqs = [
            SeqInput([7, 9], 5 + step, [100 + step], 1),
            SeqInput([3], 1, [200 + step], 1),
            SeqInput([4], 0, [9], 1),
        ]
        logits = g.run(seqs)
        assert logits.shape == (3, 3)
        assert replays[4].seen[-1][:3].tolist() == [100 + step, 200 + step, 9]  # the ids it read
        g.scrub()
        assert g.buf.tolist() == idle.tolist()
        assert replays[4].out.abs().sum() == 0
        g.settle()
        for host in g.host._bufs:
            assert host.tolist() == idle.tolist()  # no token id left on the host
    assert waits == []
