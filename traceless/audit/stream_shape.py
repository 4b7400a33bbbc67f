"""`traceless attack stream-shape`: the published attack on encrypted LLM streams (Whisper Leak,
McDonald et al. 2025; "remote keylogging", Weiss et al. 2024), run against a node with shape
hiding off and with its defaults (docs/shape-hiding.md).

The attacker is the relay (or anyone on the wire): it sees each request's encrypted length and, for
the response, the length and arrival time of every encrypted chunk (the OHTTP chunk framing is in
the clear). The victim sends one of N prompts ("topics"); the attacker, who can send the same
prompts itself to learn what each looks like, tries to tell which one from the trace alone:

  features    the request's length, the number of chunks, the stream's duration, mean and spread
              of chunk sizes and of gaps, and the first 32 chunk sizes and gaps
  classifier  multinomial logistic regression (numpy; standardized features, L2), scored by
              stratified k-fold cross-validation: every trace is classified by a model that never
              saw it
  verdict     accuracy with its 95% (Wilson) interval, against chance (1/N) and the range a
              classifier without information lands in 95% of the time (binomial quantiles)

Off: the client does not pad requests and the node runs `--shape off` (one chunk per SSE event).
On: the defaults (requests and responses padded to size buckets, a chunk per tick). Answers have
a fixed length (max_tokens, EOS ignored) unless `natural_length`: how long an answer runs is what
the defaults leave visible (the stream's duration), and that run measures it.
"""
from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field

import httpx
import numpy as np

from traceless.audit.stats import wilson_interval
from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.bhttp.stream import ResponseStreamDecoder
from traceless.privacy.ohttp.chunked import split_chunks
from traceless.privacy.ohttp.gateway import encapsulate_chunked_request
from traceless.privacy.ohttp.keys import KeyConfig, decode_ohttp_keys
from traceless.privacy.shape import bucket_padding
from traceless.privacy.wire import peek_varint
from traceless.report.output import figure, finish

MODES = ("off", "defaults")
SERVED_NAME = "stream-shape-target"
FIRST_K = 32  # chunks whose size and gap are features of their own
RESPONSE_NONCE = 16  # AES-128-GCM's max(Nn, Nk): the key config's first choice
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
    natural_length: bool = False  # let EOS end answers (their length then shows as the stream's duration)
    folds: int = 4
    model: str | None = None  # None = the built-in model
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.topics) < 2 or self.trials < self.folds or self.folds < 2 or self.max_tokens < 1:
            raise ValueError("use at least 2 topics, 2 folds, as many trials per topic as folds and 1 token")


@dataclass(frozen=True, slots=True)
class Trace:
    """What the relay sees of one request: its length, and each response chunk's length and arrival."""

    request_bytes: int
    sizes: tuple[int, ...]
    times: tuple[float, ...]  # seconds since the request was sent

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip((0.0, *self.times), self.times)]


@dataclass
class ModeResult:
    mode: str
    labels: list[int] = field(default_factory=list)
    traces: list[Trace] = field(default_factory=list)

    def summary(self, n_topics: int, folds: int, seed: int) -> dict:
        x = np.array([features(t) for t in self.traces])
        y = np.array(self.labels)
        predicted = cross_validate(x, y, n_topics, folds, seed)
        correct, n = int((predicted == y).sum()), len(y)
        lo, hi = chance_interval(n, 1 / n_topics)
        sizes = sorted({s for t in self.traces for s in t.sizes})
        return {"mode": self.mode, "traces": n, "accuracy": correct / n, "accuracy_95ci": wilson_interval(correct, n),
                "chance": 1 / n_topics, "chance_95_range": [lo, hi],
                "p_value_at_chance": binomial_tail(correct, n, 1 / n_topics), "above_chance": correct / n > hi,
                "distinct_chunk_sizes": len(sizes), "chunk_sizes": sizes[:20],
                "request_sizes": sorted({t.request_bytes for t in self.traces}),
                "chunks_per_response": [min(len(t.sizes) for t in self.traces),
                                        max(len(t.sizes) for t in self.traces)],
                "confusion": confusion(y, predicted, n_topics)}


# ---- the relay's view ---------------------------------------------------------------------------------


def key_config(url: str) -> KeyConfig:
    r = httpx.get(url.rstrip("/") + "/pcc/v1/ohttp-keys", timeout=30)
    r.raise_for_status()
    return decode_ohttp_keys(r.content)[0]


def observe(client: httpx.Client, url: str, config: KeyConfig, path: bytes, body: dict, pad: bool) -> Trace:
    """Send one streamed request to a node and record what a relay would see of it."""
    inner = bhttp.encode_request(bhttp.Request(b"POST", b"https", b"traceless", path,
                                               ((b"content-type", b"application/json"),), json.dumps(body).encode()))
    if pad:
        inner += bytes(bucket_padding(len(inner)))
    enc, ctx = encapsulate_chunked_request(config, split_chunks(inner))
    sizes: list[int] = []
    body_bytes = bytearray()  # the victim's copy, to check it got an answer (the attacker never reads it)
    times: list[float] = []
    buf = bytearray()
    t0 = time.perf_counter()
    with client.stream("POST", url.rstrip("/") + "/pcc/v1/ohttp", content=enc,
                       headers={"content-type": "message/ohttp-chunked-req"}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"the node answered HTTP {r.status_code}")
        final, nonce_read = False, False
        for piece in r.iter_raw():
            now = time.perf_counter() - t0
            buf += piece
            body_bytes += piece
            if not nonce_read:
                if len(buf) < RESPONSE_NONCE:
                    continue
                del buf[:RESPONSE_NONCE]
                nonce_read = True
            while not final and (head := peek_varint(buf)) is not None:
                length, n = head
                if length == 0:  # the final chunk runs to the end of the body
                    final = True
                    del buf[:n]
                elif len(buf) >= n + length:
                    del buf[: n + length]
                    sizes.append(length)
                    times.append(now)
                else:
                    break
        if final:
            sizes.append(len(buf))
            times.append(time.perf_counter() - t0)
    dec, parser = ctx.decryptor(), ResponseStreamDecoder()
    items = [i for plain in [*dec.feed(bytes(body_bytes)), dec.finish()] for i in parser.feed(plain)]
    parser.wipe()
    body_bytes[:] = bytes(len(body_bytes))
    if not items or items[0].status != 200:
        raise RuntimeError("the node refused the victim's request")
    return Trace(len(enc), tuple(sizes), tuple(times))


def collect(url: str, model: str, mode: str, cfg: StreamAttackConfig, rng: random.Random,
            progress=None) -> ModeResult:
    """cfg.trials traces per topic from the node at `url`, topics in a shuffled order."""
    config, result = key_config(url), ModeResult(mode)
    order = [i for i in range(len(cfg.topics)) for _ in range(cfg.trials)]
    rng.shuffle(order)
    with httpx.Client(timeout=300) as client:
        observe(client, url, config, b"/v1/completions", _body(cfg, model, "warm-up", rng), mode != "off")
        for i in order:
            result.traces.append(observe(client, url, config, b"/v1/completions", _body(cfg, model, cfg.topics[i], rng),
                                         mode != "off"))
            result.labels.append(i)
            if progress is not None:
                progress.update(1)
    return result


def _body(cfg: StreamAttackConfig, model: str, prompt: str, rng: random.Random) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": cfg.max_tokens, "temperature": cfg.temperature,
            "seed": rng.randrange(2**31), "ignore_eos": not cfg.natural_length, "stream": True}


# ---- the classifier -----------------------------------------------------------------------------------


def features(t: Trace) -> list[float]:
    sizes, gaps = list(t.sizes), t.gaps
    head_sizes = (sizes + [0] * FIRST_K)[:FIRST_K]
    head_gaps = (gaps + [0.0] * FIRST_K)[:FIRST_K]
    return [float(t.request_bytes), float(len(sizes)), t.times[-1] if t.times else 0.0, float(np.mean(sizes)),
            float(np.std(sizes)), float(np.mean(gaps)), float(np.std(gaps)), *map(float, head_sizes), *head_gaps]


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
    return {"attack": "stream-shape", "topics": len(cfg.topics), "trials_per_topic": cfg.trials,
            "max_tokens": cfg.max_tokens, "temperature": cfg.temperature, "natural_length": cfg.natural_length,
            "folds": cfg.folds, "classifier": "multinomial logistic regression, stratified k-fold",
            "results": [r.summary(len(cfg.topics), cfg.folds, cfg.seed) for r in results],
            "examples": {r.mode: [{"topic": r.labels[i], "sizes": list(r.traces[i].sizes),
                                   "times": list(r.traces[i].times)} for i in _first_per_topic(r.labels)]
                         for r in results}}


def _first_per_topic(labels: list[int]) -> list[int]:
    seen: dict[int, int] = {}
    for i, label in enumerate(labels):
        seen.setdefault(label, i)
    return [seen[k] for k in sorted(seen)]


def run(cfg: StreamAttackConfig, json_path: str | None, plot_path: str | None) -> dict:
    from tqdm.auto import tqdm

    from traceless.local.services import spawn_node

    rng = random.Random(cfg.seed)
    model_args = ["--model", cfg.model] if cfg.model else []
    results = []
    with tqdm(total=len(MODES) * len(cfg.topics) * cfg.trials, desc="requests", unit="req") as bar:
        for mode in MODES:
            shape = ["--shape", "off"] if mode == "off" else []
            with spawn_node(*model_args, *shape, "--served-model-name", SERVED_NAME, "--kv-cache-memory", "256MiB",
                            "--max-model-len", "2048", "--dtype", "float32", name=f"node-{mode}") as svc:
                results.append(collect(svc.url, SERVED_NAME, mode, cfg, rng, bar))
    return finish(report_for(results, cfg), print_report, json_path, plot, plot_path)


def print_report(report: dict) -> None:
    print(f"\ntraceless attack stream-shape  ({report['topics']} topics x {report['trials_per_topic']} traces per "
          f"mode, {report['max_tokens']} output tokens, {report['classifier']})")
    print(f"{'node':<10}{'accuracy':>10}{'95% CI':>16}{'chance':>8}{'chance range':>16}{'p(chance)':>11}"
          f"{'chunk sizes':>13}{'request sizes':>15}  verdict")
    for r in report["results"]:
        lo, hi = r["accuracy_95ci"]
        clo, chi = r["chance_95_range"]
        verdict = "LEAKS: the topic shows through" if r["above_chance"] else "at chance"
        print(f"{r['mode']:<10}{r['accuracy']:>10.3f}{f'[{lo:.2f}, {hi:.2f}]':>16}{r['chance']:>8.3f}"
              f"{f'[{clo:.2f}, {chi:.2f}]':>16}{r['p_value_at_chance']:>11.3g}{r['distinct_chunk_sizes']:>13}"
              f"{len(r['request_sizes']):>15}  {verdict}")
    print("(accuracy: each trace classified by a model trained on the other folds; chance range: where a "
          "classifier\n without information lands 95% of the time; sizes: distinct values the relay saw)")


def plot(report: dict, path: str) -> None:
    with figure(path, (11, 4), ncols=3) as (fig, axes):
        ax = axes[0]
        res = report["results"]
        for i, r in enumerate(res):
            lo, hi = r["accuracy_95ci"]
            ax.bar(i, r["accuracy"], yerr=[[r["accuracy"] - lo], [hi - r["accuracy"]]], capsize=6, zorder=2,
                   color="tab:red" if r["above_chance"] else "tab:green")
        clo, chi = res[0]["chance_95_range"]
        ax.axhspan(clo, chi, color="0.85", label="chance (95% range)", zorder=0)
        ax.axhline(res[0]["chance"], color="k", ls=":")
        ax.set_xticks(range(len(res)), [f"shape {r['mode']}" for r in res])
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
