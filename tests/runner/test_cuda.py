"""The CUDA path (torch attention and ops): greedy parity with the CPU path. Skipped without a GPU."""
import pytest
import torch

from traceless import LLM, SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_cuda_greedy_equals_cpu(tiny_llama_dir):
    prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (3, 20, 45)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    cpu = LLM(str(tiny_llama_dir), dtype="float32", device="cpu", kv_cache_memory=2**20)
    gpu = LLM(str(tiny_llama_dir), dtype="float32", device="cuda", kv_cache_memory=2**20)
    want = [o.outputs[0].token_ids for o in cpu.generate(prompts, params, use_tqdm=False)]
    assert [o.outputs[0].token_ids for o in gpu.generate(prompts, params, use_tqdm=False)] == want
    assert gpu.engine.model.attention == "torch"
    gpu.engine.check_integrity()


def test_cuda_bfloat16_default_model_answers():
    llm = LLM(device="cuda", kv_cache_memory=256 * 2**20)
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0].outputs[0].text
    assert "Paris" in out
    llm.engine.check_integrity()
