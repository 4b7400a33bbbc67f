"""Shared fixtures: tiny random models written as real Hugging Face directories, and the real
default model (loaded once per session)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

# Triton's kernels run under its interpreter where no GPU is: set before any test module imports
# triton (a module imported first in compiled mode would leave every later one without a driver)
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two pytest-xdist workers on this 2-core machine: each worker, and every service
    # it starts (they inherit the variable), computes on one thread. Two OpenMP pools of two threads
    # each, spinning on two cores, would slow both workers down more than the second worker gains.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_addoption(parser):
    parser.addoption("--soak", action="store_true", help="also run the tests marked soak (minutes each)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="a soak test: run with --soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


TINY_VOCAB = 384


def _write_tokenizer(path: Path, vocab_size: int) -> None:
    """A word-level tokenizer over 'w0'..'wN' plus <s>/</s>, enough to drive a random model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, vocab_size):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(path / "tokenizer.json"))
    template = (
        "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
        "{% if add_generation_prompt %}<s> assistant {% endif %}"
    )
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))


def make_tiny_model(path: Path, kind: str = "llama", seed: int = 0, **overrides) -> Path:
    import torch
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    torch.manual_seed(seed)
    common = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    common.update(overrides)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif kind == "mistral":
        model = MistralForCausalLM(MistralConfig(**common))
    else:
        raise ValueError(kind)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.mul_(4.0)  # random init is small; scale up so greedy paths are not all ties
            elif name.endswith("bias"):
                p.normal_(0.0, 0.5)  # HF initializes biases to zero, which would hide a missing bias
            else:
                p.uniform_(0.5, 1.5)  # norm weights (init to one)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    _write_tokenizer(path, TINY_VOCAB)
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", seed=1)


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    from traceless.model.loader import default_model_path as find

    return find()


@pytest.fixture(scope="session")
def hf_default_model_dir(tmp_path_factory, default_model_path) -> Path:
    """transformers' reading of the default model's GGUF file (float32), saved once per run."""
    from tests.support.hf_default import hf_default_model_dir, shared_dir

    return hf_default_model_dir(default_model_path, shared_dir(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="session")
def real_llm():
    """The default model in float32 (parity tests), shared by the session's end-to-end tests."""
    from traceless import LLM

    return LLM(dtype="float32", kv_cache_memory=512 * 2**20)


def llm_with_executor(config, wrap):
    """An LLM whose model executor is wrap(the real one): for tests that watch or break steps."""
    import dataclasses

    from traceless.engine.llm_engine import LLMEngine
    from traceless.entrypoints.llm import LLM
    from traceless.runner.build import build_engine_parts

    parts = build_engine_parts(config)
    return LLM.from_engine(LLMEngine(config, dataclasses.replace(parts, executor=wrap(parts.executor))))


class ExecutorSpy:
    """Passes every step to the real executor; `on_output(plan, output)` sees each step's result."""

    def __init__(self, real, on_output=None):
        self.real = real
        self.on_output = on_output
        self.broken = False
        self.delay_s = 0.0  # make every step take at least this long (timing-sensitive tests)

    def execute(self, plan):
        if self.broken:
            raise RuntimeError("simulated kernel failure")
        if self.delay_s:
            time.sleep(self.delay_s)
        out = self.real.execute(plan)
        if self.on_output is not None:
            self.on_output(plan, out)
        return out

    def launch(self, plan):
        if self.broken:
            raise RuntimeError("simulated kernel failure")
        pending = self.real.launch(plan)
        if self.on_output is None:
            return pending
        spy = self

        class Watched:
            def result(self):
                out = pending.result()
                spy.on_output(plan, out)
                return out

        return Watched()

    def release(self, request_id):
        self.real.release(request_id)

    def sweep(self):
        self.real.sweep()

    def num_held(self):
        return self.real.num_held()

    def scrub_workers(self):
        self.scrubs = getattr(self, "scrubs", 0) + 1
        self.real.scrub_workers()


@pytest.fixture
def captured_events():
    """The events emitted during the test: `captured_events()` as dicts, `.text()` the lines."""
    from tests.support.events import capture_events

    with capture_events() as log:
        yield log


@pytest.fixture
def record_mkdtemp(tmp_path, monkeypatch):
    """record_mkdtemp(module): the module's tempfile.mkdtemp makes its directories under tmp_path
    and lists them, so a test can check that they were removed."""

    def patch(module) -> list[Path]:
        made: list[Path] = []
        real = module.tempfile.mkdtemp

        def mkdtemp(**kw):
            made.append(Path(real(dir=tmp_path, **kw)))
            return str(made[-1])

        monkeypatch.setattr(module.tempfile, "mkdtemp", mkdtemp)
        return made

    return patch


@pytest.fixture(autouse=True)
def _logging_restored():
    """A test that runs a command in-process (`cli.main`) runs its `configure_logging()`, which puts a
    handler on the event logger writing to the sys.stderr of that moment (pytest's capture file,
    closed after the test), turns the logger's propagation off and silences third-party loggers. Put
    all of it back after every test: a later event must not be written into a closed stream, and a
    later test that reads records must still see them."""
    import logging

    from traceless.events import LOGGER_NAME

    names = (LOGGER_NAME, "uvicorn", "uvicorn.error", "uvicorn.access", "httpx", "httpcore", "asyncio")
    root = logging.getLogger()
    saved_level = root.level
    saved = {
        name: (list(lg.handlers), lg.propagate, lg.disabled, lg.level)
        for name in names
        for lg in (logging.getLogger(name),)
    }
    yield
    root.setLevel(saved_level)
    for name, (handlers, propagate, disabled, level) in saved.items():
        lg = logging.getLogger(name)
        lg.handlers[:] = handlers
        lg.propagate, lg.disabled = propagate, disabled
        lg.setLevel(level)
