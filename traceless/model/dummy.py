"""`--load-format dummy`: a model of real shape with random weights, from its config.json alone.

Benchmarks need the cost of a model (its shapes), not what it says. The weights are drawn from a
seeded generator on the target device (an 8B model is drawn on the GPU in well under a second,
where copying 16 GB from the host would take many), each tensor from its own seed (the model's
seed and the tensor's place in `weight_shapes`), so the same seed on the same device gives the
same weights in whatever order they are drawn. The loader draws each tensor when the decoder takes
it (`lazy_dummy_weights`): with `--quantization fp8` a layer's bf16 matrices exist only while they
are quantized, which is how the 70B shape loads on one H200.

Scale: every matrix is N(0, 1 / fan_in), so each matmul keeps unit variance; norms are ones. With
RMSNorm in front of every block the residual stream grows only as the square root of the depth,
far inside bfloat16's range: logits stay finite and greedy tokens vary (vLLM's uniform(-1e-3, 1e-3)
makes every logit nearly equal, which hides wrong indexing in a parity check).

The tokenizer is synthetic (see `synthetic_tokenizer`): byte-level for encoding, every id
decodes, so detokenization and stop checks run their real code paths.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from traceless.errors import ModelLoadError
from traceless.model.config import ModelConfig
from traceless.model.hf_config import from_hf_config
from traceless.model.lazy_weights import LazyWeights
from traceless.model.tokenizer import Tokenizer

DUMMY_SEED = 0
_SEED_STRIDE = 1 << 20  # tensor i of seed s is drawn from seed s * stride + i
# A plain "role: content" template, so chat requests work against a dummy model too.
_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
_EOS_TEXT = "<|endoftext|>"


def read_dummy_config(path: Path) -> ModelConfig:
    """The ModelConfig of a directory (or a config.json file) holding only the model's config.json."""
    import json

    file = path / "config.json" if path.is_dir() else path
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read the model's config.json ({type(exc).__name__})") from None
    if not isinstance(raw, dict):
        raise ModelLoadError("config.json must hold a JSON object")
    return from_hf_config(raw)


def weight_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Canonical tensor names (as the loaders produce them) and their shapes, in drawing order."""
    H, D, F = c.hidden_size, c.head_dim, c.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"embed": (c.vocab_size, H)}
    for i in range(c.num_layers):
        p = f"layers.{i}."
        shapes |= {
            p + "attn_norm": (H,),
            p + "q": (c.num_heads * D, H),
            p + "k": (c.num_kv_heads * D, H),
            p + "v": (c.num_kv_heads * D, H),
            p + "o": (H, c.num_heads * D),
            p + "mlp_norm": (H,),
        }
        if c.moe is not None and c.sparse(i):
            shapes |= {p + name: shape for name, shape in c.moe.weight_shapes().items()}
        else:
            shapes |= {p + "gate": (F, H), p + "up": (F, H), p + "down": (H, F)}
        if c.qkv_bias:
            shapes |= {
                p + "q_bias": (c.num_heads * D,),
                p + "k_bias": (c.num_kv_heads * D,),
                p + "v_bias": (c.num_kv_heads * D,),
            }
        if c.o_bias:
            shapes[p + "o_bias"] = (H,)
        if c.attn_sinks:
            shapes[p + "sinks"] = (c.num_heads,)
        if c.qk_norm:
            shapes |= {p + "q_norm": (D,), p + "k_norm": (D,)}
        if c.sandwich_norms:
            shapes |= {p + "post_attn_norm": (H,), p + "post_mlp_norm": (H,)}
    shapes["norm"] = (H,)
    if not c.tie_word_embeddings:
        shapes["lm_head"] = (c.vocab_size, H)
    return shapes


def dummy_weights(
    c: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int = DUMMY_SEED
) -> dict[str, torch.Tensor]:
    """Random weights of the model's shapes on `device`; deterministic for (seed, device, dtype)."""
    return dict(iter_dummy_weights(c, dtype, device, seed))


def iter_dummy_weights(
    c: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int = DUMMY_SEED
) -> Iterator[tuple[str, torch.Tensor]]:
    """The same weights one tensor at a time (a peer engine copies each into its own model, so
    two full copies never share the device)."""
    for index, (name, shape) in enumerate(weight_shapes(c).items()):
        yield name, _draw(c, name, shape, dtype, device, seed, index)


def lazy_dummy_weights(c: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int = DUMMY_SEED) -> LazyWeights:
    """The same weights, each drawn when the decoder takes it."""
    weights = LazyWeights()
    for index, (name, shape) in enumerate(weight_shapes(c).items()):
        weights.add(name, functools.partial(_draw, c, name, shape, dtype, device, seed, index))
    return weights


def _draw(
    c: ModelConfig, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int, index: int
) -> torch.Tensor:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed * _SEED_STRIDE + index)
    t = torch.empty(shape, dtype=dtype, device=device)
    if name.endswith("norm"):
        t.fill_(1.0 - c.norm_offset)  # a norm of ones as applied (Gemma applies 1 + w)
    elif name.endswith("_bias"):
        t.normal_(0.0, 0.02, generator=gen)
    elif name.endswith("sinks"):
        t.normal_(0.0, 1.0, generator=gen)  # logits of the order of the scores
    else:
        # matrices [out, in] and stacked experts [E, out, in]: fan_in is the last dimension
        t.normal_(0.0, 1.0 if name == "embed" else 1.0 / math.sqrt(shape[-1]), generator=gen)
    return t


def synthetic_tokenizer(vocab_size: int) -> Tokenizer:
    """A byte-level tokenizer with exactly `vocab_size` ids: ids 0-255 are the 256 bytes (text
    encodes to them), ids 256 .. V-2 decode to " w<id>", and V-1 is the end-of-text token. No
    merges: it is for running real shapes, not for language."""
    if vocab_size < 258:
        raise ModelLoadError(f"a dummy model needs a vocabulary of at least 258 ids, not {vocab_size}")
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # 256 printable stand-ins for the bytes
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab |= {f"\u0120w{i}": i for i in range(256, vocab_size - 1)}  # \u0120: byte-level space
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(_EOS_TEXT, special=True, normalized=False)])
    eos = backend.token_to_id(_EOS_TEXT)
    if eos != vocab_size - 1 or backend.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise ModelLoadError("the synthetic tokenizer did not come out at the model's vocabulary size")
    return Tokenizer(backend, bos_id=None, eos_ids=frozenset({eos}), add_bos=False, chat_template=_CHAT_TEMPLATE)
