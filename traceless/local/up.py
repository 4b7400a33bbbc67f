"""`traceless up`: the whole private path on loopback, each component its own process.

Order: transparency log (this installation's release appended: its manifest, allowing the
capacities given) -> issuer (a demo API key) -> gateway -> relay -> nodes -> proxy. Each node prints
its attester public key; the proxy trusts exactly those keys and the log's key. Attestation is the
software attester's, so the gateway and the proxy run under the explicit DEVELOPMENT attester
policy, and `up` says so. Services write their event logs (content-free by
construction) to STATE/logs/. Ctrl-C stops everything; a temporary state directory is removed.
"""
from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from traceless.local.processes import StartupError, free_port, stop, wait_ready
from traceless.private_files import write_private

READY_TIMEOUT_S = 180.0


@dataclass(frozen=True, slots=True)
class UpOptions:
    capacities: list[int]
    port: int
    state_dir: str | None
    node_args: list[str]


class Deployment:
    def __init__(self, opts: UpOptions):
        self.opts = opts
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.state = Path(opts.state_dir) if opts.state_dir else Path(tempfile.mkdtemp(prefix="traceless-up-"))
        self.temporary = opts.state_dir is None
        self.logs = self.state / "logs"
        self.node_metrics: list[str] = []  # each node's operator (metrics) listener

    def link(self, target: str, url: str) -> str:
        """The URL a service's clients use to reach `target` (the service itself; tests put a
        recording tap in between)."""
        return url

    # --- processes ------------------------------------------------------------------------------
    def spawn(self, name: str, *argv: str) -> subprocess.Popen:
        out = open(self.logs / f"{name}.out", "wb")
        err = open(self.logs / f"{name}.log", "wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "traceless.cli", *argv], stdout=out, stderr=err, env=env,
                                start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def wait_ready(self, name: str, proc: subprocess.Popen, url: str) -> None:
        wait_ready(proc, url, READY_TIMEOUT_S, f"{name} (log: {self.logs / (name + '.log')})")

    def printed(self, name: str, proc: subprocess.Popen, key: str) -> str:
        """A `key: value` line a process prints on stdout at startup."""
        path = self.logs / f"{name}.out"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for line in path.read_text().splitlines():
                if line.startswith(key + ": "):
                    return line.split(": ", 1)[1].strip()
            if proc.poll() is not None:
                raise StartupError(f"{name} exited during startup (see {self.logs / (name + '.log')})")
            time.sleep(0.2)
        raise StartupError(f"{name} did not report its {key}")

    def stop(self) -> None:
        for _, proc in reversed(self.procs):  # signal all first, so they shut down in parallel
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
        for _, proc in reversed(self.procs):
            stop(proc, timeout=20)

    # --- the deployment -------------------------------------------------------------------------
    def _log(self) -> tuple[str, str]:
        from traceless.cli.node import node_measured_config, node_parser
        from traceless.model.loader import resolve_model_path
        from traceless.privacy.attestation.measurement import measure
        from traceless.privacy.translog.log import TransparencyLog
        from traceless.privacy.translog.manifest import ReleaseManifest

        node_ns = node_parser().parse_args(self.opts.node_args)
        config = node_measured_config(node_ns)
        measured = measure(resolve_model_path(node_ns.model), config)
        release = ReleaseManifest(measured.code, measured.model, config, tuple(sorted(set(self.opts.capacities))))
        log = TransparencyLog.open_or_create(self.state / "log")
        if log.leaf_index(_leaf_hash(release.encode())) is None:
            log.append(release.encode())
        self.measurement = measured.combined.hex()
        port = free_port()
        proc = self.spawn("log", "log", "serve", "--dir", str(self.state / "log"), "--port", str(port))
        url = f"http://127.0.0.1:{port}"
        self.wait_ready("log", proc, url + "/log/v1/sth")
        return url, base64.b64encode(log.public_key_bytes()).decode()

    def _service(self, name: str, ready_path: str, *argv: str) -> str:
        port = free_port()
        proc = self.spawn(name, name, *argv, "--port", str(port))
        url = f"http://127.0.0.1:{port}"
        self.wait_ready(name, proc, url + ready_path)
        return url

    def _nodes(self, gateway: str, log: tuple[str, str]) -> tuple[list[str], list[str], str]:
        started = []
        for i, cap in enumerate(self.opts.capacities):
            port, metrics_port = free_port(), free_port()
            name = f"node{i}"
            url = f"http://127.0.0.1:{port}"
            self.node_metrics.append(f"http://127.0.0.1:{metrics_port}")  # the operator's listener
            proc = self.spawn(name, "node", *self.opts.node_args, "--port", str(port), "--gateway", gateway,
                              "--metrics-port", str(metrics_port),
                              "--capacity", str(cap), "--register-interval", "30",
                              "--log", log[0], "--log-public-key", log[1],
                              "--public-url", self.link(name, url))
            started.append((name, proc, url))
        keys = []
        for name, proc, url in started:
            keys.append(self.printed(name, proc, "attester-public-key"))
            if self.printed(name, proc, "measurement") != self.measurement:
                raise StartupError(f"{name} measures differently from the release in the log")
            self.wait_ready(name, proc, url + "/health")
        model = self.printed(started[0][0], started[0][1], "model")
        return [u for _, _, u in started], keys, model

    def _wait_registered(self, gateway: str, model: str) -> None:
        n = len(self.opts.capacities)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            r = httpx.get(gateway + "/pcc/v1/nodes", params={"model": model, "k": n}, timeout=5)
            if r.status_code == 200 and len(r.json().get("nodes", [])) == n:
                return
            time.sleep(0.3)
        raise StartupError("the nodes did not register with the gateway")

    def start(self) -> dict:
        self.logs.mkdir(parents=True, exist_ok=True)
        log_url, log_key = self._log()
        api_key = secrets.token_urlsafe(24)
        keys_file, key_file = self.state / "api-keys.json", self.state / "api-key"
        for path, text in ((keys_file, json.dumps({api_key: "demo-user"})), (key_file, api_key)):
            write_private(path, text)
        issuer = self._service("issuer", "/token-issuer-directory", "--api-keys", str(keys_file))
        print("traceless up: DEVELOPMENT attester policy (software attester: it proves nothing about the code "
              "a node runs; production refuses it)", file=sys.stderr, flush=True)
        gateway = self._service("gateway", "/pcc/v1/challenge", "--issuer", issuer, "--log", log_url,
                                "--log-public-key", log_key, "--attester-policy", "development")
        relay = self._service("relay", "/pcc/v1/challenge", "--gateway", self.link("gateway", gateway))
        nodes, attester_keys, model = self._nodes(gateway, (log_url, log_key))
        self._wait_registered(gateway, model)
        proxy_args = ["--issuer", issuer, "--api-key-file", str(key_file), "--relay", self.link("relay", relay),
                      "--log", log_url,
                      "--log-public-key", log_key, "--model", model, "--port", str(self.opts.port),
                      "--attester-policy", "development"]
        for k in attester_keys:
            proxy_args += ["--attester-key", k]
        proc = self.spawn("proxy", "proxy", *proxy_args)
        proxy = f"http://127.0.0.1:{self.opts.port}"
        self.wait_ready("proxy", proc, proxy + "/health")
        endpoints = {"log": log_url, "issuer": issuer, "relay": relay, "gateway": gateway, "proxy": proxy,
                     "nodes": nodes, "node_metrics": self.node_metrics, "api_key": api_key, "model": model,
                     "log_public_key": log_key,
                     "attester_keys": attester_keys, "measurement": self.measurement}
        write_private(self.state / "endpoints.json", json.dumps(endpoints, indent=2) + "\n")  # holds the API key
        return endpoints

    def run(self) -> None:
        try:
            endpoints = self.start()
            _print_endpoints(endpoints, self.state)
            while all(p.poll() is None for _, p in self.procs):
                time.sleep(0.5)
            dead = [n for n, p in self.procs if p.poll() is not None]
            print(f"traceless up: {', '.join(dead)} stopped; shutting down", file=sys.stderr)
        except KeyboardInterrupt:
            print("\ntraceless up: stopping", file=sys.stderr)
        except StartupError as exc:
            print(f"traceless up: {exc}", file=sys.stderr)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # let the shutdown finish
                signal.signal(sig, signal.SIG_IGN)
            self.stop()
            if self.temporary:
                shutil.rmtree(self.state, ignore_errors=True)


def _leaf_hash(leaf: bytes) -> bytes:
    from traceless.privacy.translog.merkle import leaf_hash

    return leaf_hash(leaf)


def _print_endpoints(e: dict, state: Path) -> None:
    print("traceless up: the private path is running on loopback\n")
    for key in ("proxy", "relay", "gateway", "issuer", "log"):
        print(f"  {key:<8} {e[key]}")
    for i, url in enumerate(e["nodes"]):
        print(f"  node{i:<4} {url}")
    print(f"\n  endpoints: {state / 'endpoints.json'}   model: {e['model']}\n")
    body = json.dumps({"model": e["model"], "messages": [{"role": "user", "content": "Hello!"}]})
    print(f"  curl -s {e['proxy']}/v1/chat/completions -H 'content-type: application/json' -d '{body}'\n")
    print("Ctrl-C stops everything.", flush=True)
