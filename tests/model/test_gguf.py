"""GGUF loading: tiny models written the way llama.cpp's converter writes them (Q/K rows permuted,
2-D tensors quantized, norms in F32) load to exactly the dequantized values and generate what
transformers generates on the same weights; bad files raise typed errors and leave the process able
to load a good model."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import make_tiny_model
from tests.model.gguf_helpers import (
    GGUFSpec,
    Hyper,
    byte_level_vocab,
    hf_name,
    hf_state,
    llama_cpp_permute,
    to_hf_names,
    write_gguf,
)
from traceless import LLM, SamplingParams
from traceless.errors import ModelLoadError, ModelNotFoundError, UnsupportedModelError
from traceless.model.gguf_loader import load_gguf
from traceless.model.loader import resolve_model_path

QTYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"]
# Largest |loaded - original| relative to the tensor's largest |value|, per type: half a step for
# Q8_0 (max/127), Q4_1 ((max-min)/15), F16, BF16 (8 bits); a whole step max/8 for Q4_0, whose
# codes run -8..7, so the block's extreme of the sign opposite to its largest value is clipped.
REL_TOL = {"F32": 0.0, "F16": 1e-3, "BF16": 4e-3, "Q8_0": 4.5e-3, "Q4_0": 0.126, "Q4_1": 0.068}
N_NEW = 12


def qtype(name: str):
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[name]


@dataclass(frozen=True, slots=True)
class Tiny:
    """A random transformers model and what it takes to write it as GGUF."""

    model: object  # transformers *ForCausalLM, eval mode, float32
    state: dict[str, np.ndarray]  # HF names
    hyper: Hyper

    def spec(self, qname: str, **changes) -> GGUFSpec:
        return GGUFSpec(self.hyper, self.state, qtype(qname), byte_level_vocab(self.hyper.vocab_size), **changes)


def make_tiny(path: Path, kind: str, seed: int, **overrides) -> Tiny:
    from transformers import AutoModelForCausalLM

    # hidden 64 and intermediate 256: rows are whole Q4/Q8 blocks (32) and ffn_down rows whole K-quant blocks (256)
    make_tiny_model(path, kind, seed=seed, intermediate_size=256, **overrides)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    cfg = json.loads((path / "config.json").read_text())
    return Tiny(model, hf_state(model), Hyper.from_hf(cfg, kind))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These models are tiny: one intra-op thread is fastest, and on a shared machine two threads
    that spin-wait on each other make every matmul many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Tiny:
    return make_tiny(tmp_path_factory.mktemp("hf-llama"), "llama", seed=7)


PROMPTS = [[5], [17, 300, 42, 8, 99, 250, 3], [random.Random(11).randrange(3, 384) for _ in range(40)]]


def hf_greedy(model, prompts: list[list[int]], n: int = N_NEW) -> list[list[int]]:
    with torch.no_grad():
        return [
            model.generate(
                torch.tensor([p]),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
            )[0, len(p) :].tolist()
            for p in prompts
        ]


def our_greedy(path: Path, prompts: list[list[int]], n: int = N_NEW) -> list[list[int]]:
    llm = LLM(str(path), dtype="float32", kv_cache_memory=8 * 2**20)
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.engine.check_integrity()
    return [list(o.outputs[0].token_ids) for o in outs]


def with_weights(model, canonical: dict[str, np.ndarray]):
    """A copy of `model` whose parameters are `canonical` (the values our loader must produce)."""
    import copy

    clone = copy.deepcopy(model)
    state = {k: torch.from_numpy(v) for k, v in to_hf_names(canonical).items()}
    if clone.config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    clone.load_state_dict(state, strict=True)
    return clone.eval()


# --------------------------------------------------------------------------------------------
# weights and generation


@pytest.mark.parametrize("qname", QTYPES)
def test_weights_equal_dequantized_values(tiny, tmp_path, qname):
    path = tmp_path / f"tiny-{qname}.gguf"
    expected = write_gguf(path, tiny.spec(qname))
    config, weights, meta = load_gguf(path, torch.float32)

    h = tiny.hyper
    assert (config.architecture, config.num_layers, config.hidden_size, config.intermediate_size) == (
        "llama",
        2,
        64,
        256,
    )
    assert (config.num_heads, config.num_kv_heads, config.head_dim, config.vocab_size) == (
        h.n_head,
        h.n_head_kv,
        16,
        384,
    )
    assert config.rope_theta == h.rope_theta and config.rms_norm_eps == pytest.approx(h.rms_eps)
    assert config.max_position_embeddings == h.n_ctx and not config.tie_word_embeddings
    assert meta["tokenizer.ggml.model"] == "gpt2"

    assert set(weights) == set(expected)
    for name, want in expected.items():
        got = weights[name]
        assert got.dtype == torch.float32
        assert torch.equal(got, torch.from_numpy(want)), name  # exact: loader dequantizes what was written
    # ...and that is the HF model up to quantization error (Q/K rows back in HF order)
    for name in expected:
        original = tiny.state[hf_name(name)]
        err = float(np.abs(weights[name].numpy() - original).max())
        assert err <= REL_TOL[qname] * float(np.abs(original).max()), (name, err)

    _, half, _ = load_gguf(path, torch.bfloat16)
    assert half["layers.1.k"].dtype == torch.bfloat16
    assert torch.equal(half["layers.1.k"], torch.from_numpy(expected["layers.1.k"]).to(torch.bfloat16))


def test_qk_rows_are_unpermuted(tiny, tmp_path):
    """The file really holds llama.cpp's permuted rows, and the loader undoes exactly that."""
    import gguf

    path = tmp_path / "tiny.gguf"
    write_gguf(path, tiny.spec("F32"))
    raw = {t.name: np.array(t.data) for t in gguf.GGUFReader(str(path)).tensors}
    _, weights, _ = load_gguf(path, torch.float32)
    q_hf = tiny.state["model.layers.0.self_attn.q_proj.weight"]
    k_hf = tiny.state["model.layers.0.self_attn.k_proj.weight"]
    assert not np.array_equal(raw["blk.0.attn_q.weight"], q_hf)  # the permutation is not the identity
    assert np.array_equal(raw["blk.0.attn_q.weight"], llama_cpp_permute(q_hf, tiny.hyper.n_head))
    assert np.array_equal(weights["layers.0.q"].numpy(), q_hf)
    assert np.array_equal(weights["layers.0.k"].numpy(), k_hf)
    assert np.array_equal(weights["layers.0.v"].numpy(), tiny.state["model.layers.0.self_attn.v_proj.weight"])


@pytest.mark.parametrize("qname", QTYPES)
def test_greedy_generation_matches_transformers_on_dequantized_weights(tiny, tmp_path, qname):
    path = tmp_path / f"tiny-{qname}.gguf"
    expected = write_gguf(path, tiny.spec(qname))
    # F32 must match the original model itself; the others the model with the dequantized weights
    reference = tiny.model if qname == "F32" else with_weights(tiny.model, expected)
    want = hf_greedy(reference, PROMPTS)
    assert our_greedy(path, PROMPTS) == want
    if qname in ("Q4_0", "Q4_1"):
        # the reference is not simply the original model: 4-bit weights change its output
        assert hf_greedy(tiny.model, PROMPTS) != want


def test_tied_embeddings_load_and_tie(tmp_path):
    tied = make_tiny(tmp_path / "hf-tied", "llama", seed=5, tie_word_embeddings=True)
    assert "lm_head.weight" not in tied.state
    path = tmp_path / "tied.gguf"
    expected = write_gguf(path, tied.spec("Q8_0"))
    config, weights, _ = load_gguf(path, torch.float32)
    assert config.tie_word_embeddings and "lm_head" not in weights
    assert torch.equal(weights["embed"], torch.from_numpy(expected["embed"]))
    assert our_greedy(path, PROMPTS) == hf_greedy(with_weights(tied.model, expected), PROMPTS)


def test_qwen2_gguf_is_not_unpermuted_and_keeps_biases(tmp_path):
    """llama.cpp writes qwen2 Q/K rows unpermuted (it uses NeoX RoPE); the loader must leave them."""
    qwen = make_tiny(tmp_path / "hf-qwen2", "qwen2", seed=6)
    path = tmp_path / "qwen2.gguf"
    expected = write_gguf(path, qwen.spec("F32"))
    config, weights, _ = load_gguf(path, torch.float32)
    assert config.architecture == "qwen2" and config.qkv_bias
    assert np.array_equal(weights["layers.0.q"].numpy(), qwen.state["model.layers.0.self_attn.q_proj.weight"])
    assert np.array_equal(weights["layers.1.k_bias"].numpy(), expected["layers.1.k_bias"])
    assert our_greedy(path, PROMPTS) == hf_greedy(qwen.model, PROMPTS)


# --------------------------------------------------------------------------------------------
# bad files: typed errors, then a good model still loads and generates


@pytest.fixture(scope="module")
def good(tiny, tmp_path_factory) -> tuple[Path, list[list[int]]]:
    path = tmp_path_factory.mktemp("good") / "good.gguf"
    expected = write_gguf(path, tiny.spec("Q8_0"))
    return path, hf_greedy(with_weights(tiny.model, expected), PROMPTS[:2], 6)


def assert_good_model_still_generates(good) -> None:
    path, want = good
    assert our_greedy(path, PROMPTS[:2], 6) == want


# the tensor each "missing-*" case leaves out, and the wrong-shaped matrix each "wrong-shape-*" case writes
_DROPPED = {"missing-ffn_up": "blk.1.ffn_up.weight", "missing-token_embd": "token_embd.weight"}
_WRONG_SHAPE = {
    "wrong-shape-attn_v": ("blk.0.attn_v.weight", (48, 64)),  # 3 kv heads' rows, the model has 2
    "wrong-shape-token_embd": ("token_embd.weight", (300, 64)),
}  # llama.vocab_size says 384


def bad_file(tiny, path: Path, case: str) -> None:
    """Writes the GGUF file `case` describes to `path`."""
    if case.startswith("truncated"):
        write_gguf(path, tiny.spec("Q8_0"))
        data = path.read_bytes()
        keep = {
            "truncated-empty": 0,
            "truncated-magic": 3,
            "truncated-header": 24,
            "truncated-metadata": 200,
            "truncated-half": len(data) // 2,
            "truncated-last-tensor": len(data) - 40,
        }[case]
        path.write_bytes(data[:keep])
    elif case == "random-bytes":
        path.write_bytes(random.Random(1).randbytes(4096))
    elif case == "magic-then-random-bytes":
        path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + random.Random(2).randbytes(4096))
    else:
        write_gguf(path, bad_spec(tiny, case))


def bad_spec(tiny, case: str):
    """The GgufSpec of a well-formed file that is wrong for `case`."""
    h = tiny.hyper
    if case in ("arch-gpt2", "arch-mamba"):
        arch = case.split("-")[1]
        return dataclasses.replace(tiny.spec("F32"), hyper=dataclasses.replace(h, arch=arch))
    if case == "q5_0-tensor":
        # ffn_down rows are 256 wide: eight Q5_0 blocks (22 bytes) each; the bytes need not be sensible
        raw = np.frombuffer(random.Random(3).randbytes(64 * 176), dtype=np.uint8).reshape(64, 176)
        return tiny.spec("Q8_0", replace={"blk.1.ffn_down.weight": (raw, qtype("Q5_0"))})
    if case in _DROPPED:
        return tiny.spec("Q8_0", drop=(_DROPPED[case],))
    if case in _WRONG_SHAPE:
        name, shape = _WRONG_SHAPE[case]
        return tiny.spec("Q8_0", replace={name: (np.zeros(shape, dtype=np.float32), None)})
    if case == "tokenizer-larger-than-model":
        # a 320-row model with the 384-token vocabulary
        small = {
            "token_embd.weight": (np.zeros((320, 64), dtype=np.float32), None),
            "output.weight": (np.zeros((320, 64), dtype=np.float32), None),
        }
        spec = tiny.spec("F32", replace=small)
        return dataclasses.replace(spec, hyper=dataclasses.replace(h, vocab_size=320))
    if case == "missing-block_count":
        return tiny.spec("Q8_0", skip_meta=("block_count",))
    if case == "extra-layer":
        return dataclasses.replace(tiny.spec("Q8_0"), hyper=dataclasses.replace(h, n_layer=1))
    raise ValueError(case)


# case -> (error type, words the message must contain)
BAD_FILES = {
    "truncated-empty": (ModelLoadError, ["bad.gguf"]),
    "truncated-magic": (ModelLoadError, ["bad.gguf"]),
    "truncated-header": (ModelLoadError, ["bad.gguf"]),
    "truncated-metadata": (ModelLoadError, ["bad.gguf"]),
    "truncated-half": (ModelLoadError, ["bad.gguf"]),
    "truncated-last-tensor": (ModelLoadError, ["bad.gguf"]),
    "random-bytes": (ModelLoadError, ["bad.gguf"]),
    "magic-then-random-bytes": (ModelLoadError, ["bad.gguf"]),
    "arch-gpt2": (UnsupportedModelError, ["'gpt2'", "llama"]),
    "arch-mamba": (UnsupportedModelError, ["'mamba'", "llama"]),
    "q5_0-tensor": (UnsupportedModelError, ["Q5_0", "blk.1.ffn_down.weight"]),
    "missing-ffn_up": (ModelLoadError, ["up"]),
    "missing-token_embd": (ModelLoadError, ["emb"]),
    "wrong-shape-attn_v": (ModelLoadError, ["(48, 64)", "(32, 64)"]),
    "wrong-shape-token_embd": (ModelLoadError, ["(300, 64)", "(384, 64)"]),
    "tokenizer-larger-than-model": (ModelLoadError, ["384", "320"]),
    "missing-block_count": (ModelLoadError, ["llama.block_count"]),
    "extra-layer": (ModelLoadError, ["layers.1"]),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_gguf_raises_typed_error(tiny, good, tmp_path, case):
    error, words = BAD_FILES[case]
    path = tmp_path / "bad.gguf"
    bad_file(tiny, path, case)
    with pytest.raises(error) as info:
        LLM(str(path), dtype="float32", kv_cache_memory=8 * 2**20)
    for word in words:
        assert word in str(info.value), (case, str(info.value))
    assert_good_model_still_generates(good)


def test_nonexistent_path_is_model_not_found(good, tmp_path):
    missing = tmp_path / "nowhere" / "model.gguf"
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        LLM(str(missing), dtype="float32")
    assert_good_model_still_generates(good)


def test_a_hugging_face_model_id_is_told_how_to_get_a_local_copy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # "Qwen/Qwen3-0.6B" is not a path here
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model_path("Qwen/Qwen3-0.6B")
    message = str(info.value)
    assert "Hugging Face model id" in message and "local directory or a GGUF file" in message
    assert "download Qwen/Qwen3-0.6B --local-dir" in message
    with pytest.raises(ModelNotFoundError) as info:  # a path that is plainly a path gets no such advice
        resolve_model_path(str(tmp_path / "nowhere" / "model.gguf"))
    assert "Hugging Face" not in str(info.value)


def test_gguf_without_suffix_is_recognized_by_magic(good, tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(good[0].read_bytes())
    assert our_greedy(path, PROMPTS[:2], 6) == good[1]


def test_no_vocab_size_and_no_tokenizer_is_a_typed_error(tiny, tmp_path):
    """Without `llama.vocab_size` the vocabulary size comes from the token list; with neither the
    loader must say so, not fail with a KeyError."""
    path = tmp_path / "novocab.gguf"
    write_gguf(path, dataclasses.replace(tiny.spec("F32"), vocab=None, skip_meta=("vocab_size",)))
    with pytest.raises(ModelLoadError, match="vocab|token"):
        load_gguf(path, torch.float32)


def test_vocab_size_falls_back_to_the_token_list(tiny, tmp_path):
    path = tmp_path / "tokens-only.gguf"
    write_gguf(path, tiny.spec("F32", skip_meta=("vocab_size",)))
    config, _, _ = load_gguf(path, torch.float32)
    assert config.vocab_size == 384


@pytest.mark.parametrize("key", ["attention.head_count_kv", "attention.head_count"])
def test_zero_head_count_is_a_typed_error(tiny, tmp_path, key):
    path = tmp_path / "zero.gguf"
    write_gguf(path, tiny.spec("F32", skip_meta=(key,), extra_meta={f"llama.{key}": 0}))
    with pytest.raises(ModelLoadError, match=key.rsplit(".", 1)[-1]):
        load_gguf(path, torch.float32)


def test_partial_rotary_dimension_is_refused(tiny, tmp_path):
    """`llama.rope.dimension_count` below head_dim means RoPE on part of each head; the model
    implementation rotates whole heads, so such a file must be refused (llama.cpp refuses a llama
    model whose n_rot differs from the head size), not run with the wrong positions."""
    path = tmp_path / "partial-rope.gguf"
    write_gguf(path, tiny.spec("F32", extra_meta={"llama.rope.dimension_count": 8}))  # head_dim is 16
    with pytest.raises(UnsupportedModelError, match="rope.dimension_count|rotary"):
        load_gguf(path, torch.float32)


def test_full_rotary_dimension_is_accepted(tiny, tmp_path):
    path = tmp_path / "full-rope.gguf"
    write_gguf(path, tiny.spec("F32", extra_meta={"llama.rope.dimension_count": 16}))
    config, _, _ = load_gguf(path, torch.float32)
    assert config.head_dim == 16


def test_loaded_weights_do_not_alias_the_file(tiny, tmp_path):
    """Weights are copied out of the file: rewriting the file in place (a re-download, a
    re-quantization) must not change a loaded model, and truncating it must not crash one."""
    path = tmp_path / "model.gguf"
    write_gguf(path, tiny.spec("F32"))
    _, weights, _ = load_gguf(path, torch.float32)
    snapshot = {name: w.clone() for name, w in weights.items()}
    llm = LLM(str(path), dtype="float32", kv_cache_memory=8 * 2**20)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    before = llm.generate({"prompt_token_ids": PROMPTS[1]}, params, use_tqdm=False)[0].outputs[0].token_ids

    size = path.stat().st_size
    with path.open("r+b") as f:  # same inode, same length: every mapping of the file sees this
        f.seek(size // 4)
        f.write(bytes(size - size // 4))
    changed = sorted(name for name, w in weights.items() if not torch.equal(w, snapshot[name]))
    assert changed == []
    after = llm.generate({"prompt_token_ids": PROMPTS[1]}, params, use_tqdm=False)[0].outputs[0].token_ids
    assert after == before


# --------------------------------------------------------------------------------------------
# the real default model


@pytest.mark.slow
def test_default_model_loads(default_model_path):
    import gguf

    start = time.perf_counter()
    config, weights, meta = load_gguf(default_model_path, torch.float32)
    elapsed = time.perf_counter() - start
    assert elapsed < 60, f"loading the default model took {elapsed:.1f} s"
    assert (config.architecture, config.num_layers, config.hidden_size, config.intermediate_size) == (
        "llama",
        30,
        576,
        1536,
    )
    assert (config.num_heads, config.num_kv_heads, config.head_dim, config.vocab_size) == (9, 3, 64, 49152)
    assert config.tie_word_embeddings and "lm_head" not in weights
    assert config.rope_theta == 100000.0 and config.max_position_embeddings == 8192
    assert weights["embed"].shape == (49152, 576) and weights["layers.29.down"].shape == (576, 1536)
    assert len(weights) == 2 + 30 * 9
    assert all(bool(torch.isfinite(w).all()) for w in weights.values())
    assert meta["tokenizer.ggml.pre"] == "smollm"

    # the Q4_1 K rows (3 heads) come back as llama.cpp's permutation, undone
    from gguf import quants

    tensor = next(t for t in gguf.GGUFReader(str(default_model_path)).tensors if t.name == "blk.29.attn_k.weight")
    assert tensor.tensor_type.name == "Q4_1"
    in_file = np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    assert np.array_equal(llama_cpp_permute(weights["layers.29.k"].numpy(), 3), in_file)


def test_the_config_is_read_without_the_weights(good):
    from traceless.model.gguf_loader import load_gguf
    from traceless.model.loader import read_model_config

    path, _ = good
    assert read_model_config(path) == load_gguf(path, torch.float32)[0]
