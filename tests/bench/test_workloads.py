"""Benchmark workloads: W1-W3 are fixed (peer-engine results are comparable across versions); W4
is a passage repeated, the case prompt lookup is made for."""

import hashlib

from traceless_tools.bench.speculative import print_table
from traceless_tools.bench.workloads import offline_workloads

# sha256(repr((prompts, max_tokens)))[:16] of W1-W3 as first published
FIXED = {"W1": "b0aad352cace8633", "W2": "c559c3e206d10222", "W3": "b7f6431d3eec037d"}


def test_w1_to_w3_are_unchanged():
    w = offline_workloads()
    for name, digest in FIXED.items():
        assert hashlib.sha256(repr((w[name].prompts, w[name].max_tokens)).encode()).hexdigest()[:16] == digest


def test_w4_repeats_one_passage_per_prompt():
    w4 = offline_workloads()["W4"]
    assert len(w4.prompts) == 4 and w4.max_tokens == 128
    for p in w4.prompts:
        assert len(p) == 192 and p[:64] * 3 == p and len(set(p[:64])) > 50
    assert len({p[:64] for p in w4.prompts}) == 4


def test_speculative_table_prints_every_workload(capsys):
    row = dict(
        off_output_tokens_per_s=10.0,
        spec_output_tokens_per_s=15.0,
        speedup=1.5,
        acceptance_rate=0.5,
        tokens_per_verify_step=2.5,
        identical_outputs=True,
    )
    report = {
        "speculative": "ngram",
        "num_speculative_tokens": 4,
        "model": "m",
        "dtype": "bfloat16",
        "device": "cpu",
        "loadavg_start": (0.5, 0, 0),
        "loadavg_end": (0.7, 0, 0),
        "W1": row,
        "W4": dict(row, identical_outputs=False),
    }
    print_table(report, ["W1", "W4"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2].split() == ["W1", "10.0", "15.0", "1.50", "0.50", "2.50", "yes"]
    assert lines[-1].split()[-1] == "no"
