"""`traceless attack stream-shape`: the published attack on encrypted LLM streams (Whisper Leak,
McDonald et al. 2025; "remote keylogging", Weiss et al. 2024), run against a node with shape
hiding off and with its defaults (docs/shape-hiding.md).

The attacker is the relay (or anyone on the wire): it sees each request's encrypted length and, for
the response, the length and arrival time of every encrypted chunk (the OHTTP chunk framing is in
the clear). The victim sends one of N prompts ("topics"); the attacker, who can send the same
prompts itself to learn what each looks like, tries to tell which one from the trace alone:

  features    the request's length, when the response head came, the number of chunks, the
              stream's duration, mean and spread of chunk sizes and of gaps, and the first 32
              chunk sizes and gaps; each part (sizes, start and length, gaps) also read alone
  classifier  multinomial logistic regression (numpy; standardized features, L2), scored by
              stratified k-fold cross-validation: every trace is classified by a model that never
              saw it
  verdict     accuracy with its 95% (Wilson) interval, against chance (1/N) and the range a
              classifier without information lands in 95% of the time (binomial quantiles)
  timing      on the node with the defaults, two more readings (audit/stream_timing.py): whether
              a tick that carries tokens can be told from a padding tick by its timing (gap
              jitter: must be at chance), and the share of streams whose first chunk came after
              the prefill budget (must be zero)

Off: the client does not pad requests and the node runs `--shape off` (one chunk per SSE event).
On: the defaults (requests and responses padded to size buckets, the head and a chunk per tick
from the prefill budget on, stream lengths padded to powers of two). Two readings of each node:
answers of a fixed length (max_tokens, EOS ignored), and answers of their natural length (EOS ends
them): how long an answer runs is what a stream's duration would show. `load` CPU-bound processes
run beside the node for the whole run (a loaded machine shows prefill and decode times more). The
victim's own view (time to first token, tokens per second) gives the defense's cost.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

import httpx
import numpy as np

from traceless.privacy.shape import DEFAULT_TICK_MS, ShapePolicy
from traceless_tools.audit.stats import wilson_interval
from traceless_tools.audit.stream_observe import Trace, key_config, observe
from traceless_tools.audit.stream_timing import gap_jitter, late_first_ticks
from traceless_tools.local.load import cpu_load
from traceless_tools.report.output import figure, finish

MODES = ("off", "defaults")
SERVED_NAME = "stream-shape-target"
MAX_MODEL_LEN = 2048  # the nodes' context: it caps the prefill budget
FIRST_K = 32  # chunks whose size and gap are features of their own
TOPICS = (
    "Explain how vaccines train the immune system.",
    "Write a short poem about the sea at night.",
    "What should I do if I think my partner is cheating on me?",
    "How do I file my taxes as a freelancer?",
    "Summarize the causes of the First World War.",
    "Give me a recipe for a vegan chocolate cake.",
)


@dataclass(frozen=True, slots=True)
class StreamAttackConfig:
    topics: tuple[str, ...] = TOPICS[:4]
    trials: int = 12  # traces per topic and mode
    max_tokens: int = 32
    temperature: float = 0.7
    natural_length: bool = False  # collect(): let EOS end answers (their length shows as the stream's duration)
    folds: int = 4
    model: str | None = None  # None = the built-in model
    seed: int = 0
    lengths: tuple[str, ...] = ("fixed", "natural")  # run(): the readings taken of each node
    load: int = 0  # run(): CPU-bound processes beside the node

    def __post_init__(self) -> None:
        if len(self.topics) < 2 or self.trials < self.folds or self.folds < 2 or self.max_tokens < 1:
            raise ValueError("use at least 2 topics, 2 folds, as many trials per topic as folds and 1 token")
        if not self.lengths or set(self.lengths) - {"fixed", "natural"} or not 0 <= self.load <= 16:
            raise ValueError("lengths must be fixed and/or natural, and load 0 to 16 processes")


@dataclass
class ModeResult:
    mode: str
    labels: list[int] = field(default_factory=list)
    traces: list[Trace] = field(default_factory=list)
    length: str = "fixed"

    def summary(self, n_topics: int, folds: int, seed: int) -> dict:
        x = np.array([features(t) for t in self.traces])
        y = np.array(self.labels)
        predicted = cross_validate(x, y, n_topics, folds, seed)
        correct, n = int((predicted == y).sum()), len(y)
        lo, hi = chance_interval(n, 1 / n_topics)
        sizes = sorted({s for t in self.traces for s in t.sizes})
        return {
            "mode": self.mode,
            "length": self.length,
            "traces": n,
            "accuracy": correct / n,
            "accuracy_95ci": wilson_interval(correct, n),
            "chance": 1 / n_topics,
            "chance_95_range": [lo, hi],
            "p_value_at_chance": binomial_tail(correct, n, 1 / n_topics),
            "above_chance": correct / n > hi,
            "distinct_chunk_sizes": len(sizes),
            "chunk_sizes": sizes[:20],
            "request_sizes": sorted({t.request_bytes for t in self.traces}),
            "chunks_per_response": [min(len(t.sizes) for t in self.traces), max(len(t.sizes) for t in self.traces)],
            "by_features": by_feature_group(x, y, n_topics, folds, seed),
            **timing_readings(self.traces, self.mode, folds, seed),
            "confusion": confusion(y, predicted, n_topics),
            "cost": cost(self.traces),
        }


def timing_readings(traces: list[Trace], mode: str, folds: int, seed: int) -> dict:
    """The gap-jitter and late-first-tick readings (audit/stream_timing.py) of a node with the
    defaults, whose tick and prefill budget it publishes; None for a node with shape off."""
    if mode == "off":
        return {"gap_jitter": None, "late_first_tick": None}
    policy, tick = ShapePolicy(), DEFAULT_TICK_MS / 1000
    # the request's plaintext bucket from its encrypted length (56-58 bytes of OHTTP above it)
    budget = lambda t: policy.prefill_budget_s(t.request_bytes - 64, 8 * MAX_MODEL_LEN)  # noqa: E731
    return {
        "gap_jitter": gap_jitter(traces, tick, folds, seed),
        "late_first_tick": late_first_ticks(traces, tick, budget),
    }


def cost(traces: list[Trace]) -> dict:
    """The victim's view, medians over the traces: time to the first token, decode tokens per second
    (tokens after the first over the time they took), when the response head and the stream's end came."""
    rates = [
        (t.tokens - 1) / (t.content_end - t.first_token)
        for t in traces
        if t.tokens > 1 and t.content_end > t.first_token
    ]
    return {
        "ttft_s": float(np.median([t.first_token for t in traces])),
        "tokens_per_s": float(np.median(rates)) if rates else 0.0,
        "head_s": float(np.median([t.head for t in traces])),
        "stream_s": float(np.median([t.times[-1] if t.times else 0.0 for t in traces])),
    }


def collect(url: str, model: str, mode: str, cfg: StreamAttackConfig, rng: random.Random, progress=None) -> ModeResult:
    """cfg.trials traces per topic from the node at `url`, topics in a shuffled order."""
    config, result = key_config(url), ModeResult(mode, length="natural" if cfg.natural_length else "fixed")
    order = [i for i in range(len(cfg.topics)) for _ in range(cfg.trials)]
    rng.shuffle(order)
    with httpx.Client(timeout=300) as client:
        observe(client, url, config, b"/v1/completions", _body(cfg, model, "warm-up", rng), mode != "off")
        for i in order:
            result.traces.append(
                observe(client, url, config, b"/v1/completions", _body(cfg, model, cfg.topics[i], rng), mode != "off")
            )
            result.labels.append(i)
            if progress is not None:
                progress.update(1)
    return result


def _body(cfg: StreamAttackConfig, model: str, prompt: str, rng: random.Random) -> dict:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        "seed": rng.randrange(2**31),
        "ignore_eos": not cfg.natural_length,
        "stream": True,
    }


# ---- the classifier -----------------------------------------------------------------------------------


# Which features belong to each part of the relay's view (indices into features()): what a message's
# length shows, what a stream's start and length show, and what its timing within shows (the
# timer's jitter: a node's timer runs late by more while its engine works, so the gaps can tell when
# the content ended even where the chunk count cannot)
FEATURE_GROUPS = {
    "sizes": (0, 4, 5, *range(8, 8 + FIRST_K)),
    "length": (1, 2, 3),
    "gaps": (6, 7, *range(8 + FIRST_K, 8 + 2 * FIRST_K)),
}


def features(t: Trace) -> list[float]:
    sizes, gaps = list(t.sizes), t.gaps
    head_sizes = (sizes + [0] * FIRST_K)[:FIRST_K]
    head_gaps = (gaps + [0.0] * FIRST_K)[:FIRST_K]
    return [
        float(t.request_bytes),
        t.head,
        float(len(sizes)),
        t.times[-1] if t.times else 0.0,
        float(np.mean(sizes)),
        float(np.std(sizes)),
        float(np.mean(gaps)),
        float(np.std(gaps)),
        *map(float, head_sizes),
        *head_gaps,
    ]


def fit_softmax(x: np.ndarray, y: np.ndarray, classes: int, l2: float = 1e-2, steps: int = 400) -> tuple:
    """Multinomial logistic regression by full-batch gradient descent on standardized features."""
    mean, std = x.mean(axis=0), x.std(axis=0)
    std[std == 0] = 1.0
    z = (x - mean) / std
    w, b = np.zeros((z.shape[1], classes)), np.zeros(classes)
    onehot = np.eye(classes)[y]
    for _ in range(steps):
        logits = z @ w + b
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        grad = (p - onehot) / len(y)
        w -= 0.5 * (z.T @ grad + l2 * w)
        b -= 0.5 * grad.sum(axis=0)
    return mean, std, w, b


def predict(model: tuple, x: np.ndarray) -> np.ndarray:
    mean, std, w, b = model
    return np.argmax(((x - mean) / std) @ w + b, axis=1)


def cross_validate(x: np.ndarray, y: np.ndarray, classes: int, folds: int, seed: int) -> np.ndarray:
    """Each trace's class as predicted by a model trained on the other folds (stratified)."""
    rng = np.random.default_rng(seed)
    fold = np.empty(len(y), dtype=int)
    for c in range(classes):
        idx = np.flatnonzero(y == c)
        fold[rng.permutation(idx)] = np.arange(len(idx)) % folds
    predicted = np.empty(len(y), dtype=int)
    for f in range(folds):
        test = fold == f
        predicted[test] = predict(fit_softmax(x[~test], y[~test], classes), x[test])
    return predicted


def by_feature_group(x: np.ndarray, y: np.ndarray, classes: int, folds: int, seed: int) -> dict[str, float]:
    """The cross-validated accuracy of the classifier given one part of the view alone."""
    return {
        name: float((cross_validate(x[:, list(cols)], y, classes, folds, seed) == y).mean())
        for name, cols in FEATURE_GROUPS.items()
    }


def confusion(y: np.ndarray, predicted: np.ndarray, classes: int) -> list[list[int]]:
    m = np.zeros((classes, classes), dtype=int)
    np.add.at(m, (y, predicted), 1)
    return m.tolist()


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return min(1.0, sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1)))


def chance_interval(n: int, p: float) -> tuple[float, float]:
    """The central 95% range of the accuracy of a classifier that guesses (Binomial(n, p) / n)."""
    cdf, lo, hi = 0.0, None, n
    for i in range(n + 1):
        cdf += math.comb(n, i) * p**i * (1 - p) ** (n - i)
        if lo is None and cdf >= 0.025:
            lo = i
        if cdf >= 0.975:
            hi = i
            break
    return (lo or 0) / n, hi / n


# ---- the command --------------------------------------------------------------------------------------


def report_for(results: list[ModeResult], cfg: StreamAttackConfig) -> dict:
    return {
        "attack": "stream-shape",
        "topics": len(cfg.topics),
        "trials_per_topic": cfg.trials,
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        "lengths": list(cfg.lengths),
        "load_processes": cfg.load,
        "folds": cfg.folds,
        "classifier": "multinomial logistic regression, stratified k-fold",
        "results": [r.summary(len(cfg.topics), cfg.folds, cfg.seed) for r in results],
        "examples": {
            r.mode: [
                {"topic": r.labels[i], "sizes": list(r.traces[i].sizes), "times": list(r.traces[i].times)}
                for i in _first_per_topic(r.labels)
            ]
            for r in results
            if r.length == results[0].length
        },
    }


def _first_per_topic(labels: list[int]) -> list[int]:
    seen: dict[int, int] = {}
    for i, label in enumerate(labels):
        seen.setdefault(label, i)
    return [seen[k] for k in sorted(seen)]


def run(cfg: StreamAttackConfig, json_path: str | None, plot_path: str | None) -> dict:
    from tqdm.auto import tqdm

    from traceless_tools.local.services import spawn_node

    rng = random.Random(cfg.seed)
    model_args = ["--model", cfg.model] if cfg.model else []
    results = []
    with (
        cpu_load(cfg.load),
        tqdm(total=len(MODES) * len(cfg.lengths) * len(cfg.topics) * cfg.trials, desc="requests", unit="req") as bar,
    ):
        for mode in MODES:
            shape = ["--shape", "off"] if mode == "off" else []
            with spawn_node(
                *model_args,
                *shape,
                "--served-model-name",
                SERVED_NAME,
                "--kv-cache-memory",
                "256MiB",
                "--max-model-len",
                str(MAX_MODEL_LEN),
                "--dtype",
                "float32",
                name=f"node-{mode}",
            ) as svc:
                for length in cfg.lengths:
                    reading = replace(cfg, natural_length=length == "natural")
                    results.append(collect(svc.url, SERVED_NAME, mode, reading, rng, bar))
    return finish(report_for(results, cfg), print_report, json_path, plot, plot_path)


def print_report(report: dict) -> None:
    print(
        f"\ntraceless attack stream-shape  ({report['topics']} topics x {report['trials_per_topic']} traces per "
        f"reading, {report['max_tokens']} output tokens, {report['classifier']}; "
        f"{report['load_processes']} CPU-bound processes beside the node)"
    )
    print(
        f"{'node':<10}{'length':<9}{'accuracy':>9}{'95% CI':>15}{'chance range':>15}{'p(chance)':>10}"
        f"{'chunks':>8}{'req sizes':>10}{'TTFT s':>8}{'tok/s':>7}  verdict"
    )
    for r in report["results"]:
        lo, hi = r["accuracy_95ci"]
        clo, chi = r["chance_95_range"]
        verdict = "LEAKS: the topic shows through" if r["above_chance"] else "at chance"
        print(
            f"{r['mode']:<10}{r['length']:<9}{r['accuracy']:>9.3f}{f'[{lo:.2f}, {hi:.2f}]':>15}"
            f"{f'[{clo:.2f}, {chi:.2f}]':>15}{r['p_value_at_chance']:>10.3g}{r['distinct_chunk_sizes']:>8}"
            f"{len(r['request_sizes']):>10}{r['cost']['ttft_s']:>8.2f}{r['cost']['tokens_per_s']:>7.1f}  {verdict}"
        )
    print(
        "read alone: "
        + "; ".join(
            f"{r['mode']} {r['length']}: " + ", ".join(f"{k} {v:.2f}" for k, v in r["by_features"].items())
            for r in report["results"]
        )
    )
    for r in report["results"]:
        if r.get("late_first_tick") is not None:
            print(f"timing, {r['mode']} {r['length']}: " + _timing_line(r["gap_jitter"], r["late_first_tick"]))
    print(
        "(accuracy: each trace classified by a model trained on the other folds; chance range: where a "
        "classifier\n without information lands 95% of the time; sizes: distinct values the relay saw)"
    )


def _timing_line(jitter: dict | None, late: dict) -> str:
    text = (
        f"first tick late in {late['first_tick_late']:.0%} of streams (first token past the budget in "
        f"{late['first_token_past_budget']:.0%}), {late['ticks_behind_grid']:.1%} of ticks behind the grid"
    )
    if jitter is None:
        return text
    sd = jitter["gap_sd_ms"]
    text += "; gap sd " + ", ".join(f"{k} {v['median']:.1f} ms" for k, v in sd.items() if v["streams"])
    if jitter["accuracy"] is None:
        return text + f"; too few windows of each kind ({jitter['windows']}) for the real-vs-padding classifier"
    lo, hi = jitter["chance_95_range"]
    verdict = "LEAKS" if jitter["above_chance"] else "at chance"
    return text + (
        f"; real vs padding ticks told apart {jitter['accuracy']:.2f} (chance [{lo:.2f}, {hi:.2f}]: {verdict})"
    )


def plot(report: dict, path: str) -> None:
    with figure(path, (11, 4), ncols=3) as (fig, axes):
        ax = axes[0]
        res = report["results"]
        for i, r in enumerate(res):
            lo, hi = r["accuracy_95ci"]
            ax.bar(
                i,
                r["accuracy"],
                yerr=[[r["accuracy"] - lo], [hi - r["accuracy"]]],
                capsize=6,
                zorder=2,
                color="tab:red" if r["above_chance"] else "tab:green",
            )
        clo, chi = res[0]["chance_95_range"]
        ax.axhspan(clo, chi, color="0.85", label="chance (95% range)", zorder=0)
        ax.axhline(res[0]["chance"], color="k", ls=":")
        ax.set_xticks(range(len(res)), [f"{r['mode']}\n{r['length']}" for r in res])
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("topic accuracy (cross-validated)")
        ax.set_title("Stream-shape attack")
        ax.legend(loc="upper right")
        for ax, mode in zip(axes[1:], MODES):
            for ex in report["examples"].get(mode, []):
                ax.plot(ex["times"], ex["sizes"], "o-", ms=3, alpha=0.7, label=f"topic {ex['topic']}")
            ax.set_xlabel("arrival (s since the request)")
            ax.set_ylabel("encrypted chunk (bytes)")
            ax.set_title(f"the relay's view, shape {mode}")
            ax.legend(loc="upper right", fontsize=7)
