"""Model hyper-parameters: one decoder, with every per-family difference as data.

The parsers (model/hf_config.py for config.json, model/gguf_config.py for GGUF metadata) fill a
ModelConfig; model/llama.py runs any ModelConfig. What differs between the families:

    family   norms                     q/k norm  activation  embed scale  attention           rope
    llama    x*w                       -         silu        -            1/sqrt(D)           llama3/linear
    mistral  x*w                       -         silu        -            window (all layers) -
    qwen2    x*w, q/k/v bias           -         silu        -            -                   -
    qwen3    x*w                       per head  silu        -            -                   -
    phi3     x*w (fused qkv, gate_up)  -         silu        -            window (optional)   longrope, partial
    gemma2   x*(1+w), post-attn/-mlp   -         gelu_tanh   sqrt(H)      softcap, window     -
    gemma3   x*(1+w), post-attn/-mlp   per head  gelu_tanh   sqrt(H)      window (local)      local/global base
    mixtral  x*w                       -         silu        -            window (optional)   -
    qwen3moe x*w                       per head  silu        -            -                   -
    gpt_oss  x*w                       -         silu        -            sinks, window       yarn

Mixture-of-experts families (mixtral, qwen3_moe, gpt_oss) carry `moe`: the experts' hyper-parameters and
which layers have them (model/moe_checkpoint.py); the other layers keep the dense gated MLP.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from traceless.errors import UnsupportedModelError
from traceless.model.kv_groups import KVGroups, kv_groups

if TYPE_CHECKING:
    from traceless.model.fp8.config import Fp8Config
    from traceless.model.moe_checkpoint import MoESpec


class Activation(Enum):
    SILU = "silu"
    GELU_TANH = "gelu_tanh"  # gelu with the tanh approximation (gelu_pytorch_tanh)


@dataclass(frozen=True, slots=True)
class RopeScaling:
    kind: str  # "linear" | "llama3" | "longrope" | "yarn"
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # longrope: per-frequency divisors for short and long contexts, and the cos/sin multiplier
    # (yarn's too)
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0
    # yarn: the rotations bounding the ramp between interpolated and extrapolated frequencies
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True  # the ramp's bounds rounded outwards to whole dimensions


@dataclass(frozen=True, slots=True)
class LayerRope:
    """The rotary embedding of one kind of layer (Gemma 3's local layers have their own base)."""

    theta: float
    scaling: RopeScaling | None


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool = False  # a bias on the attention output projection (gpt-oss)
    attn_sinks: bool = False  # a learned logit per head joining each softmax, attending nothing (gpt-oss)
    rope_scaling: RopeScaling | None = None
    # Sliding-window attention: layer i sees the last layer_windows[i] keys (0: every key). Empty:
    # no layer has a window.
    layer_windows: tuple[int, ...] = ()
    local_rope_theta: float | None = None  # rope base of windowed layers, when it differs (Gemma 3)
    rotary_dim: int | None = None  # leading dims of each head that RoPE rotates (None: all)
    activation: Activation = Activation.SILU
    norm_offset: float = 0.0  # norm weights apply as (offset + w): Gemma stores w - 1
    qk_norm: bool = False  # RMSNorm over each q and k head before RoPE (Qwen3, Gemma 3)
    sandwich_norms: bool = False  # extra norms on the attention and MLP outputs (Gemma 2/3)
    embed_scale: float | None = None  # embeddings multiplied by this (Gemma: sqrt(hidden))
    query_pre_attn_scalar: float | None = None  # attention scale 1/sqrt(this) instead of 1/sqrt(D)
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap) (Gemma 2)
    final_softcap: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma 2)
    moe: MoESpec | None = None  # the experts of a mixture-of-experts model; None: every MLP is dense
    fp8: Fp8Config | None = None  # an FP8 checkpoint's quantization_config (its weights are FP8)

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_attention_heads ({self.num_heads}) is not a multiple of num_key_value_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise UnsupportedModelError(f"head_dim {self.head_dim} is odd; RoPE needs an even head_dim")
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise UnsupportedModelError(
                f"{len(self.layer_windows)} layer types given for {self.num_layers} layers (layer_types)"
            )
        if any(w < 0 for w in self.layer_windows):
            raise UnsupportedModelError("sliding_window must be positive")
        if self.long_context_from is not None and self.local_rope_theta is not None:
            raise UnsupportedModelError("longrope scaling with a separate local rope base is not supported")
        s = self.rope_scaling
        if s is not None and s.kind == "longrope":
            for name, factors in (("short_factor", s.short_factor), ("long_factor", s.long_factor)):
                if len(factors) != self.rotary_dims // 2:
                    raise UnsupportedModelError(
                        f"longrope {name} has {len(factors)} entries; the rotary dims need {self.rotary_dims // 2}"
                    )
        rot = self.rotary_dim
        if rot is not None and (rot % 2 or not 0 < rot <= self.head_dim):
            raise UnsupportedModelError(
                f"partial_rotary_factor gives {rot} rotary dims of a {self.head_dim}-dim head; need an even number "
                "in (0, head_dim]"
            )

    @property
    def kv_bytes_per_token(self) -> int:
        """Elements of K and V per token over all layers (multiply by the element size)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @property
    def attention_scale(self) -> float:
        base = self.query_pre_attn_scalar if self.query_pre_attn_scalar is not None else self.head_dim
        return float(base) ** -0.5

    @property
    def rotary_dims(self) -> int:
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    def window(self, layer: int) -> int:
        """Keys layer `layer` sees behind each query, itself included (0: all of them)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def sliding_window(self) -> int | None:
        """The window of the windowed layers (one size per model), or None without any."""
        sizes = {w for w in self.layer_windows if w}
        if len(sizes) > 1:
            raise UnsupportedModelError(f"layers with different sliding windows ({sorted(sizes)}) are not supported")
        return sizes.pop() if sizes else None

    @property
    def kv_groups(self) -> KVGroups:
        """Which layers share a block table (model/kv_groups.py): one group of every layer, or
        groups of local and of global layers, each local group freeing blocks behind its window."""
        return kv_groups(self.layer_windows, self.num_layers)

    def layer_rope(self, layer: int) -> LayerRope:
        if self.window(layer) and self.local_rope_theta is not None:
            return LayerRope(self.local_rope_theta, None)
        return LayerRope(self.rope_theta, self.rope_scaling)

    @property
    def long_context_from(self) -> int | None:
        """LongRoPE: prompts longer than this many tokens run on the long factors (see model/rope.py)."""
        s = self.rope_scaling
        return s.original_max_position_embeddings if s is not None and s.kind == "longrope" else None

    def sparse(self, layer: int) -> bool:
        """Whether layer `layer`'s feed-forward is the experts block (else the dense gated MLP)."""
        return self.moe is not None and self.moe.sparse(layer)
