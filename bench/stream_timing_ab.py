"""Shaped-stream timing under load, before against after, in one run (docs/shape-hiding.md: timing
under load). Three nodes with the defaults side by side: `before` from another checkout (its
PYTHONPATH), `timer` (this checkout, --ballast off) and `timer+ballast` (this checkout's defaults);
the stream-shape attack's natural-length reading against each, requests interleaved in a shuffled
order so all three see the same load, then a few long-prompt probes (prefill past the budget).
Prints and writes the topic classifier, the gap-jitter and the late-first-tick readings.

    PYTHONPATH=$PWD python bench/stream_timing_ab.py OLD_CHECKOUT --trials 8 --load 2 --probes 6 --json F
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from contextlib import ExitStack

import httpx

from traceless.privacy.shape import ShapePolicy
from traceless_tools.audit.stream_observe import key_config, observe
from traceless_tools.audit.stream_shape import (
    MAX_MODEL_LEN,
    SERVED_NAME,
    TOPICS,
    ModeResult,
    StreamAttackConfig,
    _body,
)
from traceless_tools.audit.stream_timing import late_first_ticks
from traceless_tools.local.load import cpu_load
from traceless_tools.local.services import spawn_node

# ~350 tokens in the 1 KiB bucket: a prefill past the bucket's 0.5 s budget on a loaded CPU
LONG = " ".join(f"w{i} item" for i in range(90))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", help="the checkout of the code before (its directory, for PYTHONPATH)")
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--load", type=int, default=2)
    p.add_argument("--probes", type=int, default=6)
    p.add_argument("--json", required=True)
    args = p.parse_args()
    here = os.getcwd()
    arms = {"before": (args.before, ()), "timer": (here, ("--ballast", "off")), "timer+ballast": (here, ())}
    cfg = StreamAttackConfig(TOPICS[:4], trials=args.trials, natural_length=True)
    rng, loads = random.Random(0), [os.getloadavg()]
    with ExitStack() as stack:
        stack.enter_context(cpu_load(args.load))
        nodes = {}
        for name, (path, extra) in arms.items():
            os.environ["PYTHONPATH"] = path  # the node's code; spawn_node passes the environment on
            nodes[name] = stack.enter_context(
                spawn_node(
                    *extra,
                    "--served-model-name",
                    SERVED_NAME,
                    "--kv-cache-memory",
                    "256MiB",
                    "--max-model-len",
                    str(MAX_MODEL_LEN),
                    "--dtype",
                    "float32",
                    name=f"node-{name}",
                )
            )
        os.environ["PYTHONPATH"] = here
        results, probes = run(nodes, cfg, args.probes, rng, loads)
    loads.append(os.getloadavg())
    budget = lambda t: ShapePolicy().prefill_budget_s(t.request_bytes - 64, 8 * MAX_MODEL_LEN)  # noqa: E731
    report = {
        "load_processes": args.load,
        "trials_per_topic": args.trials,
        "loadavg_1_5_15": loads,
        "probes_long_prompt": {n: late_first_ticks(ts, 0.1, budget) for n, ts in probes.items()},
        "results": {n: {k: v for k, v in r.summary(4, 4, 0).items() if k != "confusion"} for n, r in results.items()},
        "traces": {
            n: [
                {
                    "topic": label,
                    "times": t.times,
                    "carried": t.carried,
                    "first_token": t.first_token,
                    "tokens": t.tokens,
                }
                for label, t in zip(r.labels, r.traces)
            ]
            for n, r in results.items()
        },
    }
    with open(args.json, "w") as f:
        json.dump(report, f, separators=(",", ":"))
    for name, r in report["results"].items():
        print(
            name,
            "topic accuracy",
            r["accuracy"],
            "\n  late first tick",
            r["late_first_tick"],
            "\n  gap jitter",
            r["gap_jitter"],
            "\n  long-prompt probes",
            report["probes_long_prompt"][name],
        )


def run(nodes: dict, cfg: StreamAttackConfig, n_probes: int, rng: random.Random, loads: list):
    results = {name: ModeResult(name, length="natural") for name in nodes}
    probes: dict[str, list] = {name: [] for name in nodes}
    configs = {name: key_config(n.url) for name, n in nodes.items()}
    order = [i for i in range(len(cfg.topics)) for _ in range(cfg.trials)]
    rng.shuffle(order)

    def one(name: str, body: dict):
        return observe(client, nodes[name].url, configs[name], b"/v1/completions", body, True)

    with httpx.Client(timeout=300) as client:
        for name in nodes:
            one(name, _body(cfg, SERVED_NAME, "warm-up", rng))
        for j, i in enumerate(order):
            for name in rng.sample(list(nodes), len(nodes)):
                results[name].traces.append(one(name, _body(cfg, SERVED_NAME, cfg.topics[i], rng)))
                results[name].labels.append(i)
            if j % 8 == 0:
                loads.append(os.getloadavg())
                print(j, time.strftime("%H:%M:%S"), os.getloadavg(), flush=True)
        for _ in range(n_probes):
            for name in rng.sample(list(nodes), len(nodes)):
                probes[name].append(one(name, {**_body(cfg, SERVED_NAME, LONG, rng), "max_tokens": 4}))
    return results, probes


if __name__ == "__main__":
    main()
