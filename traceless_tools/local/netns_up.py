"""`traceless up --netns`: the private path with every component on a host of its own.

The same deployment as `traceless up` (up.py), but the log, issuer, gateway, relay, proxy and
each node run in their own Linux network namespace with their own address (netns.py): every hop
crosses a real network interface (veth -> bridge -> veth), where a capture sees what a network
observer between two hosts would. Each service binds its namespace's address on its standard
port; the proxy binds loopback inside its namespace (the user's machine) and `up` forwards the
host's 127.0.0.1:PORT to it, so the openai client and curl work from the host unchanged. The
nodes' metrics listeners stay on their namespace's loopback (the operator's, on the node's host).

Every namespace, veth and the bridge is removed when `up` stops, however it stops, and when it
fails to start. Needs root.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import AbstractContextManager, nullcontext

from traceless_tools.local.netns import PortForward, Topology, entered
from traceless_tools.local.up import Deployment, UpOptions

PORTS = {"log": 8090, "issuer": 8091, "gateway": 8092, "relay": 8093, "proxy": 8000, "node": 8100}
METRICS_PORT = 9100


class NetnsDeployment(Deployment):
    def __init__(self, opts: UpOptions):
        super().__init__(opts)
        self.nodes = [f"node{i}" for i in range(len(opts.capacities))]
        self.topology = Topology(["log", "witness", "issuer", "gateway", "relay", *self.nodes, "proxy"])
        self.forward: PortForward | None = None
        self.lost: set[str] = set()  # nodes whose process stopped while up ran
        self.where = "in network namespaces, one per component (addresses below are inside them)"

    def place(self, name: str, listener: str = "public") -> tuple[str, int]:
        if name == "proxy":
            return "127.0.0.1", PORTS["proxy"]  # loopback of the user's own machine
        if listener == "metrics":
            return "127.0.0.1", METRICS_PORT
        return self.topology.addresses[name], PORTS["node" if name in self.nodes else name]

    def command(self, name: str, argv: list[str]) -> list[str]:
        return self.topology.command(name, argv)

    def reach(self, name: str) -> AbstractContextManager:
        return entered(self.topology.namespace(name)) if name != "proxy" else nullcontext()

    def expose(self, name: str, url: str) -> str:
        self.forward = PortForward(self.opts.port, self.topology.namespace(name), PORTS[name])
        return f"http://127.0.0.1:{self.opts.port}"

    def running(self) -> bool:
        """Nodes are hosts that may go away (the demonstration: kill one's namespace): the others
        serve on. The deployment stops when every node or any other component stopped."""
        alive = {name: proc.poll() is None for name, proc in self.procs}
        for name in self.nodes:
            if not alive.get(name, True) and name not in self.lost:
                self.lost.add(name)
                print(f"traceless up: {name} stopped; the other nodes serve on", file=sys.stderr, flush=True)
        return all(ok for name, ok in alive.items() if name not in self.nodes) and any(
            alive.get(name, False) for name in self.nodes
        )

    def supervise(self) -> int:
        """Nodes are hosts here (the demonstration takes one away): nothing is restarted; the
        deployment stops when every node or any other component stopped."""
        while self.running():
            time.sleep(0.5)
        dead = [n for n, p in self.procs if p.poll() is not None]
        print(f"traceless up: {', '.join(dead)} stopped; shutting down", file=sys.stderr)
        return 1

    def start(self) -> dict:
        try:
            self.topology.create()
            endpoints = super().start()
        except BaseException:
            self.stop()
            raise
        endpoints["bridge"] = self.topology.bridge  # its port `link` is the other end of a role's eth0
        endpoints["namespaces"] = {
            role: {
                "namespace": self.topology.namespace(role),
                "link": self.topology.links[role],
                "address": self.topology.addresses[role],
            }
            for role in self.topology.roles
        }
        (self.state / "endpoints.json").write_text(json.dumps(endpoints, indent=2) + "\n")
        return endpoints

    def kill_node(self, name: str) -> None:
        """Take a node's host away mid-flight: unplug its link (nothing it had in flight is answered
        or reset), kill its processes and delete its namespace."""
        if name not in self.nodes:
            raise ValueError("not a node of this deployment")
        self.topology.kill(name)

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self.forward is not None:
                self.forward.close()
                self.forward = None
            self.topology.destroy()
