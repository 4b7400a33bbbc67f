"""The self-speculation draft proposes exactly what the model's first layers (+ final norm and
lm_head) would generate greedily: checked against transformers with the layers cut."""
import pytest
import torch

from traceless import LLM, SamplingParams


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_drafts_are_the_truncated_models_greedy_continuation(request, kind):
    from transformers import AutoModelForCausalLM

    path = request.getfixturevalue(f"tiny_{kind}_dir")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    hf.model.layers = hf.model.layers[:1]  # the draft: layer 0, then the final norm and lm_head
    llm = LLM(str(path), dtype="float32", kv_cache_memory=2**21, block_size=4, speculative="draft", draft_layers=1)
    runner = llm.engine.runner
    seen = []
    real = runner._drafts

    def spy(chunks, tables):
        out = real(chunks, tables)
        for c, d in zip(chunks, out):
            if d is not None:
                seen.append((c.request.token_ids(0, c.request.num_tokens), d.token_ids))
        return out

    runner._drafts = spy
    prompts = [{"prompt_token_ids": [5, 9, 200, 31, 7, 7, 120, 44, 3]}, {"prompt_token_ids": list(range(40, 75))}]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    assert len(seen) > 10
    for context, drafts in seen:
        with torch.no_grad():
            ref = hf.generate(torch.tensor([context]), max_new_tokens=len(drafts), do_sample=False)[0, len(context):]
        assert drafts == ref.tolist()
    llm.engine.check_integrity()
