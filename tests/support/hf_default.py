"""The default model as transformers reads its GGUF file (its own converter, an independent reading
of the file), saved once per test run for every worker: the conversion takes ~15 s, and more than
one test file compares against it."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path


def shared_dir(basetemp: Path) -> Path:
    """A directory every pytest-xdist worker of this run shares (the run's own without xdist)."""
    return basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp


def hf_default_model_dir(gguf_path: Path, shared: Path) -> Path:
    """transformers' float32 model and tokenizer from the GGUF file, saved under `shared` by the
    first worker that asks (the others wait for it, then read the saved copy)."""
    out = shared / "hf-default-model"
    with open(shared / "hf-default-model.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not out.exists():
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            where = {"pretrained_model_name_or_path": str(gguf_path.parent), "gguf_file": gguf_path.name}
            partial = shared / "hf-default-model.partial"
            shutil.rmtree(partial, ignore_errors=True)
            model = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
            # dequantized to float32 tensors when read: saved as a plain checkpoint (transformers
            # refuses to save a model it read from GGUF while it still names the file's quantization)
            model.hf_quantizer = None
            del model.config.quantization_config
            model.save_pretrained(partial)
            AutoTokenizer.from_pretrained(**where).save_pretrained(partial)
            partial.rename(out)  # whole or absent
    return out
