"""`traceless report`: one self-contained HTML page from the tools' JSON; a failing section is
reported as failed and the others still render. The sections run on recorded tool output (the
committed bench/results files), so the headline code is checked against the real report shapes."""

import json
import re
import shutil
from pathlib import Path

import pytest

from traceless_tools.report import html as report

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
RECORDED = {
    "offline": "offline.json",
    "privacy_tax": "privacy_tax.json",
    "prefix_timing": "prefix_timing.json",
    "targeting": "targeting.json",
    "residue": "residue.json",
    "prefix_cache": "prefix_cache.json",
    "kv_offload": "kv_offload.json",
}


def _recorded(key: str):
    def run(workdir: Path) -> dict:
        print(f"table of {key}")
        for png in RESULTS.glob(f"{key}*.png"):
            shutil.copy(png, workdir / png.name)
        return json.loads((RESULTS / RECORDED[key]).read_text())

    return run


def _broken(workdir: Path) -> dict:
    raise RuntimeError("the service did not start")


@pytest.fixture
def recorded_sections(monkeypatch):
    real = report.sections()
    for s in real:
        s.run = _recorded(s.key) if s.key != "kv_offload" else _broken
    monkeypatch.setattr(report, "sections", lambda: real)
    return real


def test_report_is_one_self_contained_page_with_every_headline(tmp_path, recorded_sections, capsys):
    out = report.run(str(tmp_path / "r.html"))
    page = out.read_text()
    assert page.startswith("<!doctype html>")
    assert not re.search(r"(src|href)=['\"]?https?:", page)  # nothing fetched from elsewhere
    assert page.count("data:image/png;base64,") == len(list(RESULTS.glob("*.png")))
    for claim in (
        "single-stream decode (W1)",
        "privacy tax: tokens/s",
        "timing attack on a global prefix cache",
        "our routing vs targeting attacks",
        "canaries left outside process memory",
        "TTFT, repeated system prompt",
    ):
        assert claim in page
    assert "table of residue" in page  # each tool's printed table is kept
    assert "did not run (RuntimeError)" in page  # the broken section, without its message
    assert "the service did not start" not in page
    assert "wrote" in capsys.readouterr().out


def test_only_runs_the_sections_asked_for(tmp_path, recorded_sections):
    page = report.run(str(tmp_path / "r.html"), only=["residue"]).read_text()
    assert "canaries left outside process memory" in page and "privacy tax" not in page


@pytest.mark.parametrize(
    "interval, expected", [((2.0, 5.0), "below"), ((8.0, 12.0), "ABOVE"), ((3.0, 9.0), "inconclusive")]
)
def test_privacy_tax_verdict_follows_the_pooled_interval(interval, expected):
    r = json.loads((RESULTS / "privacy_tax.json").read_text())
    r["comparison"]["pooled_tokens_per_s_pct"] = {"mean": sum(interval) / 2, "ci95": list(interval), "n": 12}
    tokens_row = report._privacy_tax_headline(r)[0]
    assert tokens_row[2].startswith(expected)


def test_the_report_leaves_no_work_directory(tmp_path, recorded_sections, record_mkdtemp):
    made = record_mkdtemp(report)
    report.run(str(tmp_path / "r.html"), only=["prefix_timing"])
    assert made and not made[0].exists()
