"""`traceless bench privacy-tax`: the overhead definitions, the workload, the report, and one tiny
end-to-end run that must really go through the private path."""

from __future__ import annotations

import json
import math

import pytest

from traceless_tools.bench import privacy_tax_report as report
from traceless_tools.bench.privacy_tax import CLASSES, PATHS, QUICK, TaxConfig, class_prompts, config_from, order
from traceless_tools.bench.privacy_tax_breakdown import events
from traceless_tools.report.output import finish


# --- definitions and workload ------------------------------------------------------------------------
def test_overhead_is_a_cost_for_latency_and_throughput():
    assert report.overhead_pct(100.0, 110.0, "latency") == pytest.approx(10.0)  # slower TTFT: +10%
    assert report.overhead_pct(100.0, 93.0, "throughput") == pytest.approx(7.0)  # fewer tokens/s: +7%
    assert report.overhead_pct(100.0, 120.0, "throughput") == pytest.approx(-20.0)  # faster: negative cost
    assert math.isnan(report.overhead_pct(0.0, 1.0, "latency"))
    assert math.isnan(report.overhead_pct(float("nan"), 1.0, "throughput"))


def test_prompts_are_deterministic_in_range_and_new_each_repetition():
    for cls in CLASSES.values():
        a = class_prompts(cls, 12, seed=0, rep=0)
        assert a == class_prompts(cls, 12, seed=0, rep=0)
        assert all(cls.min_tokens <= len(p) <= cls.max_tokens for p in a)
        assert all(1_000 <= t < 40_000 for p in a for t in p)
        assert a != class_prompts(cls, 12, seed=0, rep=1)
    assert (
        CLASSES["short"].max_tokens,
        CLASSES["medium"].max_tokens,
        CLASSES["long"].min_tokens,
        CLASSES["long"].max_tokens,
    ) == (100, 500, 501, 1500)


def test_repetitions_alternate_the_order():
    assert [order(r) for r in range(4)] == [PATHS, PATHS[::-1], PATHS, PATHS[::-1]]


def test_config_validation_and_quick_defaults():
    with pytest.raises(ValueError, match="unknown prompt classes"):
        TaxConfig(classes=("short", "huge"))
    with pytest.raises(ValueError):
        TaxConfig(output_len=2)
    with pytest.raises(ValueError):
        TaxConfig(concurrency=0)
    with pytest.raises(ValueError, match="issuer"):  # the deployment's issuer grants 1000 tokens a run
        TaxConfig(requests=200, repeats=2)
    assert TaxConfig().private_requests() == 3 * (1 + 10 * 4) + 2 * 10
    cfg = config_from(True, requests=7, classes=None)
    assert cfg.requests == 7 and cfg.output_len == QUICK.output_len and cfg.repeats == QUICK.repeats
    assert config_from(False) == TaxConfig()


def test_the_command_is_registered_and_rejects_bad_options(capsys):
    from traceless_tools.cli import build_parser, main

    args = build_parser().parse_args(["bench", "privacy-tax", "--quick", "--classes", "short,long", "--json", "x"])
    assert args.quick and args.classes == "short,long" and args.json == "x"
    assert main(["bench", "privacy-tax", "--classes", "short,tiny"]) == 2
    assert "unknown prompt classes" in capsys.readouterr().err
    assert main(["bench", "privacy-tax", "--requests", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err


# --- the report on synthetic measurements ---------------------------------------------------------------
def _summary(tps: float, ttft: float, itl: float) -> dict:
    dist = lambda v: {"mean": v, "p50": v, "p90": 1.5 * v, "p99": 2 * v}  # noqa: E731
    return {
        "completed": 4,
        "failed": 0,
        "duration_s": 1.0,
        "requests_per_s": tps / 10,
        "output_tokens_per_s": tps,
        "ttft_s": dist(ttft),
        "itl_s": dist(itl),
        "e2e_s": dist(1.0),
    }


def _parts() -> dict:
    ev = {
        "relay_ohttp_requests": 8,
        "relay_challenge_requests": 8,
        "relay_nodes_requests": 8,
        "gateway_ohttp_requests": 8,
        "node_requests_finished": 8,
        "serve_requests_finished": 8,
        "issuer_tokens_issued": 8,
        "issuer_batch_calls": 1,
        "issuer_batch_ms": 20.0,
    }
    et = {p: {"short": {"requests": 4, "p50_s": 0.1}, "long": {"requests": 4, "p50_s": 1.0}} for p in PATHS}
    return {
        "probes": {"requests_per_path": 4, "ttft_ms": {"plain": 30.0, "private": 40.0}, "added_ms": 10.0},
        "hops": {"plain_health_ms": 1.0, "proxy_health_ms": 1.0, "relay_challenge_ms": 2.0, "relay_nodes_ms": 3.0},
        "crypto": {"verify_first_ms": 10.0, "verify_cached_ms": 0.1, "encapsulate_1500_tokens_ms": 0.1},
        "cpu_s_per_request": {"plain": {"serve": 0.5}, "private": {"node0": 0.5, "proxy": 0.02}},
        "evidence": ev,
        "engine_ttft": et,
    }


def _classes(long_private_tps: float) -> dict:
    def entry(plain, private):
        return {
            "prompt_tokens": [1, 2],
            "plain": plain,
            "private": private,
            "repetitions": [{"order": list(PATHS), "plain": plain, "private": private}],
        }

    return {
        "short": entry(_summary(100.0, 0.100, 0.020), _summary(98.0, 0.110, 0.021)),
        "long": entry(_summary(50.0, 1.000, 0.030), _summary(long_private_tps, 1.050, 0.030)),
    }


def test_report_table_comparison_json_and_plot(tmp_path, capsys):
    machine = {"cpus": 2, "loadavg_before": (1.0, 1.0, 1.0), "loadavg_after": (1.0, 1.0, 1.0)}
    rep = report.build(
        {"requests": 4, "repeats": 1, "concurrency": 2, "output_len": 16}, _classes(48.0), _parts(), machine
    )
    short = rep["classes"]["short"]["metrics"]
    assert short["output_tokens_per_s"]["overhead_pct"] == pytest.approx(2.0)
    assert short["ttft_p50"] == pytest.approx({"plain": 100.0, "private": 110.0, "overhead_pct": 10.0})
    assert short["itl_p90"]["overhead_pct"] == pytest.approx(5.0)
    c = rep["comparison"]
    assert (c["worst_tokens_per_s_class"], c["worst_ttft_p50_class"]) == ("long", "short")
    assert c["worst_tokens_per_s_pct"] == pytest.approx(4.0) and c["below_published"] is True
    assert rep["breakdown"]["per_private_request"]["tokens_fetched"] == pytest.approx(1.0)
    finish(rep, report.print_report, tmp_path / "r.json", report.plot, str(tmp_path / "r.png"))
    out = capsys.readouterr().out
    assert "TTFT p50 (ms)" in out and "+10.0%" in out and "-> below" in out
    assert json.loads((tmp_path / "r.json").read_text())["comparison"]["worst_ttft_p50_pct"] == pytest.approx(10.0)
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a private path that loses 10% of tokens/s on one class is above the published 7%
    worse = report.build({}, _classes(45.0), _parts(), machine)
    assert worse["comparison"]["below_published"] is False


# --- end to end --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_tiny_run_measures_both_paths_and_really_uses_the_private_path(tmp_path, capsys):
    from traceless_tools.cli import main

    work, out_json, out_png = tmp_path / "work", tmp_path / "tax.json", tmp_path / "tax.png"
    n, out_len, conc, probes = 2, 4, 2, 2
    rc = main(
        [
            "bench",
            "privacy-tax",
            "--requests",
            str(n),
            "--output-len",
            str(out_len),
            "--concurrency",
            str(conc),
            "--repeats",
            "1",
            "--probes",
            str(probes),
            "--workdir",
            str(work),
            "--json",
            str(out_json),
            "--plot",
            str(out_png),
        ]
    )
    assert rc == 0
    rep = json.loads(out_json.read_text())
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(rep["classes"]) == ["short", "medium", "long"]
    for name, entry in rep["classes"].items():
        for path in PATHS:
            s = entry[path]
            assert (s["completed"], s["failed"]) == (n, 0), (name, path)
            for value in (
                s["output_tokens_per_s"],
                s["requests_per_s"],
                s["ttft_s"]["p50"],
                s["ttft_s"]["p90"],
                s["itl_s"]["p50"],
                s["itl_s"]["p90"],
            ):
                assert math.isfinite(value) and value > 0, (name, path)
            assert s["output_tokens_per_s"] == pytest.approx(n * out_len / s["duration_s"])
        m = entry["metrics"]
        plain_ttft, private_ttft = entry["plain"]["ttft_s"]["p50"], entry["private"]["ttft_s"]["p50"]
        assert m["ttft_p50"]["overhead_pct"] == pytest.approx(100 * (private_ttft - plain_ttft) / plain_ttft)
        assert m["output_tokens_per_s"]["overhead_pct"] == pytest.approx(
            100
            * (entry["plain"]["output_tokens_per_s"] - entry["private"]["output_tokens_per_s"])
            / entry["plain"]["output_tokens_per_s"]
        )
    measured = n * len(CLASSES)
    # Independently of the report: the services' own event logs. Every private request crossed the
    # proxy, the relay and the gateway and ran on the node; no plain request reached the node.
    logs = work / "up" / "logs"
    warmups = len(CLASSES)
    private_total = warmups + measured + 2 * probes
    assert (
        private_total
        == TaxConfig(requests=n, output_len=out_len, concurrency=conc, repeats=1, probes=probes).private_requests()
    )

    def count(evs, **match):
        return sum(all(e.get(k) == v for k, v in match.items()) for e in evs)

    proxy_ok = count(events(logs / "proxy.log"), event="http.request", route="completions", status_code=200)
    assert proxy_ok == private_total
    # the warm-up asks the proxy for the model's name once: a call over the private path too
    models = count(events(logs / "proxy.log"), event="http.request", route="models", status_code=200)
    assert models == 1
    crossed = private_total + models
    assert count(events(logs / "relay.log"), event="http.request", route="ohttp", status_code=200) == crossed
    assert count(events(logs / "gateway.log"), event="http.request", route="ohttp", status_code=200) == crossed
    node_done = [e for e in events(logs / "node0.log") if e.get("event") == "request.finished"]
    serve_done = [e for e in events(work / "serve.log") if e.get("event") == "request.finished"]
    assert len(node_done) == private_total and len(serve_done) == warmups + measured + 2 * probes
    for done in (node_done, serve_done):
        got = sorted(e["prompt_tokens"] for e in done if e["output_tokens"] == out_len)
        assert len(got) == measured
        for name, cls in CLASSES.items():
            assert sum(cls.min_tokens <= t <= cls.max_tokens for t in got) == n, name
    ev = rep["breakdown"]["evidence"]
    assert (
        ev["relay_ohttp_requests"],
        ev["gateway_ohttp_requests"],
        ev["node_requests_finished"],
        ev["serve_requests_finished"],
    ) == (measured,) * 4
    issued = sum(e.get("tokens", 0) for e in events(logs / "issuer.log") if e.get("event") == "issuer.issued")
    assert issued >= private_total  # one token spent per private request
    verdict = "-> below" if rep["comparison"]["below_published"] else "-> NOT below"
    assert verdict in capsys.readouterr().out


def test_pooled_cost_has_a_t_interval_that_narrows_with_repetitions():
    p = report.pooled([2.0, 4.0, 6.0, 8.0])
    assert p["mean"] == pytest.approx(5.0) and p["n"] == 4
    assert p["ci95"] == pytest.approx([5.0 - 3.182 * 2.582 / 2, 5.0 + 3.182 * 2.582 / 2], abs=1e-2)
    wider = report.pooled([2.0, 8.0])
    assert wider["ci95"][1] - wider["ci95"][0] > p["ci95"][1] - p["ci95"][0]
    assert report.pooled([3.0])["n"] == 1 and math.isnan(report.pooled([3.0])["ci95"][0])
    assert report.pooled([float("nan"), 1.0, 3.0])["n"] == 2


def test_report_prints_the_pooled_interval_and_says_when_it_spans_the_published_figure(capsys):
    machine = {"cpus": 2, "loadavg_before": (1.0, 1.0, 1.0), "loadavg_after": (1.0, 1.0, 1.0)}
    classes = _classes(45.0)
    for entry, costs in ((classes["short"], (1.0, 12.0)), (classes["long"], (3.0, 14.0))):
        entry["repetitions"] = [
            {"order": list(PATHS), "plain": _summary(100.0, 0.1, 0.02), "private": _summary(100.0 - c, 0.1, 0.02)}
            for c in costs
        ]
    rep = report.build({"requests": 4, "repeats": 2, "concurrency": 2, "output_len": 16}, classes, _parts(), machine)
    pt = rep["comparison"]["pooled_tokens_per_s_pct"]
    assert pt["n"] == 4 and pt["mean"] == pytest.approx(7.5) and pt["ci95"][0] < 7.0 < pt["ci95"][1]
    report.print_report(rep)
    out = capsys.readouterr().out
    assert "pooled over 4 class x repetition pairs" in out and "spans the published figure" in out
