"""A TCP forwarder on loopback that records every byte passing through it, both directions."""

from __future__ import annotations

import socket
import threading


class Tap:
    def __init__(self, target_port: int):
        self.target_port = target_port
        self.captured = bytearray()
        self._lock = threading.Lock()
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket):
        # An end of stream is passed on as one (a half close), as TCP does: a server that answers
        # early and half-closes (a lingering close) still reads the rest of the request.
        try:
            while data := src.recv(65536):
                with self._lock:
                    self.captured += data
                dst.sendall(data)
            how = socket.SHUT_WR
        except OSError:
            how = socket.SHUT_RDWR
        for s, direction in ((dst, how), (src, socket.SHUT_RD if how == socket.SHUT_WR else how)):
            try:
                s.shutdown(direction)
            except OSError:
                pass

    def count(self, needle: bytes) -> int:
        with self._lock:
            return self.captured.count(needle)

    def close(self):
        self._server.close()
