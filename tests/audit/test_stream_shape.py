"""The stream-shape attack (Whisper Leak style) against a real node: far above chance with shape
hiding off, within chance with the node's defaults, for answers of a fixed length and of their
natural length (EOS ends them, at a different token for each topic). Tiny model, a few topics."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from tests.support.serving import serve
from traceless.config import EngineConfig
from traceless.entrypoints.build import build_engine
from traceless.node.app import create_node_app
from traceless.node.identity import NodeIdentity
from traceless.node.settings import NodeSettings
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.shape import OFF, STREAM_CHUNK, ShapePolicy
from traceless.server.async_engine import AsyncEngine
from traceless_tools.audit.stream_shape import (
    ModeResult,
    StreamAttackConfig,
    Trace,
    chance_interval,
    collect,
    cross_validate,
    features,
    plot,
    report_for,
)

# prompts of different lengths whose greedy answers on the tiny model end (EOS) after 1, 3, 7 and
# more than 10 tokens: what the natural-length reading is about
TOPICS = ("w22 w67 w21 w8 w84 w81 w20", "w55 w18 w57 w90 w18 w67", "w39 w65 w7 w20", "w64 w17")


def attack(model_dir, shape: ShapePolicy, mode: str, cfg: StreamAttackConfig) -> ModeResult:
    from traceless.privacy.attestation.software import SoftwareAttester

    engine = AsyncEngine(
        build_engine(EngineConfig(model=str(model_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=128))
    )  # a fresh one: a stopped engine stays stopped
    identity = NodeIdentity(SoftwareAttester(), Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32))
    with serve(create_node_app(engine, identity, NodeSettings("tiny", shape=shape)), engine) as node:
        return collect(node.url, "tiny", mode, cfg, random.Random(1))


def test_padding_off_leaks_the_topic_and_the_defaults_do_not(tiny_llama_dir, tmp_path):
    cfg = StreamAttackConfig(TOPICS, trials=8, max_tokens=10, temperature=0.0, folds=4)
    natural = replace(cfg, natural_length=True)
    # The node with shape hiding off first, alone: its attack reads timings too, and a busy neighbour
    # blurs them. Then the two nodes with the defaults side by side, each with its own engine and
    # attacker: their streams last their budgets (prefill 0.5 s + 10 tokens x 200 ms) whatever the
    # node does, so one after the other the test would mostly wait. Each is load for the other, as
    # the suite's other worker is; a leak shows through it (with padding off on both nodes, each
    # attack told all 32 traces apart, where the bound below is 0.5).
    results = [attack(tiny_llama_dir, OFF, "off", cfg)]
    with ThreadPoolExecutor(2) as pool:
        results += pool.map(lambda c: attack(tiny_llama_dir, ShapePolicy(), "defaults", c), (cfg, natural))
    report = report_for(results, cfg)
    off, on, on_natural = report["results"]
    print(
        {k: off[k] for k in ("accuracy", "accuracy_95ci", "chance_95_range")},
        *(
            {k: r[k] for k in ("accuracy", "accuracy_95ci", "chance_95_range", "chunks_per_response")}
            for r in (on, on_natural)
        ),
    )
    # far above chance: the whole 95% interval of its accuracy above the chance range (a fixed cut
    # such as 0.9 failed once in CI at 0.875, 28 of 32, interval 0.72-0.95: the timing features of a
    # loaded run can cost a trace or four; the leak is no smaller for it)
    lo, hi = off["chance_95_range"]
    assert off["above_chance"] and off["accuracy_95ci"][0] > hi, off
    assert len(off["request_sizes"]) >= len(TOPICS) and off["distinct_chunk_sizes"] > 3  # what it read
    # at chance: no better than a guesser does in 999 runs of 1000 (the 95% range alone would fail one
    # honest run in 40; the report still gives it)
    for r in (on, on_natural):
        assert r["accuracy"] <= _guesser_upper(len(TOPICS) * cfg.trials, 1 / len(TOPICS), 0.999), r
        assert r["chunk_sizes"] == [STREAM_CHUNK + 16] and len(r["request_sizes"]) == 1
    # the timing readings are taken of the node with the defaults (their figures under load are in
    # docs/shape-hiding.md: a timed assertion here would read this machine's load, not the node)
    assert off["late_first_tick"] is None and off["gap_jitter"] is None
    for r in (on, on_natural):
        late, jitter = r["late_first_tick"], r["gap_jitter"]
        assert late["streams"] == len(TOPICS) * cfg.trials and 0 <= late["first_tick_late"] <= 1, late
        assert jitter is not None and jitter["gap_sd_ms"]["padding"]["streams"] > 0, jitter
    # the natural lengths differ by topic (what the reading is about), and the streams do not
    lengths = {label: t.tokens for label, t in zip(results[2].labels, results[2].traces)}
    assert len(set(lengths.values())) > 1, lengths
    assert len({len(t.sizes) for t in results[2].traces}) == 1
    plot(report, str(tmp_path / "attack.png"))
    assert (tmp_path / "attack.png").stat().st_size > 10_000


def _guesser_upper(n: int, p: float, q: float) -> float:
    """The q-quantile of a guessing classifier's accuracy (Binomial(n, p) / n)."""
    import math

    cdf = 0.0
    for i in range(n + 1):
        cdf += math.comb(n, i) * p**i * (1 - p) ** (n - i)
        if cdf >= q:
            return i / n
    return 1.0


def test_the_classifier_finds_a_signal_and_none_where_there_is_none():
    rng = np.random.default_rng(0)
    # a signal: each class's chunk sizes around its own mean
    traces = [
        Trace(1079, tuple(int(s) for s in rng.normal(100 + 5 * c, 3, 12)), tuple(np.arange(1, 13) / 20))
        for c in range(4)
        for _ in range(20)
    ]
    y = np.repeat(np.arange(4), 20)
    x = np.array([features(t) for t in traces])
    assert (cross_validate(x, y, 4, 4, 0) == y).mean() > 0.9
    # no signal: labels drawn independently of the traces
    y_random = rng.integers(0, 4, len(y))
    lo, hi = chance_interval(len(y), 0.25)
    assert 0.1 < lo < 0.25 < hi < 0.4
    assert (cross_validate(x, y_random, 4, 4, 0) == y_random).mean() <= hi


def test_each_part_of_the_relays_view_is_read_alone():
    """The report says which part of the view carries the topic: a signal in the gaps' jitter alone
    (the node's timer is late by more while its engine works) is found by the gaps reading and not by
    the sizes or length readings."""
    from traceless_tools.audit.stream_shape import FEATURE_GROUPS, by_feature_group

    rng = np.random.default_rng(1)
    traces = []
    for c in range(4):
        for _ in range(20):
            late = rng.normal(0, 0.002 + 0.004 * (c % 2), 16).clip(0)  # topics 1, 3: a noisier timer
            traces.append(Trace(1079, (4112,) * 16, tuple(0.1 * np.arange(1, 17) + late)))
    y = np.repeat(np.arange(4), 20)
    x = np.array([features(t) for t in traces])
    accuracy = by_feature_group(x, y, 4, 4, 0)
    assert set(accuracy) == set(FEATURE_GROUPS) == {"sizes", "length", "gaps"}
    lo, hi = chance_interval(len(y), 0.25)
    assert accuracy["gaps"] > hi, accuracy  # two of four told apart: about 0.5
    assert accuracy["sizes"] <= hi and accuracy["length"] <= hi + 0.1, accuracy
