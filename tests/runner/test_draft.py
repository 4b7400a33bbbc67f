"""The self-speculation draft proposes exactly what the model's first layers (+ final norm and
lm_head) would generate greedily: checked against transformers with the layers cut."""

import pytest
import torch

from tests.conftest import llm_with_executor
from traceless import SamplingParams
from traceless.config import EngineConfig


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_drafts_are_the_truncated_models_greedy_continuation(request, kind):
    from transformers import AutoModelForCausalLM

    path = request.getfixturevalue(f"tiny_{kind}_dir")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    hf.model.layers = hf.model.layers[:1]  # the draft: layer 0, then the final norm and lm_head
    config = EngineConfig(
        model=str(path), dtype="float32", kv_cache_memory=2**21, block_size=4, speculative="draft", draft_layers=1
    )
    seen = []  # (request id, position of the last sampled token, drafts)

    def watch(runner):
        real = runner._drafts

        def spy(seqs):
            out = real(seqs)
            seen.extend((s.request_id, s.start, d.token_ids) for s, d in zip(seqs, out) if d is not None)
            return out

        runner._drafts = spy
        return runner

    llm = llm_with_executor(config, watch)
    prompts = [{"prompt_token_ids": [5, 9, 200, 31, 7, 7, 120, 44, 3]}, {"prompt_token_ids": list(range(40, 75))}]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    assert len(seen) > 10
    tokens = {f"gen-{i}": list(o.prompt_token_ids) + list(o.outputs[0].token_ids) for i, o in enumerate(outs)}
    for rid, start, drafts in seen:
        context = tokens[rid][: start + 1]  # greedy: the final output holds every token the step saw
        with torch.no_grad():
            ref = hf.generate(torch.tensor([context]), max_new_tokens=len(drafts), do_sample=False)[0, len(context) :]
        assert drafts == ref.tolist()
    llm.engine.check_integrity()
