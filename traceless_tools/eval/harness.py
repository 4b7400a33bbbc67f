"""Run lm-evaluation-harness's `local-completions` model against a traceless server (plaintext
server, or the proxy in front of the private path).

    run_eval(EvalConfig) -> {task: {metric: value}}  (plus lm-eval's per-sample log when asked)

The harness tokenizes with the server's own tokenizer (`/tokenize`, `/detokenize`,
`/tokenizer_info`: lm-eval's "remote" tokenizer backend), sends token-id prompts, and scores
multiple-choice questions from `echo` + `logprobs` (prompt logprobs). Nothing is downloaded: the
tasks' data lives in traceless_tools/eval/tasks/ and the Hugging Face hub is switched to offline mode.
The task YAMLs name their data files relative to their own directory; they are rewritten with
absolute paths into a temporary directory that lm-eval reads (task configs only, no results).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

TASKS_DIR = Path(__file__).parent / "tasks"
TASKS = ("traceless_mc", "traceless_gen")


class EvalError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class EvalConfig:
    base_url: str  # the server's root, e.g. http://127.0.0.1:8000
    tasks: tuple[str, ...] = TASKS
    model: str | None = None  # None: the server's (first) model
    limit: int | None = None  # questions per task (None: all)
    concurrency: int = 1
    log_samples: bool = False  # keep lm-eval's per-question records (tests compare them)
    timeout_s: float = 300.0
    extra_model_args: dict = field(default_factory=dict)


def available_tasks() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in TASKS_DIR.glob("*.yaml")))


def _server_model(base_url: str, model: str | None, timeout: float) -> tuple[str, int]:
    import httpx

    try:
        entries = httpx.get(base_url + "/v1/models", timeout=timeout).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise EvalError(f"could not list the models of {base_url}") from exc
    for e in entries:
        if model is None or e["id"] == model:
            return e["id"], int(e.get("max_model_len") or 2048)
    raise EvalError("the server does not serve that model")


def _resolved_tasks(into: Path) -> None:
    """Copy the task YAMLs with their data_files made absolute."""
    import yaml

    for src in TASKS_DIR.glob("*.yaml"):
        config = yaml.safe_load(src.read_text())
        files = config.get("dataset_kwargs", {}).get("data_files", {})
        for split, name in files.items():
            files[split] = str((TASKS_DIR / name).resolve())
        (into / src.name).write_text(yaml.safe_dump(config, sort_keys=False))


def run_eval(cfg: EvalConfig) -> dict:
    """lm-eval's results dict for cfg.tasks ("results": {task: {metric,filter: value}}, and
    "samples" when cfg.log_samples)."""
    unknown = set(cfg.tasks) - set(available_tasks())
    if unknown:
        raise EvalError(f"unknown task(s); the project ships: {', '.join(available_tasks())}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError as exc:
        raise EvalError("lm-evaluation-harness is not installed: pip install 'traceless[eval]'") from exc
    base = cfg.base_url.rstrip("/")
    model, max_len = _server_model(base, cfg.model, cfg.timeout_s)
    model_args = {
        "base_url": base + "/v1/completions",
        "model": model,
        "tokenizer_backend": "remote",
        "tokenized_requests": True,
        "num_concurrent": cfg.concurrency,
        "max_length": max_len,
        "max_retries": 1,
        "timeout": int(cfg.timeout_s),
        **cfg.extra_model_args,
    }
    tmp = Path(tempfile.mkdtemp(prefix="traceless-eval-tasks-"))
    try:
        _resolved_tasks(tmp)
        results = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=model_args,
            tasks=list(cfg.tasks),
            task_manager=TaskManager(include_path=str(tmp), include_defaults=False),
            limit=cfg.limit,
            log_samples=cfg.log_samples,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if results is None:
        raise EvalError("lm-eval returned no results")
    return results


def summary(results: dict) -> dict[str, dict[str, float]]:
    """{task: {metric: value}}: the aggregate figures only (no question, answer or output)."""
    out: dict[str, dict[str, float]] = {}
    for task, metrics in results.get("results", {}).items():
        out[task] = {
            k.split(",")[0]: float(v)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and "_stderr" not in k
        }
    return out
