"""Where the private path's extra time goes, for `traceless bench privacy-tax`.

Cheap measurements, each isolating one part of the private path:
  probes     sequential 8-token, 1-output-token requests to each path: the fixed latency the
             private path adds to one request on an otherwise idle system
  hops       round trips the proxy makes before every request (relay -> gateway: the token
             challenge and the candidate nodes), next to a plain loopback HTTP round trip
  crypto     in-process: checking a candidate (attestation signature and key binding; the first
             check also fetches the log's tree head and an inclusion proof) and OHTTP-encapsulating
             a long request
  logs       the services' own event logs: requests that crossed the relay and the gateway,
             tokens issued (batched, so amortized), the engine's own TTFT on each side
  cpu        CPU seconds each process spent per measured request (the benchmark's processes share
             the machine's cores with the engine)
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

HOP_CALLS = 10  # timed calls per hop
PROBE_PROMPT_TOKENS = 8


# --- CPU time per process -----------------------------------------------------------------------------
def _cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all its threads), from /proc; None where there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces: skip past it
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds per process, summed over the segments run on each path."""

    def __init__(self, procs: dict[str, dict]):
        self._procs = procs  # path -> {process name: Popen}
        self._spent = {path: {name: 0.0 for name in names} for path, names in procs.items()}
        self._requests = {path: 0 for path in procs}
        self._available = True

    def _read(self, path: str) -> dict[str, float | None]:
        return {name: _cpu_seconds(p.pid) for name, p in self._procs[path].items()}

    @contextmanager
    def segment(self, path: str, requests: int):
        before = self._read(path)
        yield
        after = self._read(path)
        for name, t0 in before.items():
            t1 = after[name]
            if t0 is None or t1 is None:
                self._available = False
            else:
                self._spent[path][name] += t1 - t0
        self._requests[path] += requests

    def per_request(self) -> dict | None:
        if not self._available:
            return None
        return {
            path: {name: s / max(1, self._requests[path]) for name, s in spent.items()}
            for path, spent in self._spent.items()
        }


# --- live measurements ----------------------------------------------------------------------------------
def _median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _probes(urls: dict[str, str], n: int) -> dict:
    from traceless_tools.bench.privacy_tax import order, run_segment

    prompt = list(range(1_000, 1_000 + PROBE_PROMPT_TOKENS))
    ttft: dict[str, list[float]] = {path: [] for path in urls}
    for rnd in range(2):  # A B, then B A
        for path in order(rnd):
            _, results, _ = run_segment(urls[path], [prompt] * n, 1, 1)
            ttft[path] += [r.ttft_s for r in results if r.ok]
    med = {path: statistics.median(v) * 1e3 if v else float("nan") for path, v in ttft.items()}
    return {"requests_per_path": 2 * n, "ttft_ms": med, "added_ms": med["private"] - med["plain"]}


def _hops(urls: dict[str, str], endpoints: dict) -> dict:
    import httpx

    relay, model = endpoints["relay"], endpoints["model"]
    with httpx.Client(timeout=30) as c:
        return {
            "plain_health_ms": _median_ms(lambda: c.get(urls["plain"] + "/health"), HOP_CALLS),
            "proxy_health_ms": _median_ms(lambda: c.get(urls["private"] + "/health"), HOP_CALLS),
            "relay_challenge_ms": _median_ms(lambda: c.get(relay + "/pcc/v1/challenge"), HOP_CALLS),
            "relay_nodes_ms": _median_ms(
                lambda: c.get(relay + "/pcc/v1/nodes", params={"model": model, "k": 3}), HOP_CALLS
            ),
        }


async def _listing_token(config):
    """One token from a client's own wallet (fetched on its schedule, under the logged issuer key)."""
    from traceless_tools.client.private_client import AsyncPrivateClient

    client = AsyncPrivateClient(config)
    try:
        return await client.wallet.take()
    finally:
        await client.aclose()


def _crypto(endpoints: dict) -> dict:
    import httpx

    from traceless.privacy.attestation.policy import AttesterPolicy
    from traceless.privacy.ohttp.call import encapsulate_call
    from traceless.privacy.privacypass.http import format_authorization
    from traceless.privacy.translog.release_policy import ReleasePolicy
    from traceless_tools.client.node_verifier import NodeVerifier
    from traceless_tools.client.private_client import ClientConfig

    config = ClientConfig(
        issuer_url=endpoints["issuer"],
        api_key=endpoints["api_key"],
        relay_url=endpoints["relay"],
        log_url=endpoints["log"],
        log_public_key=base64.b64decode(endpoints["log_public_key"]),
        attester_keys=tuple(base64.b64decode(k) for k in endpoints["attester_keys"]),
        model=endpoints["model"],
        attester_policy=AttesterPolicy.DEVELOPMENT,  # as `up` runs
        witness_keys=(base64.b64decode(endpoints["witness_public_key"]),),
        release_policy=ReleasePolicy.from_waivers(endpoints["release_waivers"]),
    )  # as `up` runs
    nonce = os.urandom(32)
    token = asyncio.run(_listing_token(config))  # a nonce-bound listing costs a token, as the client pays it
    offered = httpx.get(
        endpoints["relay"] + "/pcc/v1/nodes",
        params={"model": config.model, "k": 3, "nonce": nonce.hex()},
        headers={"authorization": format_authorization(token)},
        timeout=30,
    ).json()["nodes"]
    verifier = NodeVerifier(config)
    try:
        t0 = time.perf_counter()
        verified = verifier.verify_all(offered, nonce)
        first_ms = (time.perf_counter() - t0) * 1e3
        if not verified:
            raise RuntimeError("the benchmark could not verify the deployment's node")
        cached_ms = _median_ms(lambda: verifier.verify_all(offered, nonce), HOP_CALLS)
    finally:
        verifier.close()
    body = json.dumps(
        {"model": config.model, "prompt": list(range(1_000, 2_500)), "max_tokens": 64, "stream": True}
    ).encode()
    # what the client does for each request: encode, pad and encapsulate (privacy/ohttp/call.py)
    encap_ms = _median_ms(
        lambda: encapsulate_call(verified[0].key_config, b"/v1/completions", body, stream=True), HOP_CALLS
    )
    return {"verify_first_ms": first_ms, "verify_cached_ms": cached_ms, "encapsulate_1500_tokens_ms": encap_ms}


def measure(urls: dict[str, str], endpoints: dict, cfg) -> dict:
    """Probes, hops and crypto (after the measured segments, so outside the logs' window)."""
    return {"probes": _probes(urls, cfg.probes), "hops": _hops(urls, endpoints), "crypto": _crypto(endpoints)}


# --- event logs ---------------------------------------------------------------------------------------
def events(path: Path) -> list[dict]:
    """The JSON event lines of a service's log (other output, e.g. tqdm, is skipped)."""
    out = []
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    return out


def _count(evs: list[dict], event: str, **match) -> int:
    return sum(1 for e in evs if e.get("event") == event and all(e.get(k) == v for k, v in match.items()))


def _engine_ttft(evs: list[dict], cfg) -> dict:
    """The engine's own TTFT (arrival in the engine to first token) for the measured requests."""
    from traceless_tools.bench.privacy_tax import CLASSES
    from traceless_tools.bench.serve import percentile

    out = {}
    for name in cfg.classes:
        cls = CLASSES[name]
        done = [e for e in evs if e.get("event") == "request.finished" and e.get("output_tokens") == cfg.output_len]
        t = [e["ttft_s"] for e in done if cls.min_tokens <= e.get("prompt_tokens", 0) <= cls.max_tokens]
        out[name] = {"requests": len(t), "p50_s": percentile(t, 50)}
    return out


def from_logs(workdir: Path, logs: Path, cfg, window: tuple[float, float]) -> dict:
    """Counts and engine timings from the services' event logs, for events inside `window`
    (wall-clock start and end of the measured segments: warm-up and breakdown calls fall outside)."""

    def read(path: Path) -> list[dict]:
        return [e for e in events(path) if window[0] <= e.get("ts", 0) <= window[1]]

    serve, node = read(workdir / "serve.log"), read(logs / "node0.log")
    relay, gateway, issuer = read(logs / "relay.log"), read(logs / "gateway.log"), read(logs / "issuer.log")
    batches = [e["duration_s"] for e in issuer if e.get("event") == "http.request" and e.get("route") == "token_batch"]
    return {
        "evidence": {
            "relay_ohttp_requests": _count(relay, "http.request", route="ohttp", status_code=200),
            "relay_challenge_requests": _count(relay, "http.request", route="challenge"),
            "relay_nodes_requests": _count(relay, "http.request", route="nodes"),
            "gateway_ohttp_requests": _count(gateway, "http.request", route="ohttp", status_code=200),
            "node_requests_finished": _count(node, "request.finished"),
            "serve_requests_finished": _count(serve, "request.finished"),
            "issuer_tokens_issued": sum(e.get("tokens", 0) for e in issuer if e.get("event") == "issuer.issued"),
            "issuer_batch_calls": len(batches),
            "issuer_batch_ms": statistics.median(batches) * 1e3 if batches else float("nan"),
        },
        "engine_ttft": {"plain": _engine_ttft(serve, cfg), "private": _engine_ttft(node, cfg)},
    }
