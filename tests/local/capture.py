"""A packet capture for the network-namespace tests, with no tcpdump: an AF_PACKET socket on one
interface of one namespace, TCP streams reassembled by sequence number, and the HTTP/1.1 messages
in them parsed (Content-Length and chunked bodies; a cut-off message is kept as far as it got)."""

from __future__ import annotations

import socket
import struct
import threading
from dataclasses import dataclass, field

from tests.support.ohttp_frames import chunked_ciphertexts
from traceless_tools.local.netns import entered

ETH_P_ALL = 0x0003
SOL_PACKET, PACKET_STATISTICS = 263, 6


class Capture:
    """Every frame that crosses `ifname` in namespace `ns` (both directions), from now to stop()."""

    def __init__(self, ns: str, ifname: str = "eth0") -> None:
        with entered(ns):
            self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 2**20)
        self._sock.bind((ifname, 0))
        self._sock.settimeout(0.1)
        self.frames: list[bytes] = []
        self.dropped = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="capture")
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self.frames.append(self._sock.recv(1 << 18))
            except TimeoutError:
                continue
            except OSError:  # the interface went away
                return

    def stop(self) -> Capture:
        self._stopped.set()
        self._thread.join(timeout=5)
        self._sock.setblocking(False)
        while True:
            try:
                self.frames.append(self._sock.recv(1 << 18))
            except OSError:  # nothing left (BlockingIOError), or the interface went away
                break
        _, self.dropped = struct.unpack("II", self._sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
        self._sock.close()
        return self

    def raw(self) -> bytes:
        return b"".join(self.frames)

    def saw(self, needle: bytes) -> bool:
        return any(needle in f for f in list(self.frames))


Flow = tuple[str, int, str, int]  # source address, port, destination address, port


def tcp_streams(frames: list[bytes]) -> dict[Flow, bytes]:
    """Each direction of each TCP connection in `frames`, its payload in sequence order (a
    segment seen twice, on retransmission, counts once)."""
    segments: dict[Flow, dict[int, bytes]] = {}
    starts: dict[Flow, int] = {}
    for frame in frames:
        if len(frame) < 34 or frame[12:14] != b"\x08\x00":
            continue
        ip = frame[14:]
        ihl, total = (ip[0] & 15) * 4, int.from_bytes(ip[2:4], "big")
        if ip[9] != 6:
            continue
        end = total if ihl < total <= len(ip) else len(ip)  # an offloaded (GSO) frame may say 0
        tcp = ip[ihl:end]
        flow = (
            socket.inet_ntoa(ip[12:16]),
            int.from_bytes(tcp[0:2], "big"),
            socket.inet_ntoa(ip[16:20]),
            int.from_bytes(tcp[2:4], "big"),
        )
        seq, offset, flags = int.from_bytes(tcp[4:8], "big"), (tcp[12] >> 4) * 4, tcp[13]
        if flags & 0x02:  # SYN: data starts one past its sequence number
            starts[flow] = seq + 1
        payload = tcp[offset:]
        if payload:
            segments.setdefault(flow, {}).setdefault(seq, payload)
    streams = {}
    for flow, by_seq in segments.items():
        pos = starts.get(flow, min(by_seq))
        out = bytearray()
        for seq in sorted(by_seq):
            data = by_seq[seq]
            if seq + len(data) <= pos:
                continue
            out += data[max(0, pos - seq) :]
            pos = max(pos, seq + len(data))
        streams[flow] = bytes(out)
    return streams


@dataclass
class Message:
    start_line: str
    headers: dict[str, str]
    body: bytes = b""
    chunks: list[int] = field(default_factory=list)  # the HTTP chunk sizes of a chunked body
    complete: bool = True


def http_messages(data: bytes) -> list[Message]:
    """The HTTP/1.1 messages one direction of a connection carried, in order."""
    out, pos = [], 0
    while pos < len(data):
        head_end = data.find(b"\r\n\r\n", pos)
        if head_end < 0:
            break
        lines = data[pos:head_end].decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        msg = Message(lines[0], headers)
        pos = head_end + 4
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = bytearray()
            while True:
                line_end = data.find(b"\r\n", pos)
                if line_end < 0:
                    msg.complete = False
                    break
                size = int(data[pos:line_end].split(b";")[0], 16)
                if size == 0:
                    pos = line_end + 4
                    break
                chunk = data[line_end + 2 : line_end + 2 + size]
                body += chunk
                msg.chunks.append(size)
                if len(chunk) < size:
                    msg.complete = False
                    break
                pos = line_end + 2 + size + 2
            msg.body = bytes(body)
        else:
            length = int(headers.get("content-length", "0"))
            msg.body = data[pos : pos + length]
            msg.complete = len(msg.body) == length
            pos += length
        out.append(msg)
        if not msg.complete:
            break
    return out


def exchanges(frames: list[bytes], server_port: int) -> list[tuple[Message, Message | None]]:
    """(request, response) pairs of every connection to `server_port` in `frames`."""
    streams = tcp_streams(frames)
    pairs = []
    for (src, sport, dst, dport), data in streams.items():
        if dport != server_port:
            continue
        requests = http_messages(data)
        responses = http_messages(streams.get((dst, dport, src, sport), b""))
        pairs += [(req, responses[i] if i < len(responses) else None) for i, req in enumerate(requests)]
    return pairs


# OHTTP's AEAD ids (RFC 9180 §7.3) -> max(Nn, Nk): the length of a response nonce (RFC 9458 §4.4).
_RESPONSE_NONCE = {1: 16, 2: 32, 3: 32}


def response_records(request_body: bytes, response: Message) -> list[int]:
    """The ciphertext sizes of the records of an OHTTP response: the whole encapsulated response
    (message/ohttp-res), or each chunk of a chunked one, the final chunk last."""
    if response.headers.get("content-type") == "message/ohttp-res":
        return [len(response.body)]
    aead = int.from_bytes(request_body[5:7], "big")  # key_id(1) kem(2) kdf(2) aead(2)
    return chunked_ciphertexts(response.body, _RESPONSE_NONCE[aead])
