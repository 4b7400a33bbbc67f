"""Verification of draft tokens: keep the drafts the target model agrees with, then emit one more.

A speculating sequence feeds [last, x_1 .. x_d] and gets target logits at every one of those
d + 1 positions: row j scores the token after x_j (x_0 = last), as if x_1 .. x_j were accepted.

    greedy    accept x_j while it equals the target's argmax at row j - 1; at the first mismatch
              emit that argmax; after d accepted drafts emit the argmax of row d (the bonus).
    sampled   speculative sampling (Leviathan et al. 2023; Chen et al. 2023): accept x_j with
              probability min(1, p(x_j) / q(x_j)); on rejection draw from the residual
              norm(max(0, p - q)) and stop; after d accepted drafts draw the bonus from p.
              Each emitted token then has exactly the distribution p of plain sampling:
              P(y) = q(y) min(1, p(y)/q(y)) + (1 - sum_x min(p(x), q(x))) * residual(y) = p(y).
              Prompt-lookup drafts are point masses (q(x) = 1): accept x with probability p(x).

p is the *processed* target distribution (penalties, temperature, min-p/top-k/top-p) and row j's
penalties count x_1 .. x_j as generated, so the output matches plain decoding. A seeded request
draws everything from its own generator: d uniforms, then one Exp(1) row for the final token.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from traceless.engine.step_io import TokenLogprobs
from traceless.runner.sampler import Sampler, SampleRow


@dataclass(frozen=True, slots=True)
class Drafts:
    """The drafts of S sequences, padded to K."""

    token_ids: torch.Tensor  # [S, K] long, 0 past each count
    counts: torch.Tensor  # [S] long
    probs: torch.Tensor | None  # [S, K, V] q of each draft; None: every draft is a point mass


@dataclass(frozen=True, slots=True)
class Noise:
    uniform: torch.Tensor  # [S, K] U[0, 1): one per draft
    exponential: torch.Tensor  # [S, V] Exp(1): the exponential race that draws the final token


def verify_greedy(target_argmax: torch.Tensor, drafts: Drafts) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence greedy: target_argmax [S, K+1] -> (accepted drafts [S], final token [S])."""
    K = drafts.token_ids.shape[1]
    valid = torch.arange(K, device=target_argmax.device)[None, :] < drafts.counts[:, None]
    accept = (drafts.token_ids == target_argmax[:, :K]) & valid
    n_acc = accept.long().cumprod(dim=1).sum(dim=1)
    return n_acc, target_argmax.gather(1, n_acc[:, None])[:, 0]


def verify(
    target: torch.Tensor, target_argmax: torch.Tensor, greedy: torch.Tensor, drafts: Drafts, noise: Noise
) -> tuple[torch.Tensor, torch.Tensor]:
    """target [S, K+1, V] normalized p (rows of greedy sequences unused), target_argmax [S, K+1],
    greedy [S] bool -> (accepted drafts [S], final token [S])."""
    S, K1, V = target.shape
    K = K1 - 1
    seq = torch.arange(S, device=target.device)
    x = drafts.token_ids
    valid = torch.arange(K, device=x.device)[None, :] < drafts.counts[:, None]  # [S, K]
    p_x = target[:, :K].gather(2, x[..., None])[..., 0]  # [S, K] p_j(x_j)
    q_x = torch.ones_like(p_x) if drafts.probs is None else drafts.probs.gather(2, x[..., None])[..., 0]
    accept = noise.uniform * q_x < p_x  # u < p/q without dividing (q > 0: x was drawn from q)
    accept = torch.where(greedy[:, None], x == target_argmax[:, :K], accept) & valid
    n_acc = accept.long().cumprod(dim=1).sum(dim=1)  # [S] leading accepted drafts
    p_final = target[seq, n_acc]  # [S, V] p at the first rejected draft, or at the bonus position
    dist = p_final
    if K:
        j = n_acc.clamp(max=K - 1)
        if drafts.probs is None:
            q_final = torch.nn.functional.one_hot(x[seq, j], V).to(target.dtype)
        else:
            q_final = drafts.probs[seq, j]
        residual = (p_final - q_final).clamp_min(0.0)
        # p == q leaves no residual; rejection then has probability 0 and only rounding gets here
        use = (n_acc < drafts.counts) & (residual.sum(dim=1) > 0)
        dist = torch.where(use[:, None], residual, p_final)
    token = (dist / noise.exponential).argmax(dim=1)  # an unnormalized race still draws from dist
    return n_acc, torch.where(greedy, target_argmax[seq, n_acc], token)


@dataclass(frozen=True, slots=True)
class SpecRow:
    """One sequence to verify: its sampling state before this step and its d drafts."""

    row: SampleRow
    draft_ids: list[int]
    draft_probs: torch.Tensor | None  # [d, V] q (model drafts of a sampled request); None: point masses


@dataclass(frozen=True, slots=True)
class Verified:
    token_ids: list[int]  # accepted drafts, then the target's own token
    logprobs: list[TokenLogprobs] | None


class RejectionSampler:
    def __init__(self, sampler: Sampler):
        self.sampler = sampler  # penalties, filters, logprobs, and the generator of unseeded requests

    def __call__(self, logits: torch.Tensor, rows: list[SpecRow]) -> list[Verified]:
        """logits [R, V] float32 (modified in place): sequence s owns rows [cu_s, cu_s + d_s + 1)."""
        expanded = [_position_row(r, j) for r in rows for j in range(len(r.draft_ids) + 1)]
        self.sampler.penalize(logits, expanded)
        lp = torch.log_softmax(logits, dim=-1) if any(r.row.params.logprobs is not None for r in rows) else None
        S, K, V = len(rows), max(len(r.draft_ids) for r in rows), logits.shape[1]
        pad = _padded_rows(rows, K).to(logits.device)
        argmax = logits.new_zeros(S * (K + 1), dtype=torch.long).index_copy_(0, pad, self.sampler.argmax(logits))
        drafts = self._drafts(rows, K, V, logits.device)
        if all(r.row.params.greedy for r in rows):  # no distributions needed: compare with the argmax
            n_acc, final = verify_greedy(argmax.view(S, K + 1), drafts)
        else:
            n_acc, final = self._verify_sampled(logits, expanded, rows, argmax.view(S, K + 1), drafts)
        return self._outputs(rows, n_acc.tolist(), final.tolist(), lp)

    def _verify_sampled(
        self, logits: torch.Tensor, expanded: list[SampleRow], rows: list[SpecRow], argmax: torch.Tensor, drafts: Drafts
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [R, V] penalized, argmax [S, K+1] padded."""
        S, K1 = argmax.shape
        probs = self.sampler.distribution(logits, expanded)  # [R, V], filtered, not renormalized
        target = logits.new_zeros(S * K1, logits.shape[1])  # padded [S, K+1, V]
        target.index_copy_(0, _padded_rows(rows, K1 - 1).to(logits.device), probs / probs.sum(dim=-1, keepdim=True))
        probs.zero_()
        greedy = torch.tensor([r.row.params.greedy for r in rows], device=logits.device)
        out = verify(target.view(S, K1, -1), argmax, greedy, drafts, self._noise(rows, K1 - 1, logits.shape[1]))
        target.zero_()  # derived from user content: wipe before the allocator reuses it
        if drafts.probs is not None:
            drafts.probs.zero_()
        return out

    @staticmethod
    def _drafts(rows: list[SpecRow], K: int, V: int, device: torch.device) -> Drafts:
        ids = torch.zeros(len(rows), K, dtype=torch.long, device=device)
        for s, r in enumerate(rows):
            ids[s, : len(r.draft_ids)] = torch.tensor(r.draft_ids, dtype=torch.long, device=device)
        counts = torch.tensor([len(r.draft_ids) for r in rows], device=device)
        if all(r.draft_probs is None for r in rows):
            return Drafts(ids, counts, None)
        q = torch.nn.functional.one_hot(ids, V).float()  # point masses where no q was given
        for s, r in enumerate(rows):
            if r.draft_probs is not None:
                q[s, : len(r.draft_ids)] = r.draft_probs
        return Drafts(ids, counts, q)

    def _noise(self, rows: list[SpecRow], K: int, V: int) -> Noise:
        """Uniforms and Exp(1) rows: a seeded request draws its d uniforms, then its row, from its
        own generator; the other sampled requests share the sampler's; greedy ones draw nothing."""
        dev = self.sampler.device
        uniform = torch.zeros(len(rows), K, device=dev)
        exponential = torch.ones(len(rows), V, device=dev)
        shared = [s for s, r in enumerate(rows) if r.row.generator is None and not r.row.params.greedy]
        if shared:
            uniform[shared] = torch.rand(len(shared), K, device=dev, generator=self.sampler.generator)
            exponential[shared] = torch.empty(len(shared), V, device=dev).exponential_(generator=self.sampler.generator)
        for s, r in enumerate(rows):
            gen = r.row.generator
            if gen is not None and not r.row.params.greedy:
                d = len(r.draft_ids)
                uniform[s, :d] = torch.rand(d, device=dev, generator=gen)
                exponential[s].exponential_(generator=gen)
        return Noise(uniform, exponential)

    def _outputs(
        self, rows: list[SpecRow], n_acc: list[int], final: list[int], lp: torch.Tensor | None
    ) -> list[Verified]:
        out, first = [], 0
        for r, a, t in zip(rows, n_acc, final):
            ids = r.draft_ids[:a] + [t]
            lps = None
            if lp is not None and r.row.params.logprobs is not None:
                found = self.sampler.finish_logprobs(lp[first : first + len(ids)], ids, [r.row] * len(ids))
                lps = [x for x in found if x is not None]  # none is None: every row is r.row, which asked for logprobs
            out.append(Verified(ids, lps))
            first += len(r.draft_ids) + 1
        return out


def _padded_rows(rows: list[SpecRow], K: int) -> torch.Tensor:
    """Where each packed row goes in the padded [S, K+1] layout: row j of sequence s -> s * (K+1) + j."""
    return torch.tensor([s * (K + 1) + j for s, r in enumerate(rows) for j in range(len(r.draft_ids) + 1)])


def _position_row(r: SpecRow, j: int) -> SampleRow:
    """The sampling state at row j: drafts x_1 .. x_j count as generated (for the penalties)."""
    if j == 0 or r.row.output_ids is None:
        return r.row
    return replace(r.row, output_ids=r.row.output_ids + r.draft_ids[:j])
