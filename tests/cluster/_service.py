"""Run the log service on a free loopback port in a thread (real HTTP, no mocks)."""
import socket
import threading
import time
from contextlib import contextmanager

from traceless.cluster.log_service import build_server


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
