"""Draft verification: exact decisions on hand-made cases, and the speculative-sampling rule's
output distribution against the target distribution (chi-square on synthetic p and q)."""

import math

import torch

from traceless.runner.rejection import Drafts, Noise, RejectionSampler, SpecRow, verify, verify_greedy
from traceless.runner.sampler import Sampler, SampleRow
from traceless.sampling_params import SamplingParams

CPU = torch.device("cpu")


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of counts [C] to probs [C] (cells with p = 0 must have no counts)."""
    assert float(counts[probs == 0].sum()) == 0
    keep = probs > 0
    expected = probs[keep] * counts.sum()
    stat = float(((counts[keep] - expected) ** 2 / expected).sum())
    dof = int(keep.sum()) - 1
    return float(
        torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64))
    )


def one_seq(p_rows, drafts, q_rows=None, u=None, e=None, greedy=False):
    """verify() on a single sequence: p_rows [d+1, V] (argmax taken from them)."""
    p = torch.tensor(p_rows, dtype=torch.float32)[None]
    d, V = len(drafts), p.shape[-1]
    q = None if q_rows is None else torch.tensor(q_rows, dtype=torch.float32)[None]
    noise = Noise(torch.tensor([u if u is not None else [0.5] * d]), torch.tensor([e or [1.0] * V]))
    n, tok = verify(
        p, p.argmax(-1), torch.tensor([greedy]), Drafts(torch.tensor([drafts]), torch.tensor([d]), q), noise
    )
    return int(n[0]), int(tok[0])


# --- exact decisions ------------------------------------------------------------------------
def test_greedy_accepts_while_drafts_match_the_argmax_then_corrects():
    p = [[0, 1, 0], [0, 0, 1], [1, 0, 0]]  # argmax per row: 1, 2, 0
    assert one_seq(p, [1, 2], greedy=True) == (2, 0)  # both match: the bonus is row 2's argmax
    assert one_seq(p, [1, 0], greedy=True) == (1, 2)  # second draft wrong: emit row 1's argmax
    assert one_seq(p, [2, 2], greedy=True) == (0, 1)  # first draft wrong; later match does not count


def test_the_all_greedy_shortcut_agrees_with_the_general_rule():
    torch.manual_seed(1)
    S, K, V = 200, 3, 4  # few tokens: drafts often match the argmax
    p = torch.softmax(torch.randn(S, K + 1, V), -1)
    drafts = Drafts(torch.randint(0, V, (S, K)), torch.randint(0, K + 1, (S,)), None)
    noise = Noise(torch.rand(S, K), torch.ones(S, V))
    n, tok = verify(p, p.argmax(-1), torch.ones(S, dtype=torch.bool), drafts, noise)
    n2, tok2 = verify_greedy(p.argmax(-1), drafts)
    assert torch.equal(n, n2) and torch.equal(tok, tok2) and 0 < int((n > 0).sum()) < S


def test_point_mass_drafts_are_accepted_with_probability_p_of_the_draft():
    p = [[0.2, 0.7, 0.1], [0.3, 0.3, 0.4]]
    assert one_seq(p, [1], u=[0.69]) == (1, 2)  # u < 0.7: accepted; bonus = argmax(p1 / 1) = 2
    n, tok = one_seq(p, [1], u=[0.71])  # rejected: residual = p0 without the draft token
    assert n == 0 and tok == 0  # argmax of [0.2, 0, 0.1]


def test_draft_probs_accept_with_min_one_p_over_q():
    p = [[0.5, 0.25, 0.25], [1, 0, 0]]
    q = [[0.25, 0.5, 0.25]]
    assert one_seq(p, [0], q, u=[0.999])[0] == 1  # p/q = 2: always accepted
    assert one_seq(p, [1], q, u=[0.49])[0] == 1  # p/q = 0.5
    assert one_seq(p, [1], q, u=[0.51]) == (0, 0)  # rejected: residual max(0, p - q) = [0.25, 0, 0]


def test_rejection_draws_from_the_residual_not_from_p():
    p = [[0.6, 0.3, 0.1], [1, 0, 0]]
    q = [[0.7, 0.1, 0.2]]
    # residual = [0, 0.2, 0]: with noise favouring token 0 heavily, p would give 0, residual gives 1
    assert one_seq(p, [0], q, u=[0.99], e=[1e-3, 1.0, 1.0]) == (0, 1)


def test_without_residual_mass_the_final_token_comes_from_p():
    p = [[0.5, 0.5], [1, 0]]
    q = [[0.6, 0.6]]  # q >= p everywhere (unnormalized, as rounding can leave it): no residual
    assert one_seq(p, [0], q, u=[0.9], e=[1.0, 0.5]) == (0, 1)


def test_equal_p_and_q_accept_everything():
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(64, 4, 5), -1)
    drafts = torch.multinomial(p[:, :3].reshape(-1, 5), 1).view(64, 3)
    noise = Noise(torch.rand(64, 3) * 0.9999, torch.ones(64, 5))
    n, _ = verify(
        p, p.argmax(-1), torch.zeros(64, dtype=torch.bool), Drafts(drafts, torch.full((64,), 3), p[:, :3]), noise
    )
    assert n.tolist() == [3] * 64


def test_sequences_with_fewer_drafts_stop_at_their_count():
    p = torch.tensor([[[0, 1.0], [0, 1.0], [1.0, 0]], [[0, 1.0], [1.0, 0], [0, 0]]])  # seq 1 has 1 draft
    drafts = Drafts(torch.tensor([[1, 1], [1, 0]]), torch.tensor([2, 1]), None)
    n, tok = verify(p, p.argmax(-1), torch.tensor([True, True]), drafts, Noise(torch.zeros(2, 2), torch.ones(2, 2)))
    assert n.tolist() == [2, 1] and tok.tolist() == [0, 0]  # seq 1's padding "draft" 0 is never accepted


# --- distribution ---------------------------------------------------------------------------
S, K, V = 40_000, 2, 6


def synthetic(seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(K + 1, V, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(K, V, generator=g) * 1.5, -1)
    return g, p, q


def emitted(p, q, g, point_mass=False):
    """Run verify on S sequences sharing p, q; drafts drawn from q (or fixed: point masses)."""
    if point_mass:
        drafts = torch.tensor([[2, 4]]).repeat(S, 1)
    else:
        drafts = torch.stack([torch.multinomial(q[j], S, replacement=True, generator=g) for j in range(K)], 1)
    noise = Noise(torch.rand(S, K, generator=g), torch.empty(S, V).exponential_(generator=g))
    target = p[None].expand(S, -1, -1).contiguous()
    probs = None if point_mass else q[None].expand(S, -1, -1).contiguous()
    return verify(
        target, target.argmax(-1), torch.zeros(S, dtype=torch.bool), Drafts(drafts, torch.full((S,), K), probs), noise
    ), drafts


def test_speculative_sampling_keeps_the_target_distribution():
    g, p, q = synthetic(0)
    (n, tok), drafts = emitted(p, q, g)
    first = torch.where(n >= 1, drafts[:, 0], tok)
    assert chi2_pvalue(torch.bincount(first, minlength=V).float(), p[0]) > 1e-3
    # given the first draft was accepted, the next emitted token has the distribution of row 1
    second = torch.where(n >= 2, drafts[:, 1], tok)[n >= 1]
    assert chi2_pvalue(torch.bincount(second, minlength=V).float(), p[1]) > 1e-3
    # acceptance of the first draft: sum_x min(p, q)
    beta = float(torch.minimum(p[0], q[0]).sum())
    z = (float((n >= 1).float().mean()) - beta) / math.sqrt(beta * (1 - beta) / S)
    assert abs(z) < 4


def test_point_mass_drafts_keep_the_target_distribution():
    g, p, _ = synthetic(1)
    (n, tok), drafts = emitted(p, None, g, point_mass=True)
    first = torch.where(n >= 1, drafts[:, 0], tok)
    assert chi2_pvalue(torch.bincount(first, minlength=V).float(), p[0]) > 1e-3
    z = (float((n >= 1).float().mean()) - float(p[0, 2])) / math.sqrt(float(p[0, 2] * (1 - p[0, 2])) / S)
    assert abs(z) < 4


def test_the_chi_square_check_catches_a_wrong_rule():
    """Power: resampling from p (not the residual) after a rejection is detected at this size."""
    g, p, q = synthetic(0)
    x = torch.multinomial(q[0], S, replacement=True, generator=g)
    accept = torch.rand(S, generator=g) * q[0, x] < p[0, x]
    wrong = torch.where(accept, x, torch.multinomial(p[0], S, replacement=True, generator=g))
    assert chi2_pvalue(torch.bincount(wrong, minlength=V).float(), p[0]) < 1e-6


# --- the rejection sampler on logits --------------------------------------------------------
def spec_row(drafts, probs=None, gen=None, **params):
    p = SamplingParams(**params)
    out = [] if p.needs_penalties else None
    return SpecRow(SampleRow(p, gen, [] if p.repetition_penalty != 1.0 else None, out), drafts, probs)


def test_penalties_count_the_drafts_before_each_position():
    logits = torch.tensor([[0, 0, 5.0, 0], [0, 4.0, 5.0, 0], [0, 0, 0, 1.0]])
    rs = RejectionSampler(Sampler(CPU, seed=0))
    # presence penalty 2: at row 1 draft 2 counts as generated, 5 - 2 < 4 -> argmax 1 rejects draft 2
    out = rs(logits.clone(), [spec_row([2, 2], temperature=0, presence_penalty=2.0)])
    assert out[0].token_ids == [2, 1]
    assert rs(logits.clone(), [spec_row([2, 2], temperature=0)])[0].token_ids == [2, 2, 3]


def test_logprobs_come_per_emitted_token():
    logits = torch.log_softmax(torch.tensor([[0, 3.0, 0], [2.0, 0, 0], [0, 0, 1.0]]), -1)
    out = RejectionSampler(Sampler(CPU, seed=0))(logits.clone(), [spec_row([1, 2], temperature=0, logprobs=1)])
    assert out[0].token_ids == [1, 0]
    lps = out[0].logprobs
    assert [lp.top_ids for lp in lps] == [[1], [0]]
    assert math.isclose(lps[1].token_logprob, float(logits[1, 0]), abs_tol=1e-5) and lps[1].token_rank == 1


def test_seeded_rows_reproduce_and_match_plain_sampling_without_drafts():
    torch.manual_seed(3)
    logits = torch.randn(5, 50)

    def run(batch_rows):
        n_rows = sum(len(r.draft_ids) + 1 for r in batch_rows)
        return RejectionSampler(Sampler(CPU))(logits[:n_rows].clone(), batch_rows)

    seeded = lambda drafts: spec_row(drafts, gen=torch.Generator().manual_seed(7), temperature=1.0, seed=7)  # noqa: E731
    a = run([seeded([3, 4])])[0].token_ids
    assert run([seeded([3, 4])])[0].token_ids == a
    # a seeded row with no drafts draws exactly what the plain sampler draws for it
    plain = Sampler(CPU)(
        logits[:1].clone(), [SampleRow(SamplingParams(seed=7), torch.Generator().manual_seed(7), None, None)]
    )
    assert run([seeded([])])[0].token_ids == plain.token_ids
