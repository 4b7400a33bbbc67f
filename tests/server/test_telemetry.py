"""Telemetry that cannot count one request: nothing changes in the metrics until a window of at
least K requests closes; no metrics on the public app."""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx
import pytest

from traceless.server.telemetry import TOKEN_UNIT, Telemetry, WindowPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def values(text: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_the_default_window_is_a_minute_and_twenty_requests_with_noise_of_epsilon_one():
    assert WindowPolicy() == WindowPolicy(60.0, 20, 1.0)
    for bad in (
        (0.0, 20),
        (float("inf"), 20),
        (60.0, -1),
        (60.0, 2.5),
        (60.0, 20, 0.0),
        (60.0, 20, float("nan")),
        (60.0, 20, float("inf")),
    ):
        with pytest.raises(ValueError):
            WindowPolicy(*bad)


def test_nothing_is_published_before_a_window_has_k_requests_and_its_time(captured_events):
    clock = Clock()
    t = Telemetry(WindowPolicy(60.0, 3, None), clock=clock)  # exact: the figures can be checked
    empty = t.render()
    t.request("completions", "ok")
    t.finished(["length"], 700, 16)
    t.ttft(0.03)
    assert t.render() == empty  # one request: nothing to see
    clock.now += 61
    assert t.render() == empty  # the window's time is up, but it holds fewer than K requests
    for _ in range(2):
        t.finished(["stop"], 700, 16)
        t.request("completions", "ok")
    published = values(t.render())
    assert published['traceless_requests_total{endpoint="completions",status="ok"}'] == 3
    assert published['traceless_finished_total{finish_reason="length"}'] == 1
    assert published['traceless_requests_by_prompt_tokens_total{tokens_le="2048"}'] == 3
    assert published['traceless_requests_by_generation_tokens_total{tokens_le="16"}'] == 3
    assert published["traceless_prompt_tokens_total"] == 3072  # 2100, rounded up to 1024s
    assert published["traceless_generation_tokens_total"] == 1024  # 48, rounded up
    assert published["traceless_window_requests"] == 3
    assert published['traceless_window_time_to_first_token_seconds{quantile="0.5"}'] == 0.05  # bucket bound
    record = json.loads(captured_events.text().strip().splitlines()[-1])
    assert record["event"] == "metrics.window" and record["requests"] == 3 and record["ok"] == 3
    assert record["ttft_p50_s"] == 0.05 and "prompt_tokens" not in record and "ts" in record
    after = t.render()
    t.request("completions", "ok")  # the next window starts empty: again nothing moves
    clock.now += 61
    assert t.render() == after


def test_token_totals_move_only_by_whole_units():
    clock = Clock()
    t = Telemetry(WindowPolicy(1.0, 1, None), clock=clock)
    seen = []
    for prompt in (1000, 30, 30):
        t.finished(["stop"], prompt, 1)
        clock.now += 2
        t.request("chat_completions", "ok")
        seen.append(values(t.render())["traceless_prompt_tokens_total"])
    assert seen == [1024, 2048, 2048] and all(v % TOKEN_UNIT == 0 for v in seen)


def test_a_few_short_generations_never_read_as_zero_tokens():
    """77 requests of ~10 tokens each once published 0 generated tokens: totals below one unit were
    rounded down to nothing. They are rounded up: 0 means nothing was generated, and a total is
    still known only to within one unit."""
    clock = Clock()
    t = Telemetry(WindowPolicy(60.0, 20, None), clock=clock)
    for _ in range(77):
        t.finished(["stop"], 40, 10)
        t.request("chat_completions", "ok")
        clock.now += 2
    published = values(t.render())
    assert published["traceless_generation_tokens_total"] == 1024  # 600 generated
    assert published["traceless_prompt_tokens_total"] == 3072  # the 60 requests of two closed windows: 2400
    empty = Telemetry(WindowPolicy(1.0, 0, None), clock=clock)
    clock.now += 2
    assert values(empty.render())["traceless_generation_tokens_total"] == 0


def test_min_requests_zero_publishes_every_window():
    clock = Clock()
    t = Telemetry(WindowPolicy(1.0, 0), clock=clock)
    clock.now += 1.5
    assert values(t.render())["traceless_telemetry_windows_total"] == 1


@dataclass
class FakeStats:
    num_running: int
    num_waiting: int
    kv_usage: float
    spec: dict


class FakeEngine:
    residue = None

    def __init__(self):
        self.stats_now = FakeStats(0, 0, 0.0, {"proposed": 0, "accepted": 0, "verify_steps": 0})

    def stats(self):
        return self.stats_now


def test_load_is_published_as_the_windows_rounded_peak():
    clock, engine = Clock(), FakeEngine()
    t = Telemetry(WindowPolicy(10.0, 2, None), engine, clock=clock)
    engine.stats_now = FakeStats(3, 1, 0.312, {"proposed": 9, "accepted": 4, "verify_steps": 5})
    t.request("completions", "ok")
    engine.stats_now = FakeStats(1, 0, 0.05, {"proposed": 12, "accepted": 6, "verify_steps": 7})
    clock.now += 11
    t.request("completions", "ok")
    v = values(t.render())
    assert v["traceless_window_peak_requests_running"] == 3 and v["traceless_window_peak_requests_waiting"] == 1
    assert v["traceless_window_peak_kv_cache_usage_ratio"] == pytest.approx(0.35)
    assert v["traceless_spec_decode_num_draft_tokens_total"] == 12


def test_with_noise_every_cell_is_published_and_nothing_a_request_moves_by_more_than_one():
    """The default telemetry: each histogram's every cell, noised (zero cells too: a missing one
    would say it was zero), counters that never go down; token sums, peaks, inter-token latency and
    the engine's counters are not published at all."""
    import random

    clock, engine = Clock(), FakeEngine()
    t = Telemetry(WindowPolicy(10.0, 2), engine, clock=clock, rng=random.Random(5))
    last: dict[str, float] = {}
    moved = set()
    for _ in range(30):
        clock.now += 11
        for _ in range(2):
            t.finished(["stop"], 100, 10)
            t.request("completions", "ok")
        v = values(t.render())
        assert all(v.get(k, 0) >= n for k, n in last.items() if k.endswith("_total") or "_total{" in k)
        moved |= {k for k, n in v.items() if k in last and n != last[k]}
        last = v
    assert len([k for k in last if k.startswith("traceless_requests_total{")]) == 8
    assert len([k for k in last if k.startswith("traceless_finished_total{")]) == 4
    assert len([k for k in last if k.startswith("traceless_requests_by_prompt_tokens_total{")]) == 6
    assert 'traceless_requests_total{endpoint="chat_completions",status="error"}' in moved  # noise, not requests
    assert last["traceless_window_requests"] == 2 and last["traceless_telemetry_windows_total"] == 30
    for gone in (
        "traceless_prompt_tokens_total",
        "traceless_generation_tokens_total",
        "traceless_window_peak_requests_running",
        "traceless_window_peak_kv_cache_usage_ratio",
        "traceless_spec_decode_num_draft_tokens_total",
    ):
        assert not any(k.startswith(gone) for k in last), gone
    assert not any(k.startswith("traceless_window_inter_token_latency") for k in last)


# --- live: the server's public app and its operator listener ---------------------------------------


@pytest.fixture(scope="module")
def served(tiny_llama_dir):
    from tests.support.serving import make_served_app, serve
    from traceless.config import EngineConfig
    from traceless.http.serve import serve_in_thread
    from traceless.server.operator_app import create_operator_app

    clock = Clock()
    telemetry_box = {}

    def make(engine):
        telemetry_box["t"] = Telemetry(WindowPolicy(60.0, 3), engine, clock=clock)  # with its noise
        return telemetry_box["t"]

    app, engine = make_served_app(
        EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=128),
        telemetry=make,
    )
    with serve(app, engine) as s, serve_in_thread(create_operator_app(telemetry_box["t"], "server")) as ops:
        s.clock, s.ops = clock, ops
        yield s


def test_one_request_cannot_be_seen_in_the_metrics(served):
    url, ops = served.url, served.ops
    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]

    def one(stream=False):
        r = httpx.post(
            url + "/v1/completions",
            json={"model": model, "prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True, "stream": stream},
            timeout=60,
        )
        assert r.status_code == 200

    before = httpx.get(ops + "/metrics").text
    one()
    served.wait_idle()
    assert httpx.get(ops + "/metrics").text == before  # scrape, one request, scrape: no change at all
    served.clock.now += 120
    assert httpx.get(ops + "/metrics").text == before  # its window is due, but holds 1 < K requests
    one(stream=True)
    one()
    after = values(httpx.get(ops + "/metrics").text)  # 3 requests: the window closed
    assert after["traceless_window_requests"] == 3 and after["traceless_telemetry_windows_total"] == 1
    assert len([k for k in after if k.startswith("traceless_requests_total{")]) == 8  # every cell, noised
    for line in httpx.get(ops + "/metrics").text.splitlines():  # nothing outside the declared families
        assert line.startswith("# ") or line.split("{")[0].split(" ")[0].startswith("traceless_")


def test_the_public_app_serves_no_metrics(served):
    r = httpx.get(served.url + "/metrics")
    assert r.status_code == 404 and "traceless_" not in r.text
    assert httpx.get(served.url + "/health").status_code == 200
