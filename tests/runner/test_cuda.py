"""The CUDA path (Triton paged attention and ops, CUDA graphs): greedy float32 parity with
transformers and with the CPU path. Skipped without a GPU."""

import random

import pytest
import torch

from tests.support.families import LLAMA3_SCALING, hf_greedy, ours
from traceless import LLM, SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def tiny_mistral_dir(tmp_path_factory):
    from tests.conftest import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-mistral-gpu"), "mistral", seed=3, sliding_window=None)


@pytest.fixture(scope="module")
def tiny_llama3_dir(tmp_path_factory):
    from tests.conftest import make_tiny_model

    return make_tiny_model(
        tmp_path_factory.mktemp("tiny-llama3-gpu"), "llama", seed=2, rope_scaling=LLAMA3_SCALING, rope_theta=500000.0
    )


def _prompts(seed: str) -> list[list[int]]:
    rng = random.Random(seed)
    # a single token, a partial block, several blocks, one long enough to chunk
    return [[rng.randrange(3, 384) for _ in range(n)] for n in (1, 5, 16, 17, 40, 100)]


def _gpu(path, **kw) -> LLM:
    return LLM(str(path), dtype="float32", device="cuda", kv_cache_memory=8 * 2**20, **kw)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "llama3", "mistral"])
def test_cuda_matches_transformers_and_cpu(kind, tiny_llama_dir, tiny_qwen2_dir, tiny_llama3_dir, tiny_mistral_dir):
    from transformers import AutoModelForCausalLM

    path = {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir, "llama3": tiny_llama3_dir, "mistral": tiny_mistral_dir}[
        kind
    ]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = _prompts(kind)
    want = [hf_greedy(hf, p, 24) for p in prompts]
    # a small token budget forces chunked prefill mixed with decodes
    llm = _gpu(path, max_num_batched_tokens=48)
    assert llm.engine.model.attention == "triton" and llm.engine.model.cuda_graphs > 0
    assert ours(llm, prompts, 24, batched=True) == want
    assert ours(llm, prompts, 24, batched=False) == want
    llm.engine.check_integrity()
    cpu = LLM(str(path), dtype="float32", device="cpu", kv_cache_memory=8 * 2**20)
    assert ours(cpu, prompts, 24, batched=True) == want


def test_graphs_on_and_off_give_the_same_tokens(tiny_llama_dir):
    prompts = _prompts("graphs") * 3  # 18 sequences: padded up to the captured size 24
    graphs = _gpu(tiny_llama_dir, max_num_seqs=32)
    eager = _gpu(tiny_llama_dir, max_num_seqs=32, enforce_eager=True)
    assert eager.engine.model.cuda_graphs == 0 and graphs.engine.model.cuda_graphs == 7
    assert graphs.engine.model.capture_s > 0
    assert ours(graphs, prompts, 20, batched=True) == ours(eager, prompts, 20, batched=True)
    graphs.engine.check_integrity()
    eager.engine.check_integrity()


def test_prefix_hits_preemption_and_sampling_stay_exact(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    rng = random.Random(7)
    shared = [rng.randrange(3, 384) for _ in range(40)]
    prompts = [shared + [rng.randrange(3, 384) for _ in range(n)] for n in (3, 9, 20, 33)]
    want = [hf_greedy(hf, p, 16) for p in prompts]
    # global prefix cache: later prompts hit the shared blocks; a tiny cache forces preemption
    llm = LLM(
        str(tiny_llama_dir),
        dtype="float32",
        device="cuda",
        kv_cache_memory=96 * 1024,
        prefix_cache="global",
        max_model_len=128,
    )
    assert ours(llm, prompts[:1], 16, batched=False) == want[:1]
    assert ours(llm, prompts, 16, batched=True) == want
    assert llm.engine.drop_prefix_cache() > 0  # the shared blocks were cached (and are zeroed now)
    llm.engine.check_integrity()
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=12, ignore_eos=True)
    a = llm.generate([{"prompt_token_ids": p} for p in prompts], seeded, use_tqdm=False)
    b = llm.generate([{"prompt_token_ids": p} for p in prompts], seeded, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    llm.engine.drop_prefix_cache()
    llm.engine.check_integrity()


@pytest.mark.parametrize("mode", ["ngram", "draft"])
def test_speculative_decoding_keeps_greedy_tokens(mode, tiny_llama_dir):
    prompts = [p * 3 for p in _prompts("spec")[2:5]]  # repeated text (48-120 tokens): drafts get accepted
    plain = _gpu(tiny_llama_dir)
    spec = _gpu(tiny_llama_dir, speculative=mode, **({"draft_layers": 1} if mode == "draft" else {}))
    assert ours(spec, prompts, 20, batched=True) == ours(plain, prompts, 20, batched=True)
    spec.engine.check_integrity()


def test_dummy_model_runs_on_cuda_in_bfloat16(tmp_path):
    import json

    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "vocab_size": 1024,
                "hidden_size": 256,
                "intermediate_size": 512,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "max_position_embeddings": 512,
            }
        )
    )
    llm = LLM(str(tmp_path), device="cuda", load_format="dummy", gpu_memory_utilization=0.2, max_model_len=512)
    assert llm.engine.model.load_format == "dummy" and llm.engine.model.dtype == "bfloat16"
    out = llm.generate(
        [{"prompt_token_ids": list(range(5, 5 + n))} for n in (3, 70)],
        SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
        use_tqdm=False,
    )
    assert all(len(o.outputs[0].token_ids) == 16 for o in out)
    llm.engine.check_integrity()


def test_torch_backend_still_matches(tiny_llama_dir):
    prompts = [list(range(5, 5 + n)) for n in (3, 20, 45)]
    cpu = LLM(str(tiny_llama_dir), dtype="float32", device="cpu", kv_cache_memory=2**20)
    gpu = LLM(str(tiny_llama_dir), dtype="float32", device="cuda", kv_cache_memory=2**20, attention_backend="torch")
    assert gpu.engine.model.attention == "torch"
    assert ours(gpu, prompts, 16, batched=True) == ours(cpu, prompts, 16, batched=True)
    gpu.engine.check_integrity()


def test_kv_offload_on_cuda_restores_exactly_and_leaves_no_temporaries(tiny_llama_dir):
    prompts = [list(range(5 + i, 45 + i)) for i in range(6)]
    roomy = _gpu(tiny_llama_dir)
    tight = LLM(
        str(tiny_llama_dir),
        dtype="float32",
        device="cuda",
        kv_cache_memory=96 * 1024,
        max_model_len=128,
        kv_offload="memory",
    )
    assert ours(tight, prompts, 24, batched=True) == ours(roomy, prompts, 24, batched=True)
    assert tight.engine.kv_stats().offload_bytes_out > 0  # preempted requests were sealed and restored
    tight.engine.check_integrity()


@pytest.mark.parametrize("eager", [False, True])
def test_async_scheduling_gives_the_same_tokens(tiny_llama_dir, eager):
    """Running ahead on the device: decode rows take their token from the last step's sampled ids
    (in the graphs' buffer, or the eager step's), greedy and seeded, with varied stops."""
    prompts = _prompts("ahead") * 3
    params = [
        SamplingParams(temperature=0.0 if i % 2 else 0.8, seed=i, max_tokens=4 + i % 11, ignore_eos=True)
        for i in range(len(prompts))
    ]
    runs = []
    for ahead in (False, True):
        llm = _gpu(tiny_llama_dir, max_num_seqs=32, enforce_eager=eager, async_scheduling=ahead)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        runs.append([o.outputs[0].token_ids for o in outs])
        llm.engine.check_integrity()
    assert runs[0] == runs[1]


def _compiled(kernel) -> int:
    """Kernels Triton has compiled for this JITFunction on the current device."""
    caches = kernel.device_caches[torch.cuda.current_device()]
    return len(caches[0] if isinstance(caches, tuple) else caches)


def test_no_kernel_compiles_after_warm_up(tiny_llama_dir):
    """After start (profiling pass, graph capture) and one request of each shape, new batch
    compositions compile nothing new."""
    from traceless.model.layers import triton_kernels as tk

    llm = LLM(str(tiny_llama_dir), dtype="float32", device="cuda", max_num_seqs=32, max_model_len=256)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in _prompts("warm")], params, use_tqdm=False)
    kernels = (
        tk._paged_attention_kernel,
        tk._combine_kernel,
        tk._rope_cache_kernel,
        tk._add_rms_norm_kernel,
        tk._silu_mul_kernel,
    )
    before = [_compiled(k) for k in kernels]
    rng = random.Random(9)
    for n in (3, 7, 13, 29):
        batch = [[rng.randrange(3, 384) for _ in range(rng.randrange(1, 90))] for _ in range(n)]
        llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
    assert [_compiled(k) for k in kernels] == before


@pytest.fixture(scope="module")
def family_dirs_gpu(tmp_path_factory):
    from tests.support.families import FAMILIES, make_family_model

    families = FAMILIES | {"gpt-oss": ("gpt_oss", {})}
    return {
        name: make_family_model(tmp_path_factory.mktemp(name), kind, seed=7 + i, **overrides)
        for i, (name, (kind, overrides)) in enumerate(families.items())
    }


@pytest.mark.parametrize(
    "name", ["qwen3", "qwen3-tied", "phi3-longrope", "phi3-partial", "gemma2", "gemma3", "mistral-window", "gpt-oss"]
)
def test_families_on_triton_match_transformers(name, family_dirs_gpu):
    """Qwen3 (q/k norms), Phi-3 (LongRoPE past the original context, partial rotary), Gemma 2
    (attention soft-capping), Gemma 3 (local and global layers, two RoPE bases), a windowed
    Mistral and gpt-oss (attention sinks, windows, experts): the Triton attention and ops with CUDA
    graphs give transformers' greedy tokens."""
    from tests.support.families import LENGTHS, hf_model

    path = family_dirs_gpu[name]
    rng = random.Random(name)
    prompts = [[rng.randrange(3, 384) for _ in range(n)] for n in LENGTHS]
    # the CPU engine is transformers' twin (tests/model/test_families.py). Phi-3 past its original
    # context is compared with the CPU engine only: transformers' own `generate` changed there
    # between versions (5.17 keeps the short-factor cache where 5.24 recomputes), and the GPU
    # image's transformers is not the one the suite pins
    want = ours(LLM(str(path), dtype="float32", kv_cache_memory=8 * 2**20), prompts, 20, batched=True)
    if not name.startswith("phi3"):
        assert [hf_greedy(hf_model(path), p, 20) for p in prompts] == want
    llm = _gpu(path, max_num_batched_tokens=24)
    assert llm.engine.model.attention == "triton"
    assert ours(llm, prompts, 20, batched=True) == want
    assert ours(llm, prompts[2:5], 20, batched=False) == want[2:5]
    llm.engine.check_integrity()
