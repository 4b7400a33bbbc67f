"""`traceless eval` (lm-evaluation-harness's local-completions against a traceless server) gives
the same answers, question by question, as lm-eval's own `hf` backend on the same float32 weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

from tests.conftest import TINY_VOCAB, make_tiny_model  # noqa: E402
from tests.support.serving import make_served_app, serve  # noqa: E402
from traceless.config import EngineConfig  # noqa: E402
from traceless_tools.eval.harness import TASKS_DIR, EvalConfig, EvalError, _resolved_tasks, run_eval, summary  # noqa: E402


def _task_words() -> list[str]:
    words: dict[str, None] = {}
    for name in ("traceless_mc.jsonl", "traceless_gen.jsonl"):
        for line in (TASKS_DIR / name).read_text().splitlines():
            doc = json.loads(line)
            texts = [f"Question: {doc['question']}\nAnswer:", *doc.get("choices", []), str(doc["answer"])]
            for t in texts:
                words.update(dict.fromkeys(t.split()))
    return list(words)


@pytest.fixture(scope="module")
def task_model(tmp_path_factory) -> Path:
    """A tiny random Llama whose word-level tokenizer knows the tasks' words (so every question is
    real tokens, not <unk>)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    path = make_tiny_model(tmp_path_factory.mktemp("tiny-eval"), "llama", seed=7)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for w in _task_words()[: TINY_VOCAB - 3]:
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(path / "tokenizer.json"))
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.update(bos_token="<s>", eos_token="</s>", unk_token="<unk>")  # transformers' tokenizer needs them named
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def server(task_model):
    app, engine = make_served_app(
        EngineConfig(model=str(task_model), dtype="float32", kv_cache_memory=4 * 2**20, max_model_len=256)
    )
    with serve(app, engine) as s:
        yield s


def hf_results(model_dir: Path, tasks: list[str], tmp_path: Path) -> dict:
    from lm_eval.tasks import TaskManager

    _resolved_tasks(tmp_path)
    return lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": str(model_dir), "dtype": "float32", "device": "cpu"},
        tasks=tasks,
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        batch_size=1,
        log_samples=True,
    )


def by_doc(results: dict, task: str) -> dict[int, dict]:
    return {s["doc_id"]: s for s in results["samples"][task]}


def test_multiple_choice_matches_the_hf_backend_question_by_question(server, task_model, tmp_path):
    ours = run_eval(EvalConfig(server.url, ("traceless_mc",), log_samples=True))
    ref = hf_results(task_model, ["traceless_mc"], tmp_path)
    got, want = by_doc(ours, "traceless_mc"), by_doc(ref, "traceless_mc")
    assert sorted(got) == sorted(want) == list(range(30))
    for doc_id, w in want.items():
        g = got[doc_id]
        ll_g = [r[0] for r in g["filtered_resps"]]
        ll_w = [r[0] for r in w["filtered_resps"]]
        assert max(abs(a - b) for a, b in zip(ll_g, ll_w)) < 1e-3  # summed over the choice's tokens
        assert g["acc"] == w["acc"] and g["acc_norm"] == w["acc_norm"]
    assert summary(ours)["traceless_mc"]["acc"] == summary(ref)["traceless_mc"]["acc"]
    server.check_integrity()


def test_generation_matches_the_hf_backend(server, task_model, tmp_path):
    ours = run_eval(EvalConfig(server.url, ("traceless_gen",), log_samples=True, limit=8))
    ref = hf_results(task_model, ["traceless_gen"], tmp_path)
    got, want = by_doc(ours, "traceless_gen"), by_doc(ref, "traceless_gen")
    assert sorted(got) == list(range(8))
    for doc_id in got:
        assert got[doc_id]["filtered_resps"][0].strip() == want[doc_id]["filtered_resps"][0].strip()
    assert sum(len(g["filtered_resps"][0].split()) for g in got.values()) > 8  # real outputs, not empty ones
    server.check_integrity()


def test_unknown_task_and_unreachable_server_are_clear_errors():
    with pytest.raises(EvalError, match="unknown task"):
        run_eval(EvalConfig("http://127.0.0.1:9", ("mmlu",)))
    with pytest.raises(EvalError, match="could not list"):
        run_eval(EvalConfig("http://127.0.0.1:9", ("traceless_mc",), timeout_s=2))


def test_the_eval_command_prints_figures_only(server, tmp_path, capsys):
    from traceless_tools.cli import main

    out = tmp_path / "figures.json"
    assert (
        main(["eval", "--base-url", server.url, "--tasks", "traceless_mc", "--limit", "4", "--output-json", str(out)])
        == 0
    )
    figures = json.loads(out.read_text())
    assert set(figures) == {"traceless_mc"} and 0.0 <= figures["traceless_mc"]["acc"] <= 1.0
    printed = capsys.readouterr().out
    assert "traceless_mc: acc=" in printed and "Question" not in printed and "Paris" not in printed
    assert main(["eval", "--base-url", server.url, "--tasks", "nope"]) == 2


@pytest.mark.slow
def test_default_model_multiple_choice_matches_the_hf_backend(hf_default_model_dir, tmp_path):
    """The real default model (its GGUF, dequantized to float32 by both sides): same answer on every
    question of the bundled multiple-choice set."""
    app, engine = make_served_app(EngineConfig(dtype="float32", kv_cache_memory=256 * 2**20, max_model_len=2048))
    with serve(app, engine) as s:
        ours = run_eval(EvalConfig(s.url, ("traceless_mc",), log_samples=True))
        s.check_integrity()
    from lm_eval.tasks import TaskManager

    _resolved_tasks(tmp_path)
    ref = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": str(hf_default_model_dir), "dtype": "float32", "device": "cpu"},
        tasks=["traceless_mc"],
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        batch_size=1,
        log_samples=True,
    )
    got, want = by_doc(ours, "traceless_mc"), by_doc(ref, "traceless_mc")
    assert sorted(got) == sorted(want) == list(range(30))
    for doc_id, w in want.items():
        g = got[doc_id]
        assert max(abs(a[0] - b[0]) for a, b in zip(g["filtered_resps"], w["filtered_resps"])) < 1e-2
        assert g["acc"] == w["acc"] and g["acc_norm"] == w["acc_norm"]
    assert summary(ours)["traceless_mc"]["acc"] == summary(ref)["traceless_mc"]["acc"]
    print("default model traceless_mc:", summary(ours)["traceless_mc"])
