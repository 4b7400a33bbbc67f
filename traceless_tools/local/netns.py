"""Linux network namespaces for `traceless up --netns`: every component on a host of its own.

One namespace per role (`tl-TAG-log`, `tl-TAG-relay`, ...) with one interface, `eth0`, and its
own address on a private /24; each `eth0` is one end of a veth pair whose other end is a port of
the bridge `br0` in a namespace of its own (`tl-TAG-br`). Nothing is added to the host's own
namespace: no interface, no address, no route, so a run cannot collide with the host's network,
and two runs (different random TAGs) cannot collide with each other. Every hop between two
components crosses two veths and the bridge: a real interface, with real frames a capture can see.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN: `ip netns add` mounts under /run/netns).
`available()` says whether this process can, and why not. A thread can enter a namespace
(`entered`): sockets it creates there stay in that namespace after it leaves, which is how the
host's `up` process reaches its services (readiness checks) and forwards the proxy's port.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
PREFIX = "tl-"
SUBNET = ipaddress.ip_network("10.200.0.0/24")  # lives only inside the run's own namespaces


class NetnsError(RuntimeError):
    """A namespace or link could not be set up or entered."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"`ip {args[0]}` could not run ({type(exc).__name__})") from None
    if check and done.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def available() -> tuple[bool, str]:
    """(True, "") where this process can create namespaces; else (False, why not)."""
    if not hasattr(os, "geteuid") or not os.path.exists("/proc/self/ns/net"):
        return False, "network namespaces need Linux"
    if os.geteuid() != 0:
        return False, "network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
    probe = f"{PREFIX}probe-{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
    except NetnsError as exc:
        return False, f"cannot create a network namespace here ({exc})"
    _ip("netns", "delete", probe, check=False)
    return True, ""


_libc = None


def _setns(fd: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise NetnsError(f"setns failed: {os.strerror(ctypes.get_errno())}")


@contextmanager
def entered(name: str) -> Iterator[None]:
    """Run the calling thread in namespace `name` for the block (only this thread; other threads
    are not affected). Sockets created inside stay in `name` for their whole life."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY)
    except OSError:
        os.close(own)
        raise NetnsError(f"no network namespace {name}") from None
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


class Topology:
    """The namespaces of one run: `create()` makes them, `destroy()` removes every one (and with
    them every veth and the bridge), killing whatever still runs inside."""

    def __init__(self, roles: list[str]) -> None:
        if len(set(roles)) != len(roles) or len(roles) > 200:
            raise ValueError("roles must be distinct, at most 200")
        self.tag = secrets.token_hex(3)
        self.bridge = f"{PREFIX}{self.tag}-br"
        hosts = list(SUBNET.hosts())
        self.roles = list(roles)
        self.addresses = {role: str(hosts[10 + i]) for i, role in enumerate(roles)}
        self.links = {role: f"p{i}" for i, role in enumerate(roles)}  # the bridge's end of each veth
        self._made: list[str] = []

    def namespace(self, role: str) -> str:
        return f"{PREFIX}{self.tag}-{role}"

    def create(self) -> None:
        try:
            self._add(self.bridge)
            _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.bridge, "link", "set", "br0", "up")
            for role in self.roles:
                ns, port = self.namespace(role), self.links[role]
                self._add(ns)
                _ip("-n", self.bridge, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("-n", self.bridge, "link", "set", port, "master", "br0", "up")
                _ip("-n", ns, "addr", "add", f"{self.addresses[role]}/{SUBNET.prefixlen}", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.destroy()
            raise

    def _add(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def command(self, role: str, argv: list[str]) -> list[str]:
        """`argv` run inside `role`'s namespace (`ip netns exec` execs it: the pid is argv's)."""
        return ["ip", "netns", "exec", self.namespace(role), *argv]

    def unplug(self, role: str) -> None:
        """Take `role`'s host off the network at once: its veth is deleted, so what it had in flight
        is neither answered nor reset (no FIN, no RST: a host that lost power or its link)."""
        _ip("-n", self.bridge, "link", "del", self.links[role])

    def kill(self, role: str) -> None:
        """Unplug `role`, kill every process in its namespace, and delete the namespace."""
        ns = self.namespace(role)
        if ns not in self._made:
            return
        self.unplug(role)
        self._delete(ns)

    def destroy(self) -> None:
        for ns in reversed(self._made):
            self._delete(ns)

    def _delete(self, ns: str) -> None:
        for _ in range(50):
            pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        _ip("netns", "delete", ns, check=False)
        if ns in self._made:
            self._made.remove(ns)

    def exists(self) -> list[str]:
        """Which of this run's namespaces exist now (for tests of the teardown)."""
        listed = os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else []
        return sorted(n for n in listed if n.startswith(f"{PREFIX}{self.tag}-"))


class PortForward:
    """Listen on the host's 127.0.0.1:`port`; relay each connection to 127.0.0.1:`target` inside
    namespace `ns` (where the proxy binds loopback only, as on a user's own machine)."""

    def __init__(self, port: int, ns: str, target: int) -> None:
        self._ns, self._target = ns, target
        self._listener = socket.create_server(("127.0.0.1", port))
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="traceless-netns-forward", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._listener.getsockname()[1]

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                with entered(self._ns):
                    upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                upstream.settimeout(10)
                upstream.connect(("127.0.0.1", self._target))
                upstream.settimeout(None)
            except (OSError, NetnsError):
                client.close()
                continue
            _Pair(client, upstream)

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self._thread.join(timeout=5)


class _Pair:
    """Two connected sockets pumped both ways; both closed once both directions ended, or at once
    when one side fails. Each direction reads into one buffer of its own, zeroed when it ends."""

    def __init__(self, a: socket.socket, b: socket.socket) -> None:
        self._socks = (a, b)
        self._left = 2
        self._lock = threading.Lock()
        for src, dst in ((a, b), (b, a)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        failed = False
        buf = bytearray(65536)  # the user's plaintext passes through here: one buffer, zeroed at the end
        view = memoryview(buf)
        try:
            while n := src.recv_into(buf):
                dst.sendall(view[:n])
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            failed = True
        finally:
            view.release()
            buf[:] = bytes(len(buf))
        with self._lock:
            self._left -= 1
            done = self._left == 0 or failed
        if done:
            for s in self._socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
