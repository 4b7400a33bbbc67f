"""What a fresh attestation costs: a client nonce per request against a maximum age the client enforces.

`python -m traceless_tools.audit.attestation_freshness [--json PATH]`

One real gateway (in this process, loopback HTTP) with N audit nodes (targeting_nodes.py: real OHTTP
keys, software-attested documents made per nonce). One candidate round is what the client does when
its verified set is older than `attestation_max_age_s`: `GET /pcc/v1/nodes?nonce=N` (the gateway
fetches a document from every node for that nonce) and NodeVerifier.verify_all (signatures, nonce,
keys, release). With a nonce per request every request pays a round before it is sent; with a
maximum age A, a client sending r requests per second pays one round per A seconds, i.e.
round / (A * r) per request. The rounds are measured; the amortized figures follow from them.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import time

import httpx

from traceless.http.serve import serve_in_thread
from traceless.privacy.attestation.policy import AttesterPolicy
from traceless_tools.audit.targeting_nodes import AuditReleases, NodeFarm
from traceless_tools.client.node_verifier import NodeVerifier
from traceless_tools.client.private_client import ClientConfig
from traceless_tools.cluster.gateway import GatewayConfig, create_gateway_app

MODEL = "bench-model"
NODE_COUNTS = (2, 8, 32)
ROUNDS = 30
MAX_AGES_S = (0.0, 10.0, 60.0, 300.0)
RATE_PER_S = 1.0  # one request a second: a chatty interactive client


def _round_ms(n_nodes: int, rounds: int) -> list[float]:
    farm = NodeFarm(0.0)
    app = create_gateway_app(
        GatewayConfig(privacy=False, health_interval_s=3600, attester_policy=AttesterPolicy.DEVELOPMENT),
        releases=AuditReleases(),
    )
    with (
        serve_in_thread(farm.app) as farm_url,
        serve_in_thread(app) as gateway_url,
        httpx.Client(base_url=gateway_url, timeout=30) as http,
    ):
        farm.url = farm_url
        nodes = [farm.add(f"n{i}", 1 + i % 4, False) for i in range(n_nodes)]
        for node in nodes:
            http.post("/pcc/v1/register", json=node.registration(MODEL)).raise_for_status()
        cfg = ClientConfig(
            "http://unused",
            "unused",
            "http://unused",
            "http://127.0.0.1:9",
            bytes(32),
            tuple(node.attester_key for node in nodes),
            MODEL,
            attester_policy=AttesterPolicy.DEVELOPMENT,
        )
        verifier = NodeVerifier(cfg, releases=AuditReleases())
        times = []
        try:
            for _ in range(rounds + 1):
                nonce = secrets.token_bytes(32)
                t0 = time.perf_counter()
                offered = http.get("/pcc/v1/nodes", params={"model": MODEL, "k": 1000, "nonce": nonce.hex()})
                verified = verifier.verify_all(offered.json()["nodes"], nonce)
                times.append((time.perf_counter() - t0) * 1e3)
                if len(verified) != n_nodes:
                    raise RuntimeError("the benchmark's nodes did not all verify")
        finally:
            verifier.close()
    return times[1:]  # the first round warms connections


def measure(node_counts=NODE_COUNTS, rounds: int = ROUNDS) -> dict:
    rows = []
    for n in node_counts:
        times = _round_ms(n, rounds)
        median = statistics.median(times)
        amortized = {str(a): (median if a == 0 else median / (a * RATE_PER_S)) for a in MAX_AGES_S}
        rows.append(
            {
                "nodes": n,
                "round_ms_median": median,
                "round_ms_p90": sorted(times)[int(0.9 * len(times))],
                "per_request_ms_by_max_age_s": amortized,
            }
        )
    return {"benchmark": "attestation_freshness", "rounds": rounds, "rate_per_s": RATE_PER_S, "rows": rows}


def print_report(report: dict) -> None:
    ages = "".join(f"{f'max_age {a:g}s':>16}" for a in MAX_AGES_S)
    print(
        f"\nattestation freshness: added latency per request (ms) at {report['rate_per_s']:g} request/s "
        "(max_age 0 = a nonce per request)"
    )
    print(f"{'nodes':>6}{'round p50':>11}{'round p90':>11}{ages}")
    for r in report["rows"]:
        cells = "".join(f"{r['per_request_ms_by_max_age_s'][str(a)]:>16.3f}" for a in MAX_AGES_S)
        print(f"{r['nodes']:>6}{r['round_ms_median']:>11.2f}{r['round_ms_p90']:>11.2f}{cells}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m traceless_tools.audit.attestation_freshness")
    parser.add_argument("--json", default=None)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    report = measure(rounds=args.rounds)
    print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
