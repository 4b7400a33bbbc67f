"""Test helpers: run the log service on a free loopback port (real HTTP), forge a log's history."""
import json
import socket
import threading
import time
from contextlib import contextmanager

from cryptography.hazmat.primitives import serialization

from traceless.cluster.log_service import build_server
from traceless.privacy import translog as tl
from traceless.privacy.merkle import leaf_hash, merkle_tree_hash
from traceless.privacy.tree_head import sign_tree_head


@contextmanager
def running_log_service(log_dir):
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that name it, and
    # without it each response waits ~40 ms on Nagle's algorithm and delayed ACKs.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = build_server(log_dir)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("log service did not start")
            time.sleep(0.005)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def rewrite_history(directory, leaves):
    """What a log operator holding the key could do: replace the history and re-sign it."""
    key = serialization.load_pem_private_key((directory / tl.SIGNING_KEY).read_bytes(), None)
    records = b"".join(len(x).to_bytes(4, "big") + x + leaf_hash(x) for x in leaves)
    (directory / tl.ENTRIES).write_bytes(tl.MAGIC + records)
    old = json.loads((directory / tl.STH).read_text())
    sth = sign_tree_head(key, len(leaves), old["timestamp"] + 1, merkle_tree_hash(leaves))
    (directory / tl.STH).write_text(json.dumps(sth.to_json()))
