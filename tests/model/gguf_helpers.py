"""Write tiny GGUF files the way llama.cpp's converter (convert_hf_to_gguf.py) does, so the GGUF
loader and tokenizer tests run on files shaped like real ones without downloading any.

`write_gguf` takes Hugging Face tensors (numpy, HF names), renames them to llama.cpp's names,
permutes the Q/K rows of `llama` models with llama.cpp's own `permute`, quantizes every 2-D tensor
to the requested type (1-D norms and biases stay F32, as llama.cpp keeps them) and returns what a
correct loader must produce: the dequantized values, back in HF row order, under traceless's
canonical names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# HF name (after "model.layers.N.") -> (llama.cpp name after "blk.N.", traceless canonical name)
LAYER_NAMES = {
    "input_layernorm.weight": ("attn_norm.weight", "attn_norm"),
    "self_attn.q_proj.weight": ("attn_q.weight", "q"),
    "self_attn.k_proj.weight": ("attn_k.weight", "k"),
    "self_attn.v_proj.weight": ("attn_v.weight", "v"),
    "self_attn.q_proj.bias": ("attn_q.bias", "q_bias"),
    "self_attn.k_proj.bias": ("attn_k.bias", "k_bias"),
    "self_attn.v_proj.bias": ("attn_v.bias", "v_bias"),
    "self_attn.o_proj.weight": ("attn_output.weight", "o"),
    "post_attention_layernorm.weight": ("ffn_norm.weight", "mlp_norm"),
    "mlp.gate_proj.weight": ("ffn_gate.weight", "gate"),
    "mlp.up_proj.weight": ("ffn_up.weight", "up"),
    "mlp.down_proj.weight": ("ffn_down.weight", "down"),
}
GLOBAL_NAMES = {
    "model.embed_tokens.weight": ("token_embd.weight", "embed"),
    "model.norm.weight": ("output_norm.weight", "norm"),
    "lm_head.weight": ("output.weight", "lm_head"),
}


def gguf_and_canonical_name(hf_name: str) -> tuple[str, str]:
    if hf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)  # model.layers.N.rest
    gguf_name, canonical = LAYER_NAMES[rest]
    return f"blk.{layer}.{gguf_name}", f"layers.{layer}.{canonical}"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Verbatim from llama.cpp's convert_hf_to_gguf.py (LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE vocabularies are written in it)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


@dataclass(frozen=True, slots=True)
class Vocab:
    """A `tokenizer.ggml.*` vocabulary: tokens, their llama.cpp types, merges (BPE) or scores (SPM)."""

    model: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    pre: str | None = None
    bos_id: int = 1
    eos_id: int = 2
    unk_id: int | None = None
    chat_template: str | None = None


NORMAL, CONTROL, BYTE = 1, 3, 6  # llama.cpp token types


def byte_level_vocab(size: int) -> Vocab:
    """A gpt2-style vocabulary of exactly `size` tokens: 3 control tokens, the 256 byte symbols,
    then merged pieces ("Ġa".."Ġz", then letter pairs) until `size` is reached."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    symbols = list(bytes_to_unicode().values())
    merges: list[str] = [f"Ġ {c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    merges += [f"{a} {b}" for a in "etaoinshrdlu" for b in "etaoinshrdlu"]
    merges = merges[: size - len(specials) - len(symbols)]
    tokens = specials + symbols + [m.replace(" ", "") for m in merges]
    if len(tokens) != size:
        raise ValueError(f"this generator makes at most {len(tokens)} tokens, not {size}")
    types = [CONTROL] * len(specials) + [NORMAL] * (len(tokens) - len(specials))
    return Vocab("gpt2", tokens, types, merges=merges, pre="gpt2", bos_id=1, eos_id=2)


def add_vocab(writer, vocab: Vocab) -> None:
    writer.add_tokenizer_model(vocab.model)
    if vocab.pre is not None:
        writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    if vocab.scores:
        writer.add_token_scores(vocab.scores)
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    if vocab.unk_id is not None:
        writer.add_unk_token_id(vocab.unk_id)
    if vocab.chat_template is not None:
        writer.add_chat_template(vocab.chat_template)


@dataclass(frozen=True, slots=True)
class Hyper:
    """The llama.cpp metadata of a model (from its HF config)."""

    arch: str
    n_layer: int
    n_ctx: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    rope_theta: float
    rms_eps: float
    vocab_size: int

    @classmethod
    def from_hf(cls, cfg: dict, arch: str = "llama") -> Hyper:
        theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        return cls(
            arch,
            cfg["num_hidden_layers"],
            cfg["max_position_embeddings"],
            cfg["hidden_size"],
            cfg["intermediate_size"],
            cfg["num_attention_heads"],
            cfg["num_key_value_heads"],
            float(theta),
            float(cfg["rms_norm_eps"]),
            cfg["vocab_size"],
        )


def add_hyper(writer, h: Hyper, skip: tuple[str, ...] = ()) -> None:
    a = h.arch
    values = {
        "block_count": h.n_layer,
        "context_length": h.n_ctx,
        "embedding_length": h.n_embd,
        "feed_forward_length": h.n_ff,
        "attention.head_count": h.n_head,
        "attention.head_count_kv": h.n_head_kv,
        "vocab_size": h.vocab_size,
    }
    for key, value in values.items():
        if key not in skip:
            writer.add_uint32(f"{a}.{key}", value)
    if "rope.freq_base" not in skip:
        writer.add_float32(f"{a}.rope.freq_base", h.rope_theta)
    if "attention.layer_norm_rms_epsilon" not in skip:
        writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", h.rms_eps)


def quantize_tensor(w: np.ndarray, qtype) -> tuple[np.ndarray, np.ndarray]:
    """(bytes or array to write, its dequantized float32 values)."""
    from gguf import GGMLQuantizationType, quants

    if w.ndim == 1:  # llama.cpp keeps norms and biases in F32
        qtype = GGMLQuantizationType.F32
    data = quants.quantize(np.ascontiguousarray(w, dtype=np.float32), qtype)
    return data, np.asarray(quants.dequantize(data, qtype), dtype=np.float32)


@dataclass(frozen=True, slots=True)
class GGUFSpec:
    """What to write. `tensors` are HF-named float arrays, quantized to `qtype`; `replace` maps a
    llama.cpp tensor name to (raw array, raw GGML type or None) written instead; `drop` omits
    llama.cpp tensor names; `skip_meta` omits `{arch}.` hyper-parameter keys (e.g. "block_count");
    `extra_meta` adds uint32 keys; `vocab` None writes no tokenizer."""

    hyper: Hyper
    tensors: dict[str, np.ndarray]
    qtype: object
    vocab: Vocab | None
    drop: tuple[str, ...] = ()
    replace: dict[str, tuple[np.ndarray, object]] = field(default_factory=dict)
    skip_meta: tuple[str, ...] = ()
    extra_meta: dict[str, int] = field(default_factory=dict)


def write_gguf(path: Path, spec: GGUFSpec) -> dict[str, np.ndarray]:
    """Writes the file; returns the values a correct loader yields, by canonical name."""
    import gguf

    h = spec.hyper
    writer = gguf.GGUFWriter(str(path), h.arch)
    add_hyper(writer, h, spec.skip_meta)
    for key, value in spec.extra_meta.items():
        writer.add_uint32(key, value)
    if spec.vocab is not None:
        add_vocab(writer, spec.vocab)
    expected: dict[str, np.ndarray] = {}
    for name, w in spec.tensors.items():
        gguf_name, canonical = gguf_and_canonical_name(name)
        if gguf_name in spec.drop:
            continue
        if gguf_name in spec.replace:
            raw, raw_type = spec.replace[gguf_name]
            writer.add_tensor(gguf_name, raw, raw_dtype=raw_type)
            continue
        w = np.asarray(w, dtype=np.float32)
        n_head = {"attn_q": h.n_head, "attn_k": h.n_head_kv}.get(gguf_name.split(".")[-2])
        permuted = h.arch == "llama" and n_head is not None
        data, deq_file = quantize_tensor(llama_cpp_permute(w, n_head) if permuted else w, spec.qtype)
        writer.add_tensor(gguf_name, data, raw_dtype=spec.qtype if data.dtype == np.uint8 else None)
        if permuted:
            # file row i holds original row order[i]; put every dequantized row back in its place
            order = llama_cpp_permute(np.arange(w.shape[0]), n_head)
            deq_file = deq_file[np.argsort(order)]
        expected[canonical] = deq_file
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def hf_state(model) -> dict[str, np.ndarray]:
    """A transformers model's parameters as float32 numpy arrays (tied lm_head left out)."""
    state = {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def hf_name(canonical: str) -> str:
    """traceless's canonical tensor name -> the transformers parameter name."""
    if not canonical.startswith("layers."):
        return next(hf for hf, (_, c) in GLOBAL_NAMES.items() if c == canonical)
    _, layer, short = canonical.split(".", 2)
    return f"model.layers.{layer}." + next(rest for rest, (_, c) in LAYER_NAMES.items() if c == short)


def to_hf_names(canonical: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {hf_name(name): w for name, w in canonical.items()}


def write_vocab_gguf(path: Path, vocab: Vocab, flags: dict[str, bool] | None = None) -> Path:
    """A GGUF holding only a vocabulary (transformers builds a tokenizer from this alone);
    `flags` adds boolean `tokenizer.ggml.*` keys such as add_bos_token or add_space_prefix."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    add_vocab(writer, vocab)
    for key, value in (flags or {}).items():
        writer.add_bool(f"tokenizer.ggml.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
