"""`traceless up --netns`: the private path across real hosts. Every component in its own network
namespace with its own address, so every hop crosses a real interface: the openai client works
through it, a capture on the relay's interface holds only ciphertext (the record sizes listed in
the output, checked against wire_sizes.py once documented), and a node whose host vanishes
mid-stream gives the client a clean error while the other node serves on. Skips, saying why,
where this process cannot create namespaces (not root)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_tiny_model
from tests.local import wire_sizes
from tests.local.capture import Capture, exchanges, response_records
from traceless.errors import ModelNotFoundError
from traceless_tools.local import netns
from traceless_tools.local.netns_up import PORTS, NetnsDeployment
from traceless_tools.local.processes import free_port
from traceless_tools.local.up import UpOptions

_ok, _why = netns.available()
pytestmark = pytest.mark.skipif(not _ok, reason=_why or "network namespaces available")

# User content never seen as such outside the user's machine and the node (the JSON of a request
# or a response); the listing of nodes (public attestations and keys) is JSON by design.
CONTENT_MARKERS = (
    b'"messages"',
    b'"prompt"',
    b'"choices"',
    b'"content"',
    b"chat.completion",
    b"text_completion",
    b"data: {",
)
RELAY_ROUTES = ("GET /pcc/v1/nodes?", "GET /pcc/v1/challenge ", "POST /pcc/v1/ohttp/")


@dataclass
class Up:
    """`traceless up --netns` as a user runs it: the process, its state directory, its endpoints."""

    proc: subprocess.Popen
    state: Path
    endpoints: dict = field(default_factory=dict)

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    def namespaces(self) -> list[str]:
        """This run's namespaces that exist now."""
        tag = self.endpoints["bridge"].rsplit("-", 1)[0] + "-"
        return sorted(n for n in os.listdir(netns.NETNS_DIR) if n.startswith(tag))

    def kill_host(self, role: str) -> None:
        """What docs/deploy.md says: unplug the role's link at the bridge, kill what runs in its
        namespace, delete the namespace."""
        space = self.endpoints["namespaces"][role]
        _ip("-n", self.endpoints["bridge"], "link", "del", space["link"])
        for pid in _ip("netns", "pids", space["namespace"]).split():
            os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "delete", space["namespace"])


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    model = make_tiny_model(tmp_path_factory.mktemp("tiny-long"), max_position_embeddings=4096)
    state = tmp_path_factory.mktemp("up-netns") / "state"
    out = open(state.parent / "up.out", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "traceless_tools.cli",
            "up",
            "--netns",
            "--nodes",
            "2",
            "--port",
            str(free_port()),
            "--state-dir",
            str(state),
            "--node-args",
            f"--model {model} --dtype float32 --kv-cache-memory 64MiB",
            "--gateway-args",
            "--health-interval 1 --unhealthy-after 2",
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    up = Up(proc, state)
    try:
        deadline = time.monotonic() + 180
        while not (state / "endpoints.json").exists() or "namespaces" not in (state / "endpoints.json").read_text():
            assert proc.poll() is None, (state.parent / "up.out").read_text()
            assert time.monotonic() < deadline, "traceless up --netns did not start"
            time.sleep(0.5)
        up.endpoints = json.loads((state / "endpoints.json").read_text())
        yield up
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        out.close()
        if up.endpoints:  # whatever a failed run left behind, so that CI does not accumulate it
            for ns in up.namespaces():
                subprocess.run(["ip", "netns", "delete", ns], capture_output=True)


def _openai(d):
    from openai import OpenAI

    return OpenAI(base_url=d.endpoints["proxy"] + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_every_component_has_a_host_of_its_own_and_the_openai_client_works(deployment):
    e = deployment.endpoints
    spaces = e["namespaces"]
    assert set(spaces) == {"log", "witness", "issuer", "gateway", "relay", "node0", "node1", "proxy"}
    assert len({s["address"] for s in spaces.values()}) == 8 and set(deployment.namespaces()) == {
        s["namespace"] for s in spaces.values()
    } | {e["bridge"]}
    for role in ("relay", "gateway", "node0"):
        assert f"//{spaces[role]['address']}:" in (e[role] if role != "node0" else e["nodes"][0])
    assert not _host_reaches_the_gateway(spaces["gateway"]["address"])  # it is on a host of its own
    client = _openai(deployment)
    assert [m.id for m in client.models.list().data] == [e["model"]]
    got = client.chat.completions.create(
        model=e["model"], messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0
    )
    assert got.choices[0].message.content and got.usage.completion_tokens == 8
    streamed = [
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=e["model"], messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0, stream=True
        )
        if c.choices
    ]
    assert "".join(streamed) == got.choices[0].message.content


def _host_reaches_the_gateway(address: str) -> bool:
    """Whether this (the host's) namespace gets the gateway's token challenge at its address (some
    sandboxes answer every outbound address themselves: any other answer is not the gateway)."""
    try:
        r = httpx.get(f"http://{address}:{PORTS['gateway']}/pcc/v1/challenge", timeout=2)
    except httpx.TransportError:
        return False
    return "privatetoken" in r.headers.get("www-authenticate", "").lower()


def _complete(frames: list[bytes], port: int) -> bool:
    posts = [res for req, res in exchanges(frames, port) if req.start_line.startswith("POST")]
    return len(posts) == 2 and all(res is not None and res.complete for res in posts)


def test_the_relays_interface_carries_only_ciphertext(deployment, capsys):
    e = deployment.endpoints
    canary = f"CANARY-{uuid.uuid4().hex[:16]}"
    capture = Capture(e["namespaces"]["relay"]["namespace"])
    client = _openai(deployment)
    try:
        answer = (
            client.chat.completions.create(
                model=e["model"],
                messages=[{"role": "user", "content": f"Repeat exactly: {canary}"}],
                max_tokens=32,
                temperature=0,
            )
            .choices[0]
            .message.content
        )
        streamed = "".join(
            c.choices[0].text
            for c in client.completions.create(
                model=e["model"], prompt=f"Say {canary} again", max_tokens=32, temperature=0, stream=True
            )
            if c.choices
        )
        # The SDK stops at [DONE]; the shaped stream runs on to its budget (the client reads it to the
        # end so the hops never see where the answer ended): wait for the relay to pass all of it.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _complete(list(capture.frames), PORTS["relay"]):
            time.sleep(0.5)
    finally:
        capture.stop()
    assert capture.dropped == 0 and capture.frames

    raw = capture.raw()
    needles = [canary.encode(), canary[7:].encode(), *CONTENT_MARKERS]
    needles += [t.strip().encode() for t in (answer, streamed) if len(t.strip()) >= 12]
    assert [n for n in needles if n in raw] == []

    relay = f"{e['namespaces']['relay']['address']}"
    seen = {
        "from_proxy": exchanges(capture.frames, PORTS["relay"]),
        "to_gateway": exchanges(capture.frames, PORTS["gateway"]),
    }
    assert all(seen.values()), "both hops of the relay were captured"
    sizes: dict[str, dict[str, list]] = {}
    for hop, pairs in seen.items():
        posts = [(req, res) for req, res in pairs if req.start_line.startswith("POST")]
        assert len(posts) == 2, hop  # the two calls above, nothing else
        for req, res in pairs:
            assert req.start_line.startswith(RELAY_ROUTES), (hop, req.start_line)
            assert res is not None and res.complete, (hop, req.start_line)
        for req, res in posts:
            assert req.headers["content-type"] in ("message/ohttp-req", "message/ohttp-chunked-req")
            assert res.headers["content-type"] in ("message/ohttp-res", "message/ohttp-chunked-res")
            for body in (req.body, res.body):
                with pytest.raises(ValueError):
                    json.loads(body)
            hop_sizes = sizes.setdefault(hop, {"requests": [], "responses": []})
            hop_sizes["requests"].append(len(req.body))
            hop_sizes["responses"].append(response_records(req.body, res))
    assert sizes["from_proxy"] == sizes["to_gateway"]  # the relay passes the ciphertext on unchanged
    with capsys.disabled():
        print(
            f"\n[netns] relay {relay} eth0: {len(capture.frames)} frames; encapsulated request bodies "
            f"{sizes['from_proxy']['requests']} bytes; response records {sizes['from_proxy']['responses']} bytes"
        )
    if wire_sizes.REQUEST_BUCKETS is not None:
        assert set(sizes["from_proxy"]["requests"]) <= set(wire_sizes.REQUEST_BUCKETS)
    if wire_sizes.RESPONSE_BUCKETS is not None:
        records = [r for rs in sizes["from_proxy"]["responses"] for r in rs]
        assert set(records) <= set(wire_sizes.RESPONSE_BUCKETS)


def test_killing_a_nodes_namespace_mid_stream_fails_cleanly_and_the_other_node_serves(deployment):
    from openai import APIError, APITimeoutError

    e = deployment.endpoints
    nodes = ("node0", "node1")
    captures = {n: Capture(e["namespaces"][n]["namespace"]) for n in nodes}
    client = _openai(deployment)
    try:
        stream = client.completions.create(
            model=e["model"],
            prompt="Once upon a time",
            max_tokens=3000,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        it = iter(stream)
        next(it)
        deadline = time.monotonic() + 5
        while not (serving := [n for n, c in captures.items() if c.saw(b"POST /pcc/v1/ohttp")]):
            assert time.monotonic() < deadline, "no node's interface saw the request"
            time.sleep(0.05)
    finally:
        for c in captures.values():
            c.stop()
    assert len(serving) == 1
    deployment.kill_host(serving[0])
    killed = time.monotonic()
    assert e["namespaces"][serving[0]]["namespace"] not in deployment.namespaces()
    with pytest.raises(APIError) as failure:
        for _ in it:
            pass
    assert not isinstance(failure.value, APITimeoutError)
    assert "private path could not complete" in str(failure.value)
    waited = time.monotonic() - killed
    assert waited < 30, waited  # the gateway cut the stream when it dropped the node: no read timeout
    gateway_log = (deployment.logs / "gateway.log").read_text()
    assert '"event":"gateway.streams_cut"' in gateway_log
    for _ in range(3):  # a fresh round of attestations: the other node serves
        # greedy and past EOS: a sampled first token may be EOS, an empty answer that proves nothing
        out = client.completions.create(
            model=e["model"], prompt="Hello", max_tokens=3, temperature=0, extra_body={"ignore_eos": True}
        )
        assert out.choices[0].text
    for path in deployment.state.rglob("*"):  # no request data on disk
        if path.is_file():
            assert b"Once upon a time" not in path.read_bytes(), path


def test_zz_stopping_up_removes_every_namespace(deployment):
    assert deployment.proc.poll() is None and len(deployment.namespaces()) == 8  # one host is gone
    deployment.proc.send_signal(signal.SIGTERM)
    assert deployment.proc.wait(timeout=60) == 0
    assert deployment.namespaces() == []
    with pytest.raises(httpx.TransportError):
        httpx.get(deployment.endpoints["proxy"] + "/health", timeout=2)


def test_the_topology_links_namespaces_and_a_failed_start_leaves_nothing(tmp_path):
    import socket

    topo = netns.Topology(["a", "b"])
    topo.create()
    try:
        with netns.entered(topo.namespace("a")):
            server = socket.create_server((topo.addresses["a"], 9000))
        with netns.entered(topo.namespace("b")):
            peer = socket.create_connection((topo.addresses["a"], 9000), timeout=5)
        conn, (address, _) = server.accept()
        assert address == topo.addresses["b"]  # across the bridge, from b's own address
        for s in (conn, peer, server):
            s.close()
        with netns.entered(topo.namespace("a")):  # loopback inside a, forwarded from the host's loopback
            inner = socket.create_server(("127.0.0.1", 9001))
        forward = netns.PortForward(free_port(), topo.namespace("a"), 9001)
        try:
            outer = socket.create_connection(("127.0.0.1", forward.port), timeout=5)
            conn, _ = inner.accept()
            outer.sendall(b"ping" * 50_000)
            got = b""
            while len(got) < 200_000:
                got += conn.recv(65536)
            conn.sendall(b"pong")
            conn.close()
            assert got == b"ping" * 50_000 and outer.recv(16) == b"pong" and outer.recv(16) == b""  # then EOF
            outer.close()
        finally:
            forward.close()
            inner.close()
        topo.unplug("b")
        with netns.entered(topo.namespace("b")), pytest.raises(OSError):
            socket.create_connection((topo.addresses["a"], 9000), timeout=1)
    finally:
        topo.destroy()
    assert topo.exists() == []

    broken = netns.Topology(["a", "b/c"])  # not a namespace name: creation fails half-way
    with pytest.raises(netns.NetnsError):
        broken.create()
    assert broken.exists() == []

    d = NetnsDeployment(UpOptions([1], free_port(), str(tmp_path / "state"), ["--model", str(tmp_path / "absent")]))
    with pytest.raises(ModelNotFoundError):  # after the namespaces were made
        d.start()
    assert d.topology.exists() == []
