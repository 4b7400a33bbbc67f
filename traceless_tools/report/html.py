"""`traceless report`: run the benchmarks, attacks and audits with quick settings and write one
self-contained HTML page (tables inline, plots as data URIs) that says what the deployment
guarantees and what it costs, with the evidence for each claim.

Each section runs one tool; its printed table is kept as is, its JSON feeds a headline row.
A section that fails is reported as failed (with its exception type), and the others still run.
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Section:
    key: str
    title: str
    shows: str
    run: Callable[[Path], dict]
    headline: Callable[[dict], list[tuple[str, str, str]]]  # (claim, measured, verdict)
    report: dict | None = None
    text: str = ""
    plots: list[Path] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0


def _offline(d: Path) -> dict:
    from traceless_tools.bench.offline import run

    return run(None, "auto", 1, ["W1", "W2", "W3"], str(d / "offline.json"), {})


def _offline_headline(r: dict) -> list:
    peer = _vllm_reference()
    out = [
        (
            "single-stream decode (W1)",
            f"{r['W1']['decode_tokens_per_s']:.0f} tok/s, TTFT {r['W1']['ttft_s'] * 1e3:.0f} ms",
            "",
        )
    ]
    for w, key in (("W2", "output_tokens_per_s"), ("W3", "output_tokens_per_s")):
        ratio = f" ({r[w][key] / peer[w][key]:.2f}x vLLM CPU)" if peer else ""
        out.append((f"{w} throughput", f"{r[w][key]:.0f} output tok/s{ratio}", ""))
    out.append(("load time", f"{r['load_s']:.1f} s", "ok" if r["load_s"] < 10 else "slow"))
    return out


def _vllm_reference() -> dict | None:
    path = Path(__file__).resolve().parents[2] / "bench" / "peer" / "vllm_cpu_offline.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _prefix_timing(d: Path) -> dict:
    from traceless_tools.audit.prefix_timing import AttackConfig, run

    return run(AttackConfig(trials=40, prefix_tokens=384), str(d / "prefix_timing.json"), str(d / "prefix_timing.png"))


def _prefix_timing_headline(r: dict) -> list:
    by = {x["mode"]: x for x in r["results"]}
    return [
        (
            f"timing attack on a {m} prefix cache",
            f"AUC {by[m]['auc']:.2f} (p={by[m]['p_value_auc_is_chance']:.2g})",
            ("attack works" if by[m]["distinguishable"] else "at chance")
            if m == "global"
            else ("LEAKS" if by[m]["distinguishable"] else "at chance: protected"),
        )
        for m in ("global", "isolated")
    ]


def _targeting(d: Path) -> dict:
    from traceless_tools.audit.targeting import run
    from traceless_tools.audit.targeting_estimate import Scenario

    return run(Scenario(requests=600), str(d / "targeting.json"), str(d / "targeting.png"))


def _targeting_headline(r: dict) -> list:
    s = r["summary"]
    return [
        (
            "our routing vs targeting attacks (real gateway)",
            "stays at the attacker's capacity share" if not s["ours_beaten"] else "BEATEN",
            "non-targetable" if not s["ours_beaten"] else "FAIL",
        ),
        ("production-style routers", "beaten: " + ", ".join(s["simulated_policies_beaten"]), "(comparison)"),
    ]


def _residue(d: Path) -> dict:
    from traceless_tools.audit.residue import ResidueConfig, run

    return run(ResidueConfig(), str(d / "residue.json"))


def _residue_headline(r: dict) -> list:
    outside = sum(v for v in r["places"].values())
    rows = [
        ("canaries left outside process memory", str(int(outside)), "none" if not r["failed"] else "FAIL"),
        ("canaries left in node process memory", str(r["process_memory_total"]), "none"),
    ]
    if "serve" in r:  # older result files lack the plaintext server's part
        serve = r["serve"]
        rows.append(
            (
                "canaries left by the plaintext server (places + memory)",
                str(int(sum(serve["places"].values())) + serve["process_memory_total"]),
                "none",
            )
        )
    return rows


def _privacy_tax(d: Path) -> dict:
    from traceless_tools.bench.privacy_tax import config_from, run

    # The full run's request shape (64 output tokens, 4 in flight) with fewer requests: --quick's 16-token
    # requests measure mostly the fixed per-request latency. Two repetitions (plain-private, then
    # private-plain) so that drift on the machine cancels.
    return run(
        config_from(True, requests=10, output_len=64, concurrency=4, repeats=2),
        str(d / "privacy_tax.json"),
        str(d / "privacy_tax.png"),
    )


def _privacy_tax_headline(r: dict) -> list:
    c = r["comparison"]

    def pooled(key: str) -> str:
        x = c[key]
        return f"; all classes {x['mean']:+.1f}% [{x['ci95'][0]:+.1f}, {x['ci95'][1]:+.1f}]" if x["n"] >= 2 else ""

    def verdict(key: str, published: float) -> str:
        x, ref = c[key], f"~{published:.0f}% for GPU confidential computing"
        if x["n"] < 2:
            return "vs " + ref
        if x["ci95"][1] < published:
            return "below " + ref
        if x["ci95"][0] > published:
            return "ABOVE " + ref
        return f"inconclusive (the interval spans {ref}); `traceless bench privacy-tax` runs longer"

    published = r["published"]
    return [
        (
            "privacy tax: tokens/s",
            f"worst class {c['worst_tokens_per_s_pct']:+.1f}% ({c['worst_tokens_per_s_class']})"
            + pooled("pooled_tokens_per_s_pct"),
            verdict("pooled_tokens_per_s_pct", published["tokens_per_s_pct"]),
        ),
        (
            "privacy tax: TTFT p50",
            f"worst class {c['worst_ttft_p50_pct']:+.1f}% ({c['worst_ttft_p50_class']})"
            + pooled("pooled_ttft_p50_pct"),
            verdict("pooled_ttft_p50_pct", published["ttft_pct"]),
        ),
    ]


def _prefix_cache(d: Path) -> dict:
    from traceless_tools.bench.prefix_cache import run

    return run(8, str(d / "prefix_cache.json"))


def _prefix_cache_headline(r: dict) -> list:
    rows = {x["config"]: x for x in r["rows"]}
    return [
        (
            "TTFT, repeated system prompt (same user)",
            f"{rows['isolated']['system_rest_median_s'] * 1e3:.0f} ms isolated "
            f"vs {rows['off']['system_rest_median_s'] * 1e3:.0f} ms off "
            f"vs {rows['global']['system_rest_median_s'] * 1e3:.0f} ms global",
            "",
        )
    ]


def _kv_offload(d: Path) -> dict:
    from traceless_tools.bench.kv_offload import run

    return run(12, 256, 96, 24, str(d / "kv_offload.json"))


def _kv_offload_headline(r: dict) -> list:
    rows = {x["kv_offload"]: x for x in r["rows"]}
    return [
        (
            "throughput under memory pressure",
            " / ".join(f"{m} {rows[m]['output_tokens_per_s']:.0f} tok/s" for m in ("none", "memory", "disk")),
            "",
        )
    ]


def sections() -> list[Section]:
    return [
        Section(
            "offline",
            "Engine speed (offline)",
            "W1 single stream, W2 batch of 64, W3 long prompts; the vLLM CPU "
            "build's numbers come from bench/peer (measured separately, same machine, same workloads).",
            _offline,
            _offline_headline,
        ),
        Section(
            "privacy_tax",
            "The privacy tax",
            "The full private path (OHTTP, Privacy Pass tokens, attestation "
            "and log checks, scrubbing, isolated cache) against the plaintext server, one run, interleaved.",
            _privacy_tax,
            _privacy_tax_headline,
        ),
        Section(
            "prefix_timing",
            "Prefix-cache timing attack",
            "A victim's secret prefix; an attacker probes and times "
            "the first token. On a shared cache it works; on the isolated cache it must be at chance.",
            _prefix_timing,
            _prefix_timing_headline,
        ),
        Section(
            "targeting",
            "Targetability",
            "P(a target's request lands on attacker nodes) against their "
            "capacity share, for our routing (the real gateway) and for production-style routers under fitting "
            "attacks.",
            _targeting,
            _targeting_headline,
        ),
        Section(
            "residue",
            "Residue",
            "Canaries through every path, then a search of the KV pool, prefix cache, "
            "offload directory, logs, files, metrics and process memory, node and plaintext server.",
            _residue,
            _residue_headline,
        ),
        Section(
            "prefix_cache",
            "Prefix caching",
            "What isolated caching keeps of the speed of a shared cache.",
            _prefix_cache,
            _prefix_cache_headline,
        ),
        Section(
            "kv_offload",
            "Encrypted KV offload",
            "Throughput under memory pressure: recompute vs sealed offload.",
            _kv_offload,
            _kv_offload_headline,
        ),
    ]


def run_section(s: Section, workdir: Path) -> None:
    out = io.StringIO()
    t0 = time.monotonic()
    try:
        with contextlib.redirect_stdout(out):
            s.report = s.run(workdir)
    except Exception as exc:  # one failed section must not lose the others
        s.error = type(exc).__name__
    s.seconds = time.monotonic() - t0
    s.text = out.getvalue()
    s.plots = sorted(workdir.glob(f"{s.key}*.png"))


def run(path: str, only: list[str] | None = None) -> Path:
    from tqdm.auto import tqdm

    workdir = Path(tempfile.mkdtemp(prefix="traceless-report-"))
    chosen = [s for s in sections() if not only or s.key in only]
    try:
        for s in tqdm(chosen, desc="report", unit="section"):
            run_section(s, workdir)
        out = Path(path)
        out.write_text(render(chosen))  # plots are embedded: the work directory can go
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB)")
    return out


GUARANTEES = [
    (
        "Stateless computation",
        "KV blocks are zeroed when a request ends, however it ends; offloaded KV is sealed "
        "with a per-request key that dies with the request; decrypted requests live in buffers that are wiped; freed "
        "heap memory is scrubbed; logs and metrics come from a fixed schema without free text.",
        "residue",
    ),
    (
        "Non-targetability",
        "Requests are anonymous (Privacy Pass tokens, OHTTP relay) and the gateway picks nodes at "
        "random by capacity, seeing no user or content.",
        "targeting",
    ),
    (
        "Isolated caching",
        "Cached prefixes are shared only within a client's own cache_salt domain (plus declared "
        "public prefixes), so the timing side channel of a shared cache is closed.",
        "prefix_timing",
    ),
    (
        "Verifiable transparency",
        "Clients refuse nodes whose attested measurement is not proven to be in the "
        "append-only log (checked with signed, consistent tree heads).",
        None,
    ),
    (
        "Honest limits",
        "The built-in attester is software: it does not prove what a hardware root of trust (SEV-SNP, "
        "TDX, GPU confidential computing) would; see docs/attestation.md.",
        None,
    ),
]


def render(chosen: list[Section]) -> str:
    rows = []
    for s in chosen:
        if s.error or s.report is None:
            rows.append(
                f"<tr><td>{html.escape(s.title)}</td>"
                f"<td colspan=2 class=bad>did not run ({html.escape(s.error or '?')})</td></tr>"
            )
            continue
        for claim, measured, verdict in s.headline(s.report):
            cls = "bad" if "FAIL" in verdict or "LEAKS" in verdict or "ABOVE" in verdict else ""
            rows.append(
                f"<tr><td>{html.escape(claim)}</td><td>{html.escape(measured)}</td>"
                f"<td class='{cls}'>{html.escape(verdict)}</td></tr>"
            )
    guarantees = "".join(
        f"<li><b>{html.escape(g)}</b>: {html.escape(t)}" + (f" <a href='#{k}'>(evidence)</a>" if k else "") + "</li>"
        for g, t, k in GUARANTEES
    )
    body = "".join(_section_html(s) for s in chosen)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>traceless report</title><style>
body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:.3em .6em;text-align:left}}
pre{{background:#f6f6f6;padding:.8em;overflow-x:auto;font-size:12px}}.bad{{color:#b00;font-weight:bold}}
img{{max-width:100%;border:1px solid #eee}}h2{{border-bottom:1px solid #ddd;padding-bottom:.2em}}</style></head><body>
<h1>traceless: what this deployment guarantees, and what it costs</h1>
<p>{html.escape(_machine())}</p>
<h2>Guarantees</h2><ul>{guarantees}</ul>
<h2>Headlines</h2><table><tr><th>claim</th><th>measured</th><th>verdict</th></tr>{"".join(rows)}</table>
{body}</body></html>
"""


def _section_html(s: Section) -> str:
    imgs = "".join(
        f"<p><img src='data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}' "
        f"alt='{html.escape(s.title)}'></p>"
        for p in s.plots
    )
    status = f"<p class=bad>did not run ({html.escape(s.error)})</p>" if s.error else ""
    return (
        f"<h2 id='{s.key}'>{html.escape(s.title)}</h2><p>{html.escape(s.shows)} <i>({s.seconds:.0f} s)</i></p>"
        f"{status}<pre>{html.escape(s.text.strip())}</pre>{imgs}"
    )


def _machine() -> str:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
        ).stdout.strip()
    except OSError:
        commit = "?"
    return (
        f"Generated {time.strftime('%Y-%m-%d %H:%M')} on {platform.machine()} with {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.2f} at the end; traceless commit {commit or '?'}; quick settings."
    )
