import math

import pytest
import torch

from traceless.runner.sampler import Sampler, SampleRow
from traceless.sampling_params import SamplingParams


def row(**kw):
    return SampleRow(SamplingParams(**kw), None, None, None)


def test_greedy_picks_the_argmax():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 4.9]])
    out = Sampler(torch.device("cpu"), seed=0)(logits, [row(temperature=0), row(temperature=0)])
    assert out.token_ids == [1, 0]


def test_sampling_follows_the_distribution():
    """An exponential race draws exactly from softmax(logits / T): chi-square check."""
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(4000, 1)
    out = Sampler(torch.device("cpu"), seed=0)(logits.clone(), [row(temperature=1.0)] * 4000)
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=4).float()
    expected = probs * 4000
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 16.27  # p = 0.001 for 3 degrees of freedom


def test_top_k_top_p_min_p_restrict_the_support():
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.06, 0.04])).repeat(600, 1)
    s = Sampler(torch.device("cpu"), seed=1)
    assert set(s(logits.clone(), [row(top_k=2)] * 600).token_ids) == {0, 1}
    # top_p 0.65: 0.4 + 0.3 crosses it -> tokens {0, 1}
    assert set(s(logits.clone(), [row(top_p=0.65)] * 600).token_ids) == {0, 1}
    # min_p 0.4: keep p >= 0.4 * 0.4 = 0.16 -> {0, 1, 2}
    assert set(s(logits.clone(), [row(min_p=0.4)] * 600).token_ids) == {0, 1, 2}


def test_seeded_rows_do_not_depend_on_their_neighbours():
    torch.manual_seed(0)
    base = torch.randn(1, 50)

    def draw(batch_logits, index):
        g = torch.Generator().manual_seed(1234)
        rows = [row(temperature=1.0)] * batch_logits.shape[0]
        rows[index] = SampleRow(SamplingParams(temperature=1.0, seed=1234), g, None, None)
        return [Sampler(torch.device("cpu"))(batch_logits.clone(), rows).token_ids[index] for _ in range(1)]

    alone = [draw(base, 0) for _ in range(3)]
    busy = torch.cat([torch.randn(3, 50), base, torch.randn(4, 50)])
    assert alone == [draw(busy, 3) for _ in range(3)]


def test_penalties():
    logits = torch.tensor([[2.0, 2.0, -1.0, 0.5]])
    s = Sampler(torch.device("cpu"), seed=0)
    rep = SampleRow(SamplingParams(temperature=0, repetition_penalty=2.0), None, [0], [2])
    out = s(logits.clone(), [rep])
    assert out.token_ids == [1]  # token 0 halved to 1.0
    pres = SampleRow(SamplingParams(temperature=0, presence_penalty=1.0, frequency_penalty=0.5), None, None, [1, 1, 0])
    adjusted = logits.clone()
    s(adjusted, [pres])
    assert adjusted.tolist() == [[0.5, 0.0, -1.0, 0.5]]  # 2 - 1 - 0.5*1 ; 2 - 1 - 0.5*2


def test_logprobs_report_top_n_and_the_chosen_token():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    out = Sampler(torch.device("cpu"), seed=0)(logits.clone(), [row(temperature=0, logprobs=2)])
    lp = out.logprobs[0]
    ref = torch.log_softmax(logits, -1)[0]
    assert lp.top_ids == [1, 2]
    assert lp.top_logprobs == pytest.approx([float(ref[1]), float(ref[2])])
    assert lp.token_rank == 1 and lp.token_logprob == pytest.approx(float(ref[1]))
    assert math.isclose(sum(math.exp(v) for v in ref.tolist()), 1.0, rel_tol=1e-6)


def test_logit_bias_is_added_per_row_before_sampling_and_logprobs():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 4.9], [1.0, 2.0, 0.0]])
    rows = [
        row(temperature=0, logit_bias={2: 2.5}),
        row(temperature=0, logit_bias={0: -100, 1: 0.5}),
        row(temperature=0, logprobs=1),
    ]
    out = Sampler(torch.device("cpu"), seed=0)(logits.clone(), rows)
    assert out.token_ids == [2, 2, 1]  # rows 0 and 1 flipped by their biases; row 2 has none
    biased = torch.tensor([[0.0, 3.0, 3.5], [-95.0, 0.5, 4.9]])
    rows = [
        row(temperature=1.0, logit_bias={2: 2.5}, logprobs=1),
        row(temperature=1.0, logit_bias={0: -100, 1: 0.5}, logprobs=1),
    ]
    lp = Sampler(torch.device("cpu"), seed=0)(logits[:2].clone(), rows).logprobs
    want = torch.log_softmax(biased, dim=-1)
    for i in range(2):
        assert lp[i].top_ids == [int(want[i].argmax())]
        assert math.isclose(lp[i].top_logprobs[0], float(want[i].max()), rel_tol=1e-6)


def test_logit_bias_validation():
    from traceless.errors import InvalidRequestError

    assert SamplingParams(logit_bias={5: 1, 2: -3.5}).logit_bias == ((2, -3.5), (5, 1.0))
    for bad in ({1: 101}, {-1: 0}, {"1": 1.0}, {1: float("nan")}, [1, 2], "x", {i: 0 for i in range(1025)}):
        with pytest.raises(InvalidRequestError):
            SamplingParams(logit_bias=bad)


def test_choosing_tokens_reads_nothing_back_from_the_device(monkeypatch):
    """The greedy and the common sampled case (temperature, top-k/top-p/min-p, seeds) decide on
    the device: no .tolist() / .item() / bool() of a tensor, which would wait for the device."""
    torch.manual_seed(3)
    logits = torch.randn(4, 40)
    g = torch.Generator().manual_seed(5)
    rows = [
        row(temperature=0),
        row(temperature=0.7, top_k=5),
        row(top_p=0.8, min_p=0.05),
        SampleRow(SamplingParams(temperature=1.0, seed=5), g, None, None),
    ]
    want = Sampler(torch.device("cpu"), seed=0)(logits.clone(), rows).token_ids

    def forbidden(*a, **k):
        raise AssertionError("read back from the device")

    g.manual_seed(5)
    sampler = Sampler(torch.device("cpu"), seed=0)
    for name in ("tolist", "item", "__bool__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    ids = sampler.choose(logits.clone(), rows)
    monkeypatch.undo()
    assert ids.tolist() == want
