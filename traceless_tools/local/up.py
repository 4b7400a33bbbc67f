"""`traceless up`: the whole private path on loopback, each component its own process.

Order: transparency log (this installation's release appended: its manifest, allowing the
capacities given) and its witness (own key, cosigns every WITNESS_INTERVAL_S) -> issuer (a demo
API key; its token key appended to the log) -> gateway -> relay -> nodes -> proxy. Each node prints
its attester public key, kept in STATE/nodeN/attester.key so that a restarted node is still
trusted; the proxy trusts exactly those keys, the log's key and the witness's key
(and keeps its last verified tree head in STATE/proxy). Attestation is the
software attester's, so the gateway and the proxy run under the explicit DEVELOPMENT attester
policy, and `up` says so. Services write their event logs (content-free by
construction) to STATE/logs/. Ctrl-C stops everything; a temporary state directory is removed.

While it runs, `up` supervises (supervisor.py): a service that stops is started again, same
command line and address, after a backoff, while the others serve on; a node that comes back
registers again and keeps its attester key. Every service gets the kernel's parent-death signal
(processes.die_with_parent): if `up` itself is killed, even with `kill -9`, they stop too. Exit
status: 0 after Ctrl-C or a signal, 1 when the deployment could not start or a service kept failing.
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
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import httpx

from traceless.private_files import write_private
from traceless_tools.local.processes import StartupError, die_with_parent, free_port, stop, wait_ready
from traceless_tools.local.supervisor import GaveUp, Supervisor

READY_TIMEOUT_S = 180.0
WITNESS_INTERVAL_S = 2.0
REGISTER_INTERVAL_S = 10.0  # how soon nodes are listed again after a gateway restart
ISSUER_KEY_VALIDITY_S = 30 * 86400


@dataclass(frozen=True, slots=True)
class UpOptions:
    capacities: list[int]
    port: int
    state_dir: str | None
    node_args: list[str]
    gateway_args: tuple[str, ...] = ()  # extra options for the gateway (tests: faster health checks)


class Deployment:
    def __init__(self, opts: UpOptions):
        self.opts = opts
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.argv: dict[str, list[str]] = {}  # each service's command line, to start it again
        self.state = Path(opts.state_dir) if opts.state_dir else Path(tempfile.mkdtemp(prefix="traceless-up-"))
        self.temporary = opts.state_dir is None
        self.logs = self.state / "logs"
        self.node_metrics: list[str] = []  # each node's operator (metrics) listener
        self.where = "on loopback"

    # --- placement (`--netns` overrides these: netns_up.py) -----------------------------------------
    def place(self, name: str, listener: str = "public") -> tuple[str, int]:
        """(host, port) that `name`'s `listener` ("public" or "metrics") binds."""
        if name == "proxy":
            return "127.0.0.1", self.opts.port
        return "127.0.0.1", free_port()

    def command(self, name: str, argv: list[str]) -> list[str]:
        """How `name`'s process is started."""
        return argv

    def reach(self, name: str) -> AbstractContextManager:
        """Where this process stands while it checks on `name` (its readiness, its registrations)."""
        return nullcontext()

    def expose(self, name: str, url: str) -> str:
        """The URL the user is given for `name` (the proxy)."""
        return url

    def link(self, target: str, url: str) -> str:
        """The URL a service's clients use to reach `target` (the service itself; tests put a
        recording tap in between)."""
        return url

    # --- processes ------------------------------------------------------------------------------
    def spawn(self, name: str, *argv: str) -> subprocess.Popen:
        self.argv[name] = list(argv)
        # Appended to: a restarted service's output follows its earlier runs'.
        with open(self.logs / f"{name}.out", "ab") as out, open(self.logs / f"{name}.log", "ab") as err:
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            cli = [sys.executable, "-m", "traceless_tools.cli", *argv]
            proc = subprocess.Popen(
                self.command(name, cli),
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        self.procs = [(n, p) for n, p in self.procs if n != name] + [(name, proc)]
        return proc

    def respawn(self, name: str) -> subprocess.Popen:
        """Start a service again with the command line it was first started with."""
        return self.spawn(name, *self.argv[name])

    def wait_ready(self, name: str, proc: subprocess.Popen, url: str) -> None:
        with self.reach(name):
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
    def _witness(self, log_url: str, log_key: str, witness_key: str) -> None:
        """Start the witness and wait until the log serves its cosignature."""
        self.witness_proc = self.spawn(
            "witness",
            "log",
            "witness",
            "--log",
            log_url,
            "--log-public-key",
            log_key,
            "--dir",
            str(self.state / "witness"),
            "--interval",
            str(WITNESS_INTERVAL_S),
        )
        if self.printed("witness", self.witness_proc, "witness-public-key") != witness_key:
            raise StartupError("the witness runs with another key than the one the log was given")
        self._wait_cosigned(log_url, 0)

    def _wait_cosigned(self, log_url: str, tree_size: int) -> None:
        """Wait until the log serves a witness cosignature of a head of at least `tree_size` leaves."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            with self.reach("log"):
                r = httpx.get(log_url + "/log/v1/sth/cosigned", timeout=5)
            body = r.json() if r.status_code == 200 else {}
            if body.get("cosignatures") and body["sth"]["tree_size"] >= tree_size:
                return
            if self.witness_proc.poll() is not None:
                break
            time.sleep(0.2)
        raise StartupError(f"the witness did not cosign the log's tree head (log: {self.logs / 'witness.log'})")

    def _log_issuer_key(self, issuer: str, log_url: str) -> None:
        """Publish the issuer's token key in the log (wallets use only logged keys); wait for the witness."""
        from traceless.privacy.translog.log import TransparencyLog
        from traceless.privacy.translog.manifest import IssuerKeyEntry
        from traceless_tools.cluster.issuer_directory import fetch_issuer_keys, issuer_name

        now = int(time.time())
        log = TransparencyLog.open(self.state / "log")
        with self.reach("issuer"):
            keys = fetch_issuer_keys(issuer)
        for key in keys:
            entry = IssuerKeyEntry(issuer_name(issuer), key.spki, now - 60, now + ISSUER_KEY_VALIDITY_S)
            if log.leaf_index(_leaf_hash(entry.encode())) is None:
                log.append(entry.encode())
        self._wait_cosigned(log_url, log.tree_size)

    def _log(self) -> tuple[str, str]:
        from traceless.cli.node import node_measured_config, node_parser
        from traceless.model.loader import resolve_model_path
        from traceless.privacy.attestation.measurement import measure
        from traceless.privacy.translog.log import TransparencyLog
        from traceless.privacy.translog.manifest import ReleaseManifest
        from traceless.privacy.translog.witness import Witness

        node_ns = node_parser().parse_args(self.opts.node_args)
        config = node_measured_config(node_ns)
        measured = measure(resolve_model_path(node_ns.model), config)
        release = ReleaseManifest(measured.code, measured.model, config, tuple(sorted(set(self.opts.capacities))))
        log = TransparencyLog.open_or_create(self.state / "log")
        if log.leaf_index(_leaf_hash(release.encode())) is None:
            log.append(release.encode())
        self.measurement = measured.combined.hex()
        self.release_config = config
        log_key = base64.b64encode(log.public_key_bytes()).decode()
        # The witness's key is made (or loaded) here so the log can be told to take its cosignatures.
        self.witness_key = Witness(self.state / "witness", log.public_key_bytes()).public_key_b64()
        host, port = self.place("log")
        proc = self.spawn(
            "log",
            "log",
            "serve",
            "--dir",
            str(self.state / "log"),
            "--host",
            host,
            "--port",
            str(port),
            "--witness-key",
            self.witness_key,
        )
        url = f"http://{host}:{port}"
        self.wait_ready("log", proc, url + "/log/v1/sth")
        self._witness(url, log_key, self.witness_key)
        return url, log_key

    def _release_waivers(self) -> list[str]:
        """The proxy's benchmark-only release-policy waivers that these nodes' settings need (none for
        a padded, real-weight, event-free node); refuses node settings no waiver covers."""
        from traceless.privacy.translog.release_policy import ReleasePolicy as Policy
        from traceless.privacy.translog.release_policy import ReleaseRefusedError, check_release

        policy = Policy.waiving_for(self.release_config)
        try:
            check_release(policy, self.release_config)
        except ReleaseRefusedError as exc:
            raise StartupError(f"the proxy would refuse these nodes: {exc}") from None
        flags = {
            "unpadded": "--allow-unpadded-releases",
            "request_events": "--allow-request-events-releases",
            "dummy_weights": "--allow-dummy-weights-releases",
        }
        self.release_waivers = list(policy.waivers)
        for waiver in policy.waivers:
            print(
                f"traceless up: BENCHMARK-ONLY: the nodes' settings need the release-policy waiver '{waiver}', "
                f"so the proxy is started with {flags[waiver]}",
                file=sys.stderr,
                flush=True,
            )
        return [flags[w] for w in policy.waivers]

    def _service(self, name: str, ready_path: str, *argv: str) -> str:
        host, port = self.place(name)
        proc = self.spawn(name, name, *argv, "--host", host, "--port", str(port))
        url = f"http://{host}:{port}"
        self.wait_ready(name, proc, url + ready_path)
        return url

    def _nodes(self, gateway: str, log: tuple[str, str]) -> tuple[list[str], list[str], str]:
        started = []
        for i, cap in enumerate(self.opts.capacities):
            name = f"node{i}"
            (host, port), (metrics_host, metrics_port) = self.place(name), self.place(name, "metrics")
            url = f"http://{host}:{port}"
            self.node_metrics.append(f"http://{metrics_host}:{metrics_port}")  # the operator's listener
            proc = self.spawn(
                name,
                "node",
                *self.opts.node_args,
                "--host",
                host,
                "--port",
                str(port),
                "--gateway",
                gateway,
                "--metrics-host",
                metrics_host,
                "--metrics-port",
                str(metrics_port),
                "--capacity",
                str(cap),
                "--register-interval",
                str(REGISTER_INTERVAL_S),
                "--attester-key-file",
                str(self.state / name / "attester.key"),
                "--log",
                log[0],
                "--log-public-key",
                log[1],
                "--public-url",
                self.link(name, url),
            )
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
            with self.reach("gateway"):
                r = httpx.get(gateway + "/pcc/v1/nodes", params={"model": model, "k": n}, timeout=5)
            if r.status_code == 200 and len(r.json().get("nodes", [])) == n:
                return
            time.sleep(0.3)
        raise StartupError("the nodes did not register with the gateway")

    def start(self) -> dict:
        self.logs.mkdir(parents=True, exist_ok=True)
        log_url, log_key = self._log()
        waivers = self._release_waivers()
        api_key = secrets.token_urlsafe(24)
        keys_file, key_file = self.state / "api-keys.json", self.state / "api-key"
        for path, text in ((keys_file, json.dumps({api_key: "demo-user"})), (key_file, api_key)):
            write_private(path, text)
        issuer = self._service(
            "issuer",
            "/token-issuer-directory",
            "--api-keys",
            str(keys_file),
            "--key-file",
            str(self.state / "issuer-key.pem"),
        )
        self._log_issuer_key(issuer, log_url)
        print(
            "traceless up: DEVELOPMENT attester policy (software attester: it proves nothing about the code "
            "a node runs; production refuses it)",
            file=sys.stderr,
            flush=True,
        )
        gateway = self._service(
            "gateway",
            "/pcc/v1/challenge",
            "--issuer",
            issuer,
            "--log",
            log_url,
            "--log-public-key",
            log_key,
            "--attester-policy",
            "development",
            *self.opts.gateway_args,
        )
        relay = self._service("relay", "/pcc/v1/challenge", "--gateway", self.link("gateway", gateway))
        nodes, attester_keys, model = self._nodes(gateway, (log_url, log_key))
        self._wait_registered(gateway, model)
        proxy_args = [
            *waivers,
            "--issuer",
            issuer,
            "--api-key-file",
            str(key_file),
            "--relay",
            self.link("relay", relay),
            "--log",
            log_url,
            "--log-public-key",
            log_key,
            "--model",
            model,
            "--witness-key",
            self.witness_key,
            "--state-dir",
            str(self.state / "proxy"),
            "--attester-policy",
            "development",
        ]
        host, port = self.place("proxy")
        proxy_args += ["--host", host, "--port", str(port)]
        for k in attester_keys:
            proxy_args += ["--attester-key", k]
        proc = self.spawn("proxy", "proxy", *proxy_args)
        proxy = self.expose("proxy", f"http://{host}:{port}")
        wait_ready(proc, proxy + "/health", READY_TIMEOUT_S, f"proxy (log: {self.logs / 'proxy.log'})")
        endpoints = {
            "log": log_url,
            "issuer": issuer,
            "relay": relay,
            "gateway": gateway,
            "proxy": proxy,
            "nodes": nodes,
            "node_metrics": self.node_metrics,
            "api_key": api_key,
            "model": model,
            "log_public_key": log_key,
            "witness_public_key": self.witness_key,
            "release_waivers": self.release_waivers,
            "attester_keys": attester_keys,
            "measurement": self.measurement,
        }
        write_private(self.state / "endpoints.json", json.dumps(endpoints, indent=2) + "\n")  # holds the API key
        return endpoints

    def supervise(self) -> int:
        """Keep every service running (supervisor.py) until one keeps failing; returns the exit status."""
        supervisor = Supervisor(self.respawn)
        now = time.monotonic()
        for name, proc in self.procs:
            supervisor.watch(name, proc, now)
        while True:
            time.sleep(0.5)
            try:
                happened = supervisor.poll(time.monotonic())
            except GaveUp as exc:
                print(
                    f"traceless up: {exc}; shutting down (log: {self.logs / (exc.name + '.log')})",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
            for name, what in happened:
                print(f"traceless up: {name} {what}", file=sys.stderr, flush=True)

    def run(self) -> int:
        """Start, supervise, stop; returns the exit status: 0 when stopped by Ctrl-C or a signal, 1 when
        a service fails to start or keeps failing (the logs are kept, also in a temporary state
        directory, where the message says)."""
        status = 1
        try:
            endpoints = self.start()
            _print_endpoints(endpoints, self.state, self.where)
            status = self.supervise()
        except KeyboardInterrupt:
            print("\ntraceless up: stopping", file=sys.stderr)
            status = 0
        except StartupError as exc:
            print(f"traceless up: {exc}", file=sys.stderr)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # let the shutdown finish
                signal.signal(sig, signal.SIG_IGN)
            self.stop()
            if self.temporary:
                self._remove_state(keep_logs=status != 0)
        return status

    def _remove_state(self, keep_logs: bool) -> None:
        """Remove the temporary state directory; after a failure keep its logs/ (event logs,
        content-free by construction) for the messages that point there, and drop the rest (keys)."""
        if not keep_logs:
            shutil.rmtree(self.state, ignore_errors=True)
            return
        for entry in self.state.iterdir():
            if entry == self.logs:
                continue
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def _leaf_hash(leaf: bytes) -> bytes:
    from traceless.privacy.translog.merkle import leaf_hash

    return leaf_hash(leaf)


def _print_endpoints(e: dict, state: Path, where: str) -> None:
    print(f"traceless up: the private path is running {where}\n")
    for key in ("proxy", "relay", "gateway", "issuer", "log"):
        print(f"  {key:<8} {e[key]}")
    for i, url in enumerate(e["nodes"]):
        print(f"  node{i:<4} {url}")
    print(f"\n  endpoints: {state / 'endpoints.json'}   model: {e['model']}\n")
    body = json.dumps({"model": e["model"], "messages": [{"role": "user", "content": "Hello!"}]})
    print(f"  curl -s {e['proxy']}/v1/chat/completions -H 'content-type: application/json' -d '{body}'\n")
    print("Ctrl-C stops everything.", flush=True)
