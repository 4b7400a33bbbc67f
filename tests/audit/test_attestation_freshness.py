from traceless_tools.audit.attestation_freshness import MAX_AGES_S, measure


def test_the_freshness_benchmark_measures_rounds_and_amortizes_them():
    report = measure(node_counts=(2,), rounds=2)
    (row,) = report["rows"]
    assert row["nodes"] == 2 and row["round_ms_median"] > 0
    per = row["per_request_ms_by_max_age_s"]
    assert per["0.0"] == row["round_ms_median"]  # a nonce per request pays a whole round
    assert per["60.0"] == row["round_ms_median"] / 60 and len(per) == len(MAX_AGES_S)
