"""The report of `traceless bench privacy-tax`: overheads, the table, JSON and the plot.

Overhead is a cost, positive when the private path is worse:
  latency (TTFT, ITL)        (private - plain) / plain
  throughput (tokens/s, req/s)  (plain - private) / plain
"""

from __future__ import annotations

import math
from typing import Any

from traceless_tools.report.output import figure

PUBLISHED: dict[str, Any] = {
    "tokens_per_s_pct": 7.0,
    "ttft_pct": 19.0,
    "source": "GPU confidential computing, H100 with the TEE on, Llama-3.1-8B (published figures)",
}
# (key, label, where in a summary, kind): kind "throughput" or "latency" decides the overhead's sign.
METRICS = (
    ("output_tokens_per_s", "output tokens/s", ("output_tokens_per_s",), "throughput"),
    ("requests_per_s", "requests/s", ("requests_per_s",), "throughput"),
    ("ttft_p50", "TTFT p50 (ms)", ("ttft_s", "p50"), "latency"),
    ("ttft_p90", "TTFT p90 (ms)", ("ttft_s", "p90"), "latency"),
    ("itl_p50", "ITL p50 (ms)", ("itl_s", "p50"), "latency"),
    ("itl_p90", "ITL p90 (ms)", ("itl_s", "p90"), "latency"),
)
NOTE = (
    "Both sides run the same engine options on one engine each (the private path has ONE node). The prefix\n"
    "cache is the node's default, 'isolated', on both: these requests carry no cache_salt, so nothing is\n"
    "shared -- the same as 'off' for this workload. On one machine the proxy, relay, gateway, issuer and\n"
    "log share its CPU cores with the engine; in a deployment the proxy runs on the user's machine."
)


def _get(summary: dict, where: tuple[str, ...]) -> float:
    value: Any = summary
    for key in where:
        value = value[key]
    return float(value)


def overhead_pct(plain: float, private: float, kind: str) -> float:
    if not (math.isfinite(plain) and math.isfinite(private)) or plain == 0:
        return float("nan")
    cost = (private - plain) if kind == "latency" else (plain - private)
    return 100.0 * cost / plain


def class_rows(entry: dict) -> dict:
    """{metric: {"plain", "private", "overhead_pct"}}; latencies in ms."""
    rows = {}
    for key, _, where, kind in METRICS:
        scale = 1e3 if kind == "latency" else 1.0
        plain, private = _get(entry["plain"], where) * scale, _get(entry["private"], where) * scale
        rows[key] = {"plain": plain, "private": private, "overhead_pct": overhead_pct(plain, private, kind)}
    return rows


def _worst(classes: dict, metric: str) -> tuple[str, float]:
    def cost(c: str) -> float:  # an unmeasured (NaN) cost counts as the worst
        v = classes[c]["metrics"][metric]["overhead_pct"]
        return v if math.isfinite(v) else math.inf

    name = max(classes, key=cost)
    return name, classes[name]["metrics"][metric]["overhead_pct"]


# two-sided 95% quantiles of Student's t for 1..30 degrees of freedom (no SciPy dependency)
_T95 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def pooled(costs: list[float]) -> dict:
    """Mean of per-repetition costs (every class, every repetition) with a 95% t interval: one
    run's estimate of the tax and how far the machine's noise leaves it uncertain."""
    xs = [x for x in costs if math.isfinite(x)]
    n = len(xs)
    if n == 0:
        return {"mean": float("nan"), "ci95": [float("nan"), float("nan")], "n": 0}
    mean = sum(xs) / n
    if n < 2:
        return {"mean": mean, "ci95": [float("nan"), float("nan")], "n": n}
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = (_T95[n - 2] if n - 1 <= len(_T95) else 1.96) * sd / math.sqrt(n)
    return {"mean": mean, "ci95": [mean - half, mean + half], "n": n}


def build(settings: dict, classes: dict, parts: dict, machine: dict) -> dict:
    for entry in classes.values():
        entry["metrics"] = class_rows(entry)
        entry["tokens_per_s_overhead_pct_per_repetition"] = [
            overhead_pct(r["plain"]["output_tokens_per_s"], r["private"]["output_tokens_per_s"], "throughput")
            for r in entry["repetitions"]
        ]
    for entry in classes.values():
        entry["ttft_p50_overhead_pct_per_repetition"] = [
            overhead_pct(r["plain"]["ttft_s"]["p50"], r["private"]["ttft_s"]["p50"], "latency")
            for r in entry["repetitions"]
        ]
    pooled_tps = pooled([x for e in classes.values() for x in e["tokens_per_s_overhead_pct_per_repetition"]])
    pooled_ttft = pooled([x for e in classes.values() for x in e["ttft_p50_overhead_pct_per_repetition"]])
    tps_class, tps = _worst(classes, "output_tokens_per_s")
    ttft_class, ttft = _worst(classes, "ttft_p50")
    ev = parts["evidence"]
    sent = ev["relay_ohttp_requests"]
    parts["per_private_request"] = {
        "tokens_fetched": ev["issuer_tokens_issued"] / sent if sent else float("nan"),
        "relay_challenge_calls": ev["relay_challenge_requests"] / sent if sent else float("nan"),
        "relay_nodes_calls": ev["relay_nodes_requests"] / sent if sent else float("nan"),
    }
    failed = sum(entry[p]["failed"] for entry in classes.values() for p in ("plain", "private"))
    return {
        "benchmark": "privacy-tax",
        "settings": settings,
        "machine": machine,
        "classes": classes,
        "breakdown": parts,
        "published": PUBLISHED,
        "failed": failed,
        "note": NOTE,
        "comparison": {
            "worst_tokens_per_s_pct": tps,
            "worst_tokens_per_s_class": tps_class,
            "worst_ttft_p50_pct": ttft,
            "worst_ttft_p50_class": ttft_class,
            "pooled_tokens_per_s_pct": pooled_tps,
            "pooled_ttft_p50_pct": pooled_ttft,
            "below_published": bool(tps < PUBLISHED["tokens_per_s_pct"] and ttft < PUBLISHED["ttft_pct"]),
        },
    }


# --- printing ---------------------------------------------------------------------------------------
def print_report(rep: dict) -> None:
    s, m = rep["settings"], rep["machine"]
    print(
        f"\ntraceless bench privacy-tax  plain `traceless serve` vs the private path (`traceless up`, one node)\n"
        f"{s['requests']} requests x {s['repeats']} repetitions per class and path, concurrency {s['concurrency']}, "
        f"{s['output_len']} output tokens (EOS ignored); {m['cpus']} CPUs, load "
        f"{m['loadavg_before'][0]:.2f} before, {m['loadavg_after'][0]:.2f} after"
    )
    print(f"\n{'class':<18}{'metric':<18}{'plain':>10}{'private':>10}{'cost':>9}")
    for name, entry in rep["classes"].items():
        lo, hi = entry["prompt_tokens"]
        label = f"{name} ({lo}-{hi})"
        for key, text, _, _ in METRICS:
            row = entry["metrics"][key]
            print(f"{label:<18}{text:<18}{row['plain']:>10.1f}{row['private']:>10.1f}{row['overhead_pct']:>+8.1f}%")
            label = ""
        reps = ", ".join(f"{x:+.1f}%" for x in entry["tokens_per_s_overhead_pct_per_repetition"])
        print(f"{'':<18}tokens/s cost per repetition: {reps}")
    c, p = rep["comparison"], rep["published"]
    verdict = "below" if c["below_published"] else "NOT below"
    print(
        f"\nvs published GPU confidential computing (~{p['tokens_per_s_pct']:.0f}% tokens/s, "
        f"~{p['ttft_pct']:.0f}% TTFT): privacy machinery costs {c['worst_tokens_per_s_pct']:+.1f}% tokens/s "
        f"(worst: {c['worst_tokens_per_s_class']}), "
        f"{c['worst_ttft_p50_pct']:+.1f}% TTFT p50 (worst: {c['worst_ttft_p50_class']}) -> {verdict}"
    )
    pt, pf = c["pooled_tokens_per_s_pct"], c["pooled_ttft_p50_pct"]
    if pt["n"] >= 2:
        print(
            f"pooled over {pt['n']} class x repetition pairs (mean, 95% interval): tokens/s {pt['mean']:+.1f}% "
            f"[{pt['ci95'][0]:+.1f}, {pt['ci95'][1]:+.1f}], TTFT p50 {pf['mean']:+.1f}% "
            f"[{pf['ci95'][0]:+.1f}, {pf['ci95'][1]:+.1f}]"
        )
        spans = [
            name
            for name, x, pub in (("tokens/s", pt, p["tokens_per_s_pct"]), ("TTFT", pf, p["ttft_pct"]))
            if x["ci95"][0] <= pub <= x["ci95"][1]
        ]
        if spans:
            print(
                f"  (the interval for {' and '.join(spans)} spans the published figure: within this machine's noise;"
                f" more --repeats narrow it)"
            )
    _print_breakdown(rep["breakdown"])
    print("\n" + rep["note"])
    if rep["failed"]:
        print(f"\n{rep['failed']} requests FAILED")


def _print_breakdown(b: dict) -> None:
    pr, h, cr, ev, per = b["probes"], b["hops"], b["crypto"], b["evidence"], b["per_private_request"]
    print("\nwhere the private path's time goes")
    print(
        f"  1-token request, idle, sequential (median): plain {pr['ttft_ms']['plain']:.1f} ms, private "
        f"{pr['ttft_ms']['private']:.1f} ms -> {pr['added_ms']:+.1f} ms per request"
    )
    print(
        f"  round trips before each request (via relay -> gateway): challenge {h['relay_challenge_ms']:.1f} ms "
        f"x {per['relay_challenge_calls']:.2f}, candidates {h['relay_nodes_ms']:.1f} ms "
        f"x {per['relay_nodes_calls']:.2f}"
        f"  (loopback HTTP: plain {h['plain_health_ms']:.1f} ms, proxy {h['proxy_health_ms']:.1f} ms)"
    )
    print(
        f"  candidate check: {cr['verify_cached_ms']:.2f} ms (first, with log tree head + inclusion proof: "
        f"{cr['verify_first_ms']:.1f} ms); OHTTP encapsulation of a 1500-token request: "
        f"{cr['encapsulate_1500_tokens_ms']:.2f} ms"
    )
    print(
        f"  tokens (one spent per request, fetched in batches): {ev['issuer_tokens_issued']} fetched in "
        f"{ev['issuer_batch_calls']} issuer calls for {ev['relay_ohttp_requests']} requests = "
        f"{per['tokens_fetched']:.2f} per request; {ev['issuer_batch_ms']:.1f} ms per call at the issuer, paid by "
        f"the request that empties the wallet"
    )
    print(
        f"  private requests through relay / gateway / node: {ev['relay_ohttp_requests']} / "
        f"{ev['gateway_ohttp_requests']} / {ev['node_requests_finished']}; "
        f"plain server: {ev['serve_requests_finished']}"
    )
    et = b["engine_ttft"]
    parts = [
        f"{name} {et['plain'][name]['p50_s'] * 1e3:.0f} vs {et['private'][name]['p50_s'] * 1e3:.0f}"
        for name in et["plain"]
    ]
    print(f"  engine-side TTFT p50, plain vs node (ms): {'; '.join(parts)}")
    cpu = b.get("cpu_s_per_request")
    if cpu:
        priv = ", ".join(f"{n} {s * 1e3:.0f}" for n, s in cpu["private"].items())
        print(f"  CPU ms per request: plain serve {cpu['plain']['serve'] * 1e3:.0f}; private: {priv}")


# --- files --------------------------------------------------------------------------------------------
def plot(rep: dict, path: str) -> None:
    names = list(rep["classes"])
    tps = [rep["classes"][n]["metrics"]["output_tokens_per_s"]["overhead_pct"] for n in names]
    ttft = [rep["classes"][n]["metrics"]["ttft_p50"]["overhead_pct"] for n in names]
    x, w = range(len(names)), 0.38
    with figure(path, (6.5, 4.5)) as (fig, ax):
        _draw_tax(ax, rep, names, tps, ttft, x, w)


def _draw_tax(ax, rep: dict, names: list[str], tps: list[float], ttft: list[float], x: range, w: float) -> None:
    ax.bar([i - w / 2 for i in x], tps, w, color="tab:blue", label="tokens/s cost")
    ax.bar([i + w / 2 for i in x], ttft, w, color="tab:orange", label="TTFT p50 cost")
    ax.axhline(
        PUBLISHED["tokens_per_s_pct"],
        color="tab:blue",
        ls="--",
        lw=1,
        label=f"GPU CC, tokens/s (~{PUBLISHED['tokens_per_s_pct']:.0f}%)",
    )
    ax.axhline(
        PUBLISHED["ttft_pct"], color="tab:orange", ls="--", lw=1, label=f"GPU CC, TTFT (~{PUBLISHED['ttft_pct']:.0f}%)"
    )
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(
        list(x),
        [f"{n}\n{rep['classes'][n]['prompt_tokens'][0]}-{rep['classes'][n]['prompt_tokens'][1]} tok" for n in names],
    )
    ax.set_ylabel("cost of the private path (%, below 0: faster)")
    ax.set_title("privacy tax: private path vs plaintext server")
    ax.legend(fontsize=8)
