"""Batched sampling: penalties, logit bias, temperature, min-p / top-k / top-p, seeds, logprobs.

Order (as vLLM): penalties and logit bias on the raw logits -> logprobs of the model's distribution (raw logits)
-> temperature -> min_p, top_k, top_p -> sample. Sampling is an exponential race,
argmax(p / E) with E ~ Exp(1), which draws exactly from p. Each seeded request has its own
generator and draws its own noise row, so its tokens do not depend on what shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from traceless.engine.step_io import TokenLogprobs
from traceless.model.layers.kernels import NativeKernels
from traceless.runner.device_io import upload
from traceless.sampling_params import SamplingParams

MIN_LOGPROB = -9999.0  # what a token that cannot be sampled reports (as OpenAI does)


@dataclass(frozen=True, slots=True)
class SampleRow:
    """What the sampler needs of one request at this step."""

    params: SamplingParams
    generator: torch.Generator | None  # per-request, for seeded requests
    prompt_ids: list[int] | None  # only when a repetition penalty needs them
    output_ids: list[int] | None  # only when a penalty needs them


@dataclass(frozen=True, slots=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


class Sampler:
    def __init__(self, device: torch.device, seed: int | None = None, kernels: NativeKernels | None = None):
        """kernels: the native CPU kernels, whose argmax greedy rows take (torch's compares one
        value at a time); None on other devices."""
        self.device = device
        self._kernels = kernels if device.type == "cpu" else None
        self.generator = torch.Generator(device=device)
        if seed is None:
            self.generator.seed()  # from the OS: unseeded requests are not reproducible
        else:
            self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> SamplerOutput:
        """logits: [S, V] float32, one row per entry of `rows` (modified in place)."""
        self.penalize(logits, rows)
        logprobs = self._logprobs(logits, rows) if any(r.params.logprobs is not None for r in rows) else None
        ids = self.choose(logits, rows).tolist()
        if logprobs is None:
            return SamplerOutput(ids, [None] * len(rows))
        return SamplerOutput(ids, self.finish_logprobs(logprobs, ids, rows))

    def choose(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        """The chosen token of each row, [S] int64 on the logits' device, without waiting for the
        device (greedy or sampled is decided on the host; per-row parameters go up pinned).
        logits: [S, V] float32, penalized already."""
        token_ids = self.argmax(logits)
        if not all(r.params.greedy for r in rows):
            greedy = upload([r.params.greedy for r in rows], torch.bool, logits.device)
            sampled = self._sample(logits, rows)
            token_ids = torch.where(greedy, token_ids, sampled)
        return token_ids

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """logits.argmax(dim=-1) [S] int64: the native kernel's on the CPU (the same answer)."""
        if self._kernels is not None and logits.dtype == torch.float32 and logits.is_contiguous():
            return self._kernels.argmax(logits)
        return logits.argmax(dim=-1)

    def penalize(self, logits: torch.Tensor, rows: list[SampleRow]) -> None:
        """Penalties and logit biases of the rows that ask for them, in place on logits [S, V]."""
        if any(r.params.needs_penalties for r in rows):
            self._apply_penalties(logits, rows)
        if any(r.params.logit_bias for r in rows):
            self._apply_bias(logits, rows)

    @staticmethod
    def _apply_bias(logits: torch.Tensor, rows: list[SampleRow]) -> None:
        """Every row's (token id, bias) pairs in one scatter-add; the index tensors name tokens the
        client chose, so they are zeroed after use."""
        row_idx = [i for i, r in enumerate(rows) for _ in r.params.logit_bias]
        cols = [t for r in rows for t, _ in r.params.logit_bias]
        vals = [b for r in rows for _, b in r.params.logit_bias]
        dev = logits.device
        ri = torch.tensor(row_idx, dtype=torch.long, device=dev)
        ci = torch.tensor(cols, dtype=torch.long, device=dev)
        vi = torch.tensor(vals, dtype=logits.dtype, device=dev)
        logits.index_put_((ri, ci), vi, accumulate=True)
        for t in (ri, ci, vi):
            t.zero_()

    def _apply_penalties(self, logits: torch.Tensor, rows: list[SampleRow]) -> None:
        V = logits.shape[1]
        for i, r in enumerate(rows):  # only rows that ask for penalties; rare and cheap next to the forward
            p = r.params
            if not p.needs_penalties:
                continue
            out = torch.tensor(r.output_ids or [], dtype=torch.long, device=logits.device)
            if p.repetition_penalty != 1.0:
                seen = torch.zeros(V, dtype=torch.bool, device=logits.device)
                seen[torch.tensor(r.prompt_ids or [], dtype=torch.long, device=logits.device)] = True
                seen[out] = True
                row = logits[i]
                penalized = torch.where(row > 0, row / p.repetition_penalty, row * p.repetition_penalty)
                logits[i] = torch.where(seen, penalized, row)
            if p.presence_penalty or p.frequency_penalty:
                counts = torch.zeros(V, dtype=logits.dtype, device=logits.device).index_add_(
                    0, out, torch.ones_like(out, dtype=logits.dtype)
                )
                logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)

    @staticmethod
    def _logprobs(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        return torch.log_softmax(logits, dim=-1)

    def distribution(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        """What a sampled row draws from: temperature, softmax, then min_p / top_k / top_p.
        logits [S, V] (penalized) -> [S, V] probabilities, zero outside the filters and *not*
        renormalized (each row sums to at most 1)."""
        temp = upload([r.params.temperature or 1.0 for r in rows], torch.float32, logits.device)
        return self._filter(torch.softmax(logits / temp[:, None], dim=-1), rows)

    def _sample(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        probs = self.distribution(logits, rows)
        noise = torch.empty_like(probs)
        unseeded = [i for i, r in enumerate(rows) if r.generator is None]
        if len(unseeded) == len(rows):  # the common case: no index to upload
            noise.exponential_(generator=self.generator)
        elif unseeded:
            noise[upload(unseeded, torch.int64, probs.device)] = torch.empty(
                len(unseeded), probs.shape[1], device=probs.device
            ).exponential_(generator=self.generator)
        for i, r in enumerate(rows):
            if r.generator is not None:
                noise[i].exponential_(generator=r.generator)
        return (probs / noise).argmax(dim=-1)

    @staticmethod
    def _filter(probs: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        """Zero out tokens outside min_p / top_k / top_p (the sampled draw renormalizes implicitly)."""
        min_p = [r.params.min_p for r in rows]
        if any(min_p):
            floor = upload(min_p, torch.float32, probs.device)[:, None] * probs.max(dim=-1, keepdim=True).values
            probs = probs.masked_fill(probs < floor, 0.0)
        top_k = [r.params.top_k for r in rows]
        top_p = [r.params.top_p for r in rows]
        if not any(top_k) and all(p >= 1.0 for p in top_p):
            return probs
        V = probs.shape[1]
        sorted_p, order = probs.sort(dim=-1, descending=True)
        ks = upload([k if k > 0 else V for k in top_k], torch.int64, probs.device)
        drop = torch.arange(V, device=probs.device)[None, :] >= ks[:, None]
        # top_p: keep the smallest prefix whose mass reaches p (the token crossing p is kept).
        before = sorted_p.cumsum(dim=-1) - sorted_p
        drop |= before >= upload(top_p, torch.float32, probs.device)[:, None] * sorted_p.sum(-1, keepdim=True)
        drop[:, 0] = False
        return probs.scatter(1, order, sorted_p.masked_fill(drop, 0.0))

    @staticmethod
    def finish_logprobs(lp: torch.Tensor, ids: list[int], rows: list[SampleRow]) -> list[TokenLogprobs | None]:
        out: list[TokenLogprobs | None] = []
        n_max = max(r.params.logprobs or 0 for r in rows)
        top_vals, top_idx = lp.topk(max(n_max, 1), dim=-1)
        top_vals = top_vals.clamp(min=MIN_LOGPROB)  # a grammar's masked tokens: -inf is not JSON
        chosen = lp.gather(1, torch.tensor(ids, device=lp.device)[:, None])
        ranks = (lp > chosen).sum(dim=-1) + 1
        for i, r in enumerate(rows):
            n = r.params.logprobs
            if n is None:
                out.append(None)
                continue
            out.append(
                TokenLogprobs(float(chosen[i, 0]), int(ranks[i]), top_idx[i, :n].tolist(), top_vals[i, :n].tolist())
            )
        return out
