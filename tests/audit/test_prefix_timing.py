"""The prefix-timing attack harness against live servers (real default model, few trials)."""

import pytest

from traceless_tools.audit.prefix_timing import AttackConfig, run

pytestmark = pytest.mark.slow


def test_the_attack_works_on_a_shared_cache_and_not_on_the_isolated_one(tmp_path):
    rep = run(AttackConfig(trials=12, prefix_tokens=192, seed=1), str(tmp_path / "r.json"), str(tmp_path / "r.png"))
    by_mode = {r["mode"]: r for r in rep["results"]}
    # the harness can see a leak: on the shared cache the secret prefix is a cache hit
    assert by_mode["global"]["auc"] > 0.9
    assert by_mode["global"]["ttft_positive_median_s"] < 0.5 * by_mode["global"]["ttft_negative_median_s"]
    # on the isolated cache the attacker's probes never get a hit: no fast path for the victim's prefix
    iso = by_mode["isolated"]
    assert iso["ttft_positive_median_s"] > 0.5 * iso["ttft_negative_median_s"]
    assert (tmp_path / "r.png").stat().st_size > 1000 and (tmp_path / "r.json").exists()
