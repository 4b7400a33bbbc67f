"""`traceless attack prefix-timing`: the published prefix-cache timing attack, run against a
shared (`--prefix-cache global`) and an isolated (`--prefix-cache isolated`) server.

Each trial: the victim sends a request whose prompt starts with a fresh secret prefix (its own
`cache_salt` in isolated mode). The attacker then probes once, at random either with the victim's
exact prefix (a positive) or with a different prefix of the same length (a negative), and
measures the time to first token. A cache hit skips the prefix's prefill, so on a shared cache
positives are faster. The attacker's score is -TTFT; the report gives ROC AUC and the held-out
(leave-one-out) accuracy of a tuned threshold, next to chance (the majority class). On the isolated
cache the attacker's salt differs from the victim's, so it can never hit the victim's blocks: the
AUC must be at chance (0.5).
"""

from __future__ import annotations

import random
import secrets
import time
from dataclasses import dataclass, field

import httpx

from traceless_tools.audit.stats import (
    auc_interval,
    auc_p_value,
    best_threshold_accuracy,
    held_out_accuracy,
    roc_auc,
    roc_curve,
)
from traceless_tools.local.services import spawn_serve
from traceless_tools.report.output import figure, finish


@dataclass(frozen=True, slots=True)
class AttackConfig:
    trials: int = 40
    prefix_tokens: int = 512
    model: str | None = None  # None = the built-in default model
    seed: int = 0


@dataclass
class ModeResult:
    mode: str
    positives: list[float] = field(default_factory=list)  # attacker TTFT when probing the victim's prefix
    negatives: list[float] = field(default_factory=list)

    def summary(self) -> dict:
        pos, neg = [-t for t in self.positives], [-t for t in self.negatives]
        acc, threshold = best_threshold_accuracy(pos, neg)
        auc = roc_auc(pos, neg)
        p = auc_p_value(auc, len(pos), len(neg))
        return {
            "mode": self.mode,
            "trials": len(self.positives) + len(self.negatives),
            "auc": auc,
            "auc_95ci": auc_interval(auc, len(pos), len(neg)),
            "p_value_auc_is_chance": p,
            "distinguishable": p < 0.01,
            "accuracy": held_out_accuracy(pos, neg),
            "accuracy_in_sample": acc,
            "chance_accuracy": max(len(pos), len(neg)) / max(1, len(pos) + len(neg)),
            "threshold_ttft_s": -threshold if threshold != float("inf") else None,
            "ttft_positive_median_s": _median(self.positives),
            "ttft_negative_median_s": _median(self.negatives),
            "ttft_positives_s": list(self.positives),
            "ttft_negatives_s": list(self.negatives),
        }


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if s else float("nan")


def _ttft(client: httpx.Client, model: str, prompt: list[int], salt: str | None) -> float:
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True}
    if salt is not None:
        body["cache_salt"] = salt
    t0 = time.perf_counter()
    with client.stream("POST", "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - t0
    raise RuntimeError("the probe got no token")


def run_mode(url: str, mode: str, cfg: AttackConfig, rng: random.Random, progress=None) -> ModeResult:
    result = ModeResult(mode)
    victim_salt = secrets.token_urlsafe(24) if mode == "isolated" else None
    attacker_salt = secrets.token_urlsafe(24) if mode == "isolated" else None
    with httpx.Client(base_url=url, timeout=300) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]

        def draw() -> list[int]:
            return [rng.randrange(1_000, 40_000) for _ in range(cfg.prefix_tokens)]

        _ttft(client, model, draw(), attacker_salt)  # warm-up
        for _ in range(cfg.trials):
            secret = draw()
            _ttft(client, model, secret + [1_234, 2_345], victim_salt)  # the victim's request
            positive = rng.random() < 0.5
            probe = secret if positive else draw()
            t = _ttft(client, model, probe + [3_456], attacker_salt)
            (result.positives if positive else result.negatives).append(t)
            if progress is not None:
                progress.update(1)
    return result


def run(cfg: AttackConfig, json_path: str | None, plot_path: str | None) -> dict:
    from tqdm.auto import tqdm

    rng = random.Random(cfg.seed)
    model_args = ["--model", cfg.model] if cfg.model else []
    results = []
    with tqdm(total=2 * cfg.trials, desc="probes", unit="probe") as bar:
        for mode in ("global", "isolated"):
            with spawn_serve(*model_args, "--prefix-cache", mode, "--kv-cache-memory", "1GiB", name=mode) as svc:
                results.append(run_mode(svc.url, mode, cfg, rng, bar))
    report = {
        "attack": "prefix-timing",
        "trials_per_mode": cfg.trials,
        "prefix_tokens": cfg.prefix_tokens,
        "results": [r.summary() for r in results],
    }
    return finish(report, print_report, json_path, lambda _, path: plot(results, path), plot_path)


def print_report(report: dict) -> None:
    print(
        f"\ntraceless attack prefix-timing  ({report['trials_per_mode']} trials per mode, "
        f"{report['prefix_tokens']}-token secret prefixes)"
    )
    print(
        f"{'cache':<10}{'ROC AUC':>9}{'95% CI':>16}{'p(AUC=.5)':>11}{'accuracy':>10}{'chance':>8}"
        f"{'TTFT probe=secret':>19}{'TTFT probe=other':>18}  verdict"
    )
    for r in report["results"]:
        lo, hi = r["auc_95ci"]
        verdict = "LEAKS: attacker tells cached prefixes apart" if r["distinguishable"] else "at chance"
        print(
            f"{r['mode']:<10}{r['auc']:>9.3f}{f'[{lo:.2f}, {hi:.2f}]':>16}{r['p_value_auc_is_chance']:>11.3g}"
            f"{r['accuracy']:>10.3f}{r['chance_accuracy']:>8.3f}"
            f"{r['ttft_positive_median_s']:>19.4f}{r['ttft_negative_median_s']:>18.4f}  {verdict}"
        )
    print(
        "(TTFT medians in seconds; AUC 0.5 is chance: the attacker learns nothing from timing. "
        "accuracy: leave-one-out,\n"
        " a threshold tuned on the other probes; chance: always guessing the more frequent answer.)"
    )


def plot(results: list[ModeResult], path: str) -> None:
    with figure(path, (5, 5)) as (fig, ax):
        for r in results:
            fpr, tpr = roc_curve([-t for t in r.positives], [-t for t in r.negatives])
            ax.plot(fpr, tpr, label=f"{r.mode} cache (AUC {r.summary()['auc']:.2f})")
        ax.plot([0, 1], [0, 1], "k:", label="chance")
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.set_title("Prefix-cache timing attack")
        ax.legend(loc="lower right")
