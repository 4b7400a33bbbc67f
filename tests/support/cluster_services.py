"""Test doubles and runners for the private-path services: any ASGI app on a loopback port,
a fake node (OHTTP echo, optionally streamed), issuer keys and tokens from a local Issuer."""

from __future__ import annotations

import asyncio
import base64
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from traceless.http.serve import serve_in_thread
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.software import NodeStatement, SoftwareAttester, new_claims
from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.ohttp.call import encapsulate_call
from traceless.privacy.ohttp.chunked import split_chunks
from traceless.privacy.ohttp.gateway import OhttpServer, encapsulate_chunked_request
from traceless.privacy.privacypass import protocol as privacypass
from traceless.privacy.privacypass.http import format_authorization, parse_www_authenticate
from traceless.privacy.privacypass.wire import TokenChallenge
from traceless.privacy.translog.manifest import ReleaseManifest
from traceless.privacy.translog.release_index import ReleaseNotLoggedError

STREAM_CHUNKS = 4
STREAM_DELAY_S = 0.15
# The release the fake nodes run: the capacities it allows are what a node may claim; its settings pass
# the client's release policy.
PRIVATE_SETTINGS = {
    "component": "node",
    "prefix_cache": "isolated",
    "shape_padding": "buckets",
    "scrub_freed_memory": True,
    "load_format": "auto",
    "request_events": False,
    "metrics_epsilon": 1.0,
}
RELEASE = ReleaseManifest(b"\x01" * 32, b"\x02" * 32, PRIVATE_SETTINGS, (1, 2, 3, 4, 5))


class StubReleases:
    """A ReleaseLookup holding the given manifests (the real one proves them in the log)."""

    def __init__(self, *manifests: ReleaseManifest) -> None:
        self._by_combined = {m.combined: m for m in manifests}

    def release_for(self, combined: bytes) -> ReleaseManifest:
        manifest = self._by_combined.get(combined)
        if manifest is None:
            raise ReleaseNotLoggedError("no logged release has this measurement")
        return manifest


def running_app(app):
    """Serve `app` on a free loopback port in a thread (lifespan on); yields its base URL."""
    return serve_in_thread(app, what="service")


class FakeNode:
    """A node stand-in: /health (switchable) and /pcc/v1/ohttp answering an encrypted echo.

    message/ohttp-req -> message/ohttp-res holding a BHTTP 200 whose content is the inner
    request's content. message/ohttp-chunked-req -> message/ohttp-chunked-res: STREAM_CHUNKS
    chunks b"chunk-i;" STREAM_DELAY_S apart, then the inner request as the final chunk.
    Records the headers it was sent, when each stream finished and how many were abandoned.
    """

    def __init__(self, measurement: Measurement = RELEASE.measurement) -> None:
        self.ohttp = OhttpServer(key_id=1)
        self.attester = SoftwareAttester()
        self.measurement = measurement
        self.url = ""
        self.capacity = 1
        self.healthy = True
        self.engine_dead = False  # True: attestation answers 503 engine_dead, as a node whose engine stopped
        self.seen_headers: list[dict[str, str]] = []
        self.stream_finished_at: list[float] = []
        self.body_arrivals: list[tuple[float, int]] = []  # (monotonic time, bytes) of each body chunk
        self.streams_abandoned = 0
        self.break_streams = False  # True: fail (drop the connection) after the first chunk
        # True: go silent, as a host that vanished (no FIN, no RST): a plain request is never
        # answered, a stream stops after its first chunk; until the gateway hangs up.
        self.stall = False
        self.app = Starlette(
            routes=[
                Route("/health", self._health, methods=["GET"]),
                Route("/pcc/v1/attestation", self._attestation, methods=["GET"]),
                Route("/pcc/v1/ohttp", self._ohttp_route, methods=["POST"]),
            ]
        )

    @property
    def ohttp_keys_b64(self) -> str:
        return base64.b64encode(self.ohttp.ohttp_keys()).decode()

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"}, status_code=200 if self.healthy else 503)

    async def _attestation(self, request: Request) -> Response:
        if self.engine_dead:
            return JSONResponse(
                {
                    "error": {
                        "message": "the node's engine has stopped",
                        "type": "server_error",
                        "param": None,
                        "code": "engine_dead",
                    }
                },
                status_code=503,
            )
        if not self.healthy:
            return JSONResponse({"status": "down"}, status_code=503)
        nonce = bytes.fromhex(request.query_params["nonce"])
        return JSONResponse({"attestation": self.attest(nonce), "ohttp_keys": self.ohttp_keys_b64})

    def attest(self, nonce: bytes, now: float | None = None, capacity: int | None = None, ttl_s: int = 300) -> str:
        statement = NodeStatement(
            self.measurement, self.ohttp.ohttp_keys(), self.capacity if capacity is None else capacity, self.url
        )
        claims = new_claims(statement, nonce, int(time.time() if now is None else now), "software", ttl_s)
        return self.attester.attest(claims)

    @property
    def attester_key_b64(self) -> str:
        return base64.b64encode(self.attester.public_key.public_bytes_raw()).decode()

    async def _ohttp_route(self, request: Request) -> Response:
        self.seen_headers.append(dict(request.headers))
        parts = []
        async for part in request.stream():
            if part:
                self.body_arrivals.append((time.monotonic(), len(part)))
                parts.append(part)
        body = b"".join(parts)
        if request.headers.get("content-type") == "message/ohttp-chunked-req":
            inner, context = self.ohttp.decapsulate_chunked_request(body)
            return StreamingResponse(self._stream(inner, context.encryptor()), media_type="message/ohttp-chunked-res")
        inner, context = self.ohttp.decapsulate_request(body)
        if self.stall:
            while not await request.is_disconnected():
                await asyncio.sleep(0.05)
            self.streams_abandoned += 1
        content = bhttp.decode_request(inner).content
        reply = bhttp.encode_response(bhttp.Response(200, content=content))
        return Response(context.encapsulate(reply), media_type="message/ohttp-res")

    async def _stream(self, inner: bytes, encryptor):
        try:
            for i in range(STREAM_CHUNKS):
                while self.stall:
                    await asyncio.sleep(0.05)  # cancelled when the gateway hangs up
                yield encryptor.seal_chunk(f"chunk-{i};".encode())
                if self.break_streams:
                    raise RuntimeError("the node fails mid-stream")
                await asyncio.sleep(STREAM_DELAY_S)
        except BaseException:  # cancelled: the receiving side went away
            self.streams_abandoned += 1
            raise
        self.stream_finished_at.append(time.monotonic())
        yield encryptor.seal_final(inner)

    def registration(self, url: str, model: str = "m", capacity: int = 1, now: float | None = None) -> dict:
        """A registration body with a fresh attestation that binds `url` and claims `capacity`."""
        self.url, self.capacity = url.rstrip("/"), capacity
        return {
            "url": url,
            "model": model,
            "attestation": self.attest(b"r" * 16, now),
            "ohttp_keys": self.ohttp_keys_b64,
            "attester_key": self.attester_key_b64,
        }


def encrypt_for(node: FakeNode, content: bytes):
    """(message/ohttp-req body, response context) for the node's key."""
    call = encapsulate_call(node.ohttp.key_config, b"/v1/chat/completions", content, stream=False)
    return call.body, call.context


def encrypt_chunked_for(node: FakeNode, payload: bytes):
    return encapsulate_chunked_request(node.ohttp.key_config, split_chunks(payload))


def mint_tokens(issuer: privacypass.Issuer, www_authenticate: str, count: int) -> list[str]:
    """Authorization header values for `count` fresh tokens answering the first challenge."""
    challenge = TokenChallenge.decode(parse_www_authenticate(www_authenticate)[0].challenge)
    out = []
    for _ in range(count):
        request, state = privacypass.begin(challenge, issuer.public_key)
        out.append(format_authorization(privacypass.finalize(state, issuer.issue(request))))
    return out
