"""One engine step on the model: build the packed batch, run one forward, sample.

    execute(plan):  [draft] -> batch.build() -> model.forward() -> logits of sampling rows
                    -> sampler, or rejection sampler when the step verifies drafts

The plan (engine/step_io.py) is plain data the scheduler made for this step; the runner reads
nothing else of the engine.

Only rows that complete their sequence (the last token of a prefill, or a decode token) get
logits; a speculating sequence gets them at all of its 1 + d positions. Drafts are the
request's own (prompt lookup, proposed by the engine) or, with a DraftProposer, made here by the
model's first layers just before the verifying forward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from traceless.engine.step_io import SampledTokens, ScheduledSeq, SchedulerOutput, TokenLogprobs
from traceless.model.layers.kernels import NativeKernels
from traceless.model.llama import LlamaModel
from traceless.runner.batch import BatchBuilder, SeqInput
from traceless.runner.cuda_graphs import DecodeGraphs
from traceless.runner.device_scrub import DeviceScrubber
from traceless.runner.draft import Drafted, DraftProposer, DraftSeq
from traceless.runner.grammar_mask import GuidedSeq, apply_grammar_masks
from traceless.runner.prompt_logprobs import score_prompt
from traceless.runner.rejection import RejectionSampler, SpecRow
from traceless.runner.run_ahead import DeviceTokens, PendingStep, last_rows
from traceless.runner.sampler import Sampler, SampleRow


class ModelRunner:
    """The engine's ModelExecutor (engine/step_io.py) for one model."""

    def __init__(
        self,
        model: LlamaModel,
        block_size: int,
        device: torch.device,
        use_native: bool,
        seed: int | None = None,
        draft_layers: int | None = None,
        paged: bool = False,
    ):
        """draft_layers: self-speculation depth when the engine runs speculative='draft'.
        paged: the Triton attention path (CUDA)."""
        self.model = model
        self._pool_scrubber = NativeKernels.load()  # the idle work's stack scrub: refuse now if unbuilt
        self.block_size = block_size
        self.device = device
        self.use_native = use_native
        self.batcher = BatchBuilder(
            block_size, device, use_native, model.config.attention_scale, paged, model.config.sliding_window or 0
        )
        self.sampler = Sampler(device, seed, self._pool_scrubber)
        self.rejection = RejectionSampler(self.sampler)
        self.drafter = DraftProposer(model, draft_layers, self.batcher, self.sampler) if draft_layers else None
        self._generators: dict[str, torch.Generator] = {}
        self.graphs: DecodeGraphs | None = None  # CUDA: captured decode steps (runner/build.py)
        self.scrubber: DeviceScrubber | None = None  # CUDA: zeroes freed device memory once per step
        self._device_tokens = DeviceTokens(device)  # the last launched step's sampled ids (run ahead)

    def _scrub_step_metadata(self, replayed: bool) -> None:
        """CUDA: zero the pinned and device buffers that held this step's token ids and positions."""
        if self.graphs is not None and replayed:
            self.graphs.scrub()
        else:
            self.batcher.scrub()

    def _begin_step(self) -> None:
        if self.scrubber is not None:
            self.scrubber.sweep()  # KV blocks freed while scheduling: zeroed before this step writes any
            self.scrubber.step_ran()

    def launch(self, plan: SchedulerOutput) -> PendingStep:
        """A plain step (run_ahead.py), launched without waiting for anything: decoding rows may
        take their token from the last launched step's sampled ids, still on the device."""
        seqs = plan.seqs
        self._begin_step()
        with torch.inference_mode():
            inputs = [_seq_input(s, None, self.model.rope_shift(s.long_context)) for s in seqs]
            replay = self.graphs is not None and self.graphs.fits(inputs)
            if self.graphs is not None and replay:
                order = list(range(len(inputs)))
                rows = order
                logits = self.graphs.run(inputs, lambda ids: self._device_tokens.patch(ids, seqs, rows))
            else:
                batch = self.batcher.build(inputs)
                self._device_tokens.patch(
                    batch.input_ids, seqs, last_rows([len(x.token_ids) for x in inputs], batch.order)
                )
                hidden = self.model.forward(batch.input_ids, batch.positions, batch.meta)
                order = [i for i in batch.order if inputs[i].num_logits]
                logits = self.model.logits(hidden[batch.logit_rows])  # [R, V]
            rids = [seqs[i].request_id for i in order]
            if order:
                ids = self.sampler.choose(logits, [self._sample_row(seqs[i]) for i in order])
            else:
                ids = torch.zeros(0, dtype=torch.int64, device=self.device)
            logits.zero_()  # derived from user content: wipe before the allocator reuses it
            self._scrub_step_metadata(replay)
            self._device_tokens.keep(ids, rids)
            return self._device_tokens.send_home(ids, rids)

    def execute(self, plan: SchedulerOutput) -> dict[str, SampledTokens]:
        seqs = plan.seqs
        if any(s.device_tokens for s in seqs):
            raise RuntimeError("a synchronous step cannot take tokens from the device")
        self._device_tokens.clear()
        self._begin_step()
        with torch.inference_mode():
            drafts = self._drafts(seqs)
            inputs = [_seq_input(s, d, self.model.rope_shift(s.long_context)) for s, d in zip(seqs, drafts)]
            scoring = [i for i, s in enumerate(seqs) if s.prompt_targets]
            replay = self.graphs is not None and not scoring and self.graphs.fits(inputs)
            prompt_lps: dict[int, list[TokenLogprobs]] = {}
            if self.graphs is not None and replay:
                order, logits = list(range(len(inputs))), self.graphs.run(inputs)  # a replayed decode step
            else:
                batch = self.batcher.build(inputs)
                hidden = self.model.forward(batch.input_ids, batch.positions, batch.meta)
                if scoring:
                    prompt_lps = self._score_prompts(seqs, inputs, batch.order, hidden, scoring)
                order = [i for i in batch.order if inputs[i].num_logits]
                if not order:
                    self._scrub_step_metadata(False)
                    return {seqs[i].request_id: SampledTokens([], None, lps) for i, lps in prompt_lps.items()}
                logits = self.model.logits(hidden[batch.logit_rows])  # [R, V]
            _mask_guided(logits, [seqs[i] for i in order], [drafts[i] for i in order])
            results = self._sample(logits, seqs, order, drafts)
            logits.zero_()  # derived from user content: wipe before the allocator reuses it
            self._scrub_step_metadata(replay)
        by_id = {seqs[i].request_id: s for i, s in zip(order, results)}
        return _with_prompt_logprobs(by_id, seqs, prompt_lps)

    def _sample(
        self, logits: torch.Tensor, seqs: Sequence[ScheduledSeq], order: list[int], drafts: list[Drafted | None]
    ) -> list[SampledTokens]:
        """The tokens of the logit rows [R, V], one row group per sequence in `order`: drafts verified
        (their distributions zeroed after) when any sequence speculates, else one token each."""
        rows = [self._sample_row(seqs[i]) for i in order]
        if all(d is None for d in drafts):
            out = self.sampler(logits, rows)
            return [SampledTokens([t], None if lp is None else [lp]) for t, lp in zip(out.token_ids, out.logprobs)]
        spec = []
        for r, i in zip(rows, order):
            d = drafts[i]
            spec.append(SpecRow(r, [], None) if d is None else SpecRow(r, d.token_ids, d.probs))
        results = [SampledTokens(v.token_ids, v.logprobs) for v in self.rejection(logits, spec)]
        for d in drafts:
            if d is not None and d.probs is not None:
                d.probs.zero_()
        return results

    def _score_prompts(
        self,
        seqs: Sequence[ScheduledSeq],
        inputs: list[SeqInput],
        packed: list[int],
        hidden: torch.Tensor,
        scoring: list[int],
    ) -> dict[int, list[TokenLogprobs]]:
        """Prompt logprobs of the sequences in `scoring` (indices into seqs), from the pass's
        hidden states [T, H]; `packed` is the order the batch packed the sequences' rows in."""
        first_row, row = {}, 0
        for i in packed:
            first_row[i] = row
            row += len(inputs[i].token_ids)
        out = {}
        for i in scoring:
            s = seqs[i]
            targets = s.prompt_targets or []
            lo = first_row[i] + s.prompt_logprobs_start - s.start
            out[i] = score_prompt(
                self.model.logits, hidden[lo : lo + len(targets)], targets, s.params.prompt_logprobs or 0
            )
        return out

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
        self._device_tokens.forget(request_id)
        if self.scrubber is not None:  # the steps' temporaries are freed but not cleared: at the sweep
            self.scrubber.request_ended()

    def sweep(self) -> None:
        if self.graphs is not None:
            self.graphs.settle()
        if self.scrubber is not None:
            self.scrubber.sweep()

    def num_held(self) -> int:
        return len(self._generators)

    def scrub_workers(self) -> None:
        self._pool_scrubber.scrub_pool_stacks()

    def _drafts(self, seqs: Sequence[ScheduledSeq]) -> list[Drafted | None]:
        """Each sequence's drafts: the request's own, or made now by the draft model (None: no drafts)."""
        out: list[Drafted | None] = [None] * len(seqs)
        own = [i for i, s in enumerate(seqs) if s.draft_token_ids]
        for i in own:
            out[i] = Drafted(list(seqs[i].draft_token_ids), None)
        spec = [i for i, s in enumerate(seqs) if s.model_drafts]
        if spec:
            if self.drafter is None:
                raise ValueError("the plan asks for model drafts but this runner has no draft model")
            jobs = [
                DraftSeq(
                    list(seqs[i].block_table),
                    seqs[i].start,
                    seqs[i].token_ids[-1],
                    seqs[i].model_drafts,
                    self._sample_row(seqs[i]),
                    self.model.rope_shift(seqs[i].long_context),
                    tuple(list(t) for t in seqs[i].group_tables),
                )
                for i in spec
            ]
            for i, d in zip(spec, self.drafter.propose(jobs)):
                out[i] = d
        return out

    def _sample_row(self, seq: ScheduledSeq) -> SampleRow:
        p = seq.params
        gen = None
        if p.seed is not None and not p.greedy:
            gen = self._generators.get(seq.request_id)
            if gen is None:
                gen = torch.Generator(device=self.device)
                gen.manual_seed(p.seed % 2**64)
                self._generators[seq.request_id] = gen
        return SampleRow(params=p, generator=gen, prompt_ids=seq.prompt_ids, output_ids=seq.output_ids)


def _with_prompt_logprobs(
    by_id: dict[str, SampledTokens], seqs: Sequence[ScheduledSeq], prompt_lps: dict[int, list[TokenLogprobs]]
) -> dict[str, SampledTokens]:
    """The step's results with each scored sequence's prompt logprobs attached (a sequence that
    sampled nothing this step gets them alone)."""
    for i, lps in prompt_lps.items():
        rid = seqs[i].request_id
        got = by_id.get(rid)
        by_id[rid] = SampledTokens(got.token_ids, got.logprobs, lps) if got else SampledTokens([], None, lps)
    return by_id


def _mask_guided(logits: torch.Tensor, seqs: list[ScheduledSeq], drafts: list[Drafted | None]) -> None:
    """Structured outputs: mask the logit rows of sequences with a grammar (rows in `seqs` order,
    1 + drafts each)."""
    guided, row = [], 0
    for s, d in zip(seqs, drafts):
        if s.guide is not None:
            guided.append(GuidedSeq(row, s.guide, list(d.token_ids) if d is not None else []))
        row += 1 + (len(d.token_ids) if d is not None else 0)
    if guided:
        apply_grammar_masks(logits, guided)


def _seq_input(seq: ScheduledSeq, drafts: Drafted | None, rope_shift: int) -> SeqInput:
    """The sequence's tokens: known ones, then its drafts; logits at the last token and every draft."""
    ids = list(seq.token_ids)
    if drafts is not None:
        ids += drafts.token_ids
    return SeqInput(
        list(seq.block_table),
        seq.start,
        ids,
        1 + seq.num_drafts if seq.sample else 0,
        rope_shift,
        tuple(list(t) for t in seq.group_tables),
    )
