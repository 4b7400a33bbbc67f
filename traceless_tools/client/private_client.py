"""PrivateClient: an OpenAI call over the private path (docs/private-path.md).

    tokens      issuer /token-request-batch (API key)      -> Privacy Pass type-2 tokens, unlinkable:
                fetched on the wallet's own random schedule in fixed batches, for the epoch's public
                challenge (fetched through the relay only), under the newest logged issuer key (tokens.py)
    candidates  relay -> gateway /pcc/v1/nodes?nonce=N      -> the model's nodes, each with a document
                (a token of its own, spent)                   its node signed now for the client's nonce
                                                              (hardware: by the key its evidence vouches for)
    verify      attestation (trusted attester key, attester type allowed by policy, nonce, validity
                with clock leeway, OHTTP keys bound; with an evidence policy, the hardware evidence
                that vouches for the key) + a logged release (witnessed tree head) whose settings
                pass the release policy and that allows the attested capacity
                                                            -> refuse anything else, before sending
    draw        the client itself, by attested capacity    (node_choice.py; never the gateway's order)
    request     OHTTP (chunked when streaming) via relay -> gateway -> node, PrivateToken header;
                the request padded to its size bucket (privacy/shape.py), a stream handed on as
                whole SSE events without the node's padding
    failure     nothing is resent onto a fresh draw: the failed request's draw is kept and serves
                the next request (node_choice.Draws), so a gateway that fails requests bound for
                honest nodes (and a caller that retries each failure) gains nothing. The one resend:
                a gateway that no longer knows the node id (404: it restarted), to the same node
                under its new id. Every failure has a fixed cause (errors.py).

Verified candidates are kept for `attestation_max_age_s` and then fetched again with a new nonce
(0: a new nonce for every request). audit/attestation_freshness.py measures both; the default is
chosen there. The client also watches where its requests are answered and warns when one node
answers implausibly more than its attested capacity share.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import time
import warnings
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import NoReturn

import httpx

from traceless.events import emit
from traceless.privacy.attestation.evidence_policy import AttestationPolicy
from traceless.privacy.attestation.policy import CLOCK_LEEWAY_S, AttesterPolicy
from traceless.privacy.bhttp.stream import ResponseStreamDecoder
from traceless.privacy.ohttp.call import encapsulate_call, open_response
from traceless.privacy.ohttp.errors import OHTTP_ERRORS
from traceless.privacy.privacypass.http import format_authorization
from traceless.privacy.shape import sse_event
from traceless.privacy.translog.release_policy import ReleasePolicy
from traceless_tools.client.errors import FailureCause, PathTimeoutError, PrivateClientError, UpstreamError
from traceless_tools.client.node_choice import Draws
from traceless_tools.client.node_verifier import DuplicateListingError, NodeVerifier, VerifiedNode
from traceless_tools.client.routing_watch import RoutingWatch
from traceless_tools.client.tokens import Token, TokenError, TokenWallet


@dataclass(frozen=True, slots=True)
class ClientConfig:
    issuer_url: str
    api_key: str
    relay_url: str
    log_url: str
    log_public_key: bytes  # pinned Ed25519 key of the transparency log
    attester_keys: tuple[bytes, ...]  # Ed25519 keys trusted to sign node attestations
    model: str
    origin_name: str = "traceless"
    candidates: int = 1000  # how many of the model's nodes to ask for (the gateway's cap): all of them
    token_batch: int = 16  # every refill fetches exactly this many tokens
    token_low_water: int = 8  # a scheduled wake refills when the wallet holds fewer than this
    token_refill_delay_s: tuple[float, float] = (1.0, 5.0)  # wakes at uniformly random delays in this range
    token_wait_s: float = 30.0  # how long a request waits for a scheduled refill of an empty wallet
    # A request waiting on an empty wallet looks again after random delays in this range, drawn when it
    # starts waiting: it leaves on a clock of its own, not when a batch lands (tokens.py).
    token_release_delay_s: tuple[float, float] = (0.5, 3.0)
    # The gateway's challenge epoch (GatewayConfig.challenge_epoch_s): the client derives each epoch's public
    # challenge and refuses any other.
    challenge_epoch_s: float = 3600.0
    timeout_s: float = 300.0  # the longest a hop may keep silent: for a non-streamed call, the whole answer
    # A stream fails with PathTimeoutError when its response head takes longer than this (nodes send it
    # on their cadence as soon as a request is admitted)...
    first_byte_timeout_s: float = 60.0
    # ...or when nothing arrives for this long between chunks (a node stalled or a hop hung; a node that
    # hides shapes sends a chunk every tick, and one that does not, one per token).
    idle_timeout_s: float = 30.0
    # PRODUCTION refuses the software attester; only a deployment that says so (traceless up) uses
    # DEVELOPMENT.
    attester_policy: AttesterPolicy = AttesterPolicy.PRODUCTION
    # Measured (python -m traceless_tools.audit.attestation_freshness, 2 shared CPU cores, loopback): a round with
    # a fresh nonce costs ~12 ms for 2 nodes, ~64 ms for 8, ~222 ms for 32; at one request a second a
    # 60 s maximum age makes that ~0.2 / 1.1 / 3.7 ms per request, and bounds how long a replayed document
    # could be used to 60 s (+ clock leeway). It must stay below the nodes' key overlap (600 s). 0 = a nonce
    # per request.
    attestation_max_age_s: float = 60.0
    clock_leeway_s: int = CLOCK_LEEWAY_S
    # With an evidence policy, a node's key is trusted on its hardware evidence (node_verifier.py), and
    # that policy, not `attester_policy`, decides whether the software attester (under a key pinned in
    # `attester_keys`) is accepted. Without one, only `attester_keys` are trusted.
    evidence_policy: AttestationPolicy | None = None
    # The log's tree heads count only with a fresh cosignature from one of these witnesses (none
    # configured: every tree head is refused, so every node is).
    witness_keys: tuple[bytes, ...] = ()
    max_tree_head_age_s: float = 600.0  # the newest witness cosignature may be this old at most
    # Where the last verified tree head is kept (log-state.json, 0600), so that a restart cannot be
    # shown another history; None keeps it in memory only (tests, one-shot tools).
    state_dir: str | None = None
    # What a logged release must say to be used (release_policy.py); waivers are benchmark-only.
    release_policy: ReleasePolicy = ReleasePolicy()
    # Pad every request to its size bucket (docs/shape-hiding.md). Off only to measure what it hides.
    pad_requests: bool = True

    def __post_init__(self) -> None:
        if min(self.timeout_s, self.first_byte_timeout_s, self.idle_timeout_s) <= 0:
            raise ValueError("timeouts must be positive")
        if self.attestation_max_age_s < 0 or self.clock_leeway_s < 0 or self.candidates < 1:
            raise ValueError("attestation_max_age_s and clock_leeway_s must be >= 0 and candidates >= 1")
        if self.max_tree_head_age_s <= 0 or any(len(k) != 32 for k in self.witness_keys):
            raise ValueError("max_tree_head_age_s must be > 0 and witness keys 32-byte Ed25519 keys")
        low, high = self.token_refill_delay_s
        release_low, release_high = self.token_release_delay_s
        if not (0 < release_low <= release_high and self.challenge_epoch_s > 0):
            raise ValueError("token_release_delay_s must be 0 < low <= high and challenge_epoch_s > 0")
        if not (1 <= self.token_low_water <= self.token_batch and 0 < low <= high and self.token_wait_s > 0):
            raise ValueError(
                "need 1 <= token_low_water <= token_batch, 0 < refill delays (low <= high) and token_wait_s > 0"
            )

    @property
    def policy_name(self) -> str:
        """The policy nodes are verified under, as status lines and reports name it."""
        return self.evidence_policy.name if self.evidence_policy is not None else self.attester_policy.value


__all__ = [
    "AsyncPrivateClient",
    "ClientConfig",
    "PathTimeoutError",
    "PrivateClient",
    "PrivateClientError",
    "UpstreamError",
]


class AsyncPrivateClient:
    def __init__(self, config: ClientConfig, http: httpx.AsyncClient | None = None, rng: random.Random | None = None):
        self.config = config
        self._http = http or httpx.AsyncClient(timeout=config.timeout_s)
        self._relay = config.relay_url.rstrip("/")
        self.verifier = NodeVerifier(config)
        self.wallet = TokenWallet(config, self._http, self.verifier.logged_issuer_keys)
        self.routing = RoutingWatch()
        self._rng = rng if rng is not None else secrets.SystemRandom()
        self.draws = Draws(self._rng)
        self._verified: list[VerifiedNode] = []
        self._verified_at = -float("inf")
        self._pumps: set[asyncio.Task] = set()  # each open stream's reader (read to the end: _Pump)

    def start(self) -> None:
        """Start the token wallet's refill schedule now (from a running event loop), ahead of requests."""
        self.wallet.start()

    async def aclose(self) -> None:
        for task in list(self._pumps):
            await _settle(task)
        await self.wallet.aclose()
        await self._http.aclose()
        self.verifier.close()

    async def _verified_candidates(self) -> list[VerifiedNode]:
        """The verified candidates, fetched again with a new nonce once older than the maximum age."""
        now = time.monotonic()
        if self._verified and now - self._verified_at < self.config.attestation_max_age_s:
            return self._verified
        nonce = os.urandom(32)
        offered = await self._offered(nonce)
        try:
            verified = await asyncio.to_thread(self.verifier.verify_all, offered, nonce)
        except DuplicateListingError as exc:
            raise PrivateClientError(str(exc), FailureCause.DUPLICATE_LISTING) from None
        emit("client.candidates", offered=len(offered), verified=len(verified), fresh=True)
        if not verified:
            raise PrivateClientError(
                "no offered node could be verified; nothing was sent", FailureCause.NO_HEALTHY_NODE
            )
        self._verified, self._verified_at = verified, now
        return verified

    async def _offered(self, nonce: bytes) -> list:
        """The gateway's candidate list for `nonce`, as offered (not verified yet)."""
        token = await self._listing_token()
        try:
            r = await self._http.get(
                self._relay + "/pcc/v1/nodes",
                params={"model": self.config.model, "k": self.config.candidates, "nonce": nonce.hex()},
                headers={"authorization": format_authorization(token)},
            )
        except (httpx.ConnectError, httpx.ConnectTimeout):
            raise PrivateClientError("the relay could not be reached", FailureCause.RELAY_UNREACHABLE) from None
        except httpx.HTTPError:
            raise PrivateClientError("the candidate list could not be fetched") from None
        _check_listing_status(r.status_code)
        try:
            offered = r.json().get("nodes", [])
        except (ValueError, AttributeError):
            offered = None
        if not isinstance(offered, list):
            raise PrivateClientError("the gateway's candidate list is malformed")
        return offered

    async def _listing_token(self):
        """A token for a nonce-bound listing (the nodes sign for the nonce: the gateway wants one paid
        for). It is an ordinary token from the same wallet, spent alone: nothing ties it to the
        request's token but the time, which the listing showed already."""
        try:
            return await self.wallet.take()
        except TokenError as exc:
            cause = FailureCause.QUOTA_EXHAUSTED if exc.reason == "quota_exhausted" else FailureCause.TOKENS_UNAVAILABLE
            raise PrivateClientError(f"{exc}; nothing was sent", cause) from None

    def status(self) -> dict:
        """What this client last verified, for the proxy's /status: the policy, the attestation kind of
        every node of the current round (node ids are the gateway's random ones) and how many offered
        nodes that round refused, by reason (fixed codes)."""
        nodes = [
            {
                "node_id": n.node_id,
                "attestation_kind": n.attestation_kind,
                "capacity": n.capacity,
                "measurement": n.measurement.hex(),
                "verified_at": n.verified_at,
            }
            for n in self._verified
        ]
        return {
            "model": self.config.model,
            "policy": self.config.policy_name,
            "attestation_kinds": sorted({n.attestation_kind for n in self._verified}),
            "nodes": nodes,
            "refused": dict(self.verifier.last_refused),
            "routing": {**self.routing.status(), "kept_draws": len(self.draws)},
        }

    async def request(self, path: str, body: dict | None) -> dict | AsyncIterator[bytes]:
        """POST an OpenAI call (`/v1/chat/completions`, `/v1/completions`, `/tokenize`,
        `/detokenize`) through the private path: the response dict, or an async iterator of SSE
        event bytes when body asks to stream. body None: GET (`/v1/models`)."""
        stream = body is not None and body.get("stream") is True
        payload = json.dumps(body).encode() if body is not None else None
        candidates = asyncio.create_task(self._verified_candidates())  # overlaps with taking a token
        token = await self._request_token(candidates)
        if isinstance(token, PrivateClientError):
            return self._failed(1, stream, token)
        nodes = await candidates
        node = self.draws.take(nodes)
        for attempts in (1, 2):
            try:
                result = await self._send(node, path.encode(), payload, stream, token)
            except _OuterRefusal:  # refused by a hop (413, 403 ...): no node answered; the draw is kept
                self.draws.keep(node)
                raise
            except UpstreamError:
                self._answered(node, nodes)  # the node answered, with an error of its own
                raise
            except _NodeUnknown:
                # The gateway no longer knows this node id (it restarted and renamed its nodes):
                # nothing reached a node and the token was not spent. Resent once, only to the
                # same node (by attester key) under its new id, never to a fresh draw (threat T18).
                nodes, same = await self._relisted(node)
                if same is None or attempts == 2:
                    self.draws.keep(node)
                    return self._failed(
                        attempts,
                        stream,
                        PrivateClientError(
                            "the drawn node is no longer listed; nothing was sent", FailureCause.NO_HEALTHY_NODE
                        ),
                    )
                node = same
                continue
            except _TokenRejected:  # a token of this epoch refused: fail; fetch nothing because of it
                self.draws.keep(node)
                return self._failed(
                    attempts,
                    stream,
                    PrivateClientError("the gateway refused this epoch's token", FailureCause.TOKEN_REFUSED),
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                self.draws.keep(node)  # nothing was sent: the draw serves the next request
                return self._failed(
                    attempts,
                    stream,
                    PrivateClientError("the relay could not be reached", FailureCause.RELAY_UNREACHABLE),
                    exc,
                )
            except (PathTimeoutError, httpx.TransportError, _NodeFailed) as exc:  # sent, no answer: not resent
                self._verified = []  # the next request starts from a fresh round (a dead node is not offered)
                self.draws.keep(node)
                return self._failed(attempts, stream, *_not_resent(exc, self.config.timeout_s))
            emit("client.request", ok=True, attempts=attempts, stream=stream)
            self._answered(node, nodes)
            return result if isinstance(result, dict) else self._forget_on_failure(result, node)
        raise AssertionError("unreachable: the loop returns or raises")

    async def _request_token(self, candidates: asyncio.Task[list[VerifiedNode]]) -> Token | PrivateClientError:
        """The request's token, or the failure that stops the request before anything is sent:
        without a token, the round's own failure (no verifiable node ...) if it has one, being the
        more specific, else the wallet's. Anything else leaves `candidates` settled and propagates."""
        try:
            return await self.wallet.take()
        except TokenError as exc:
            (listed,) = await asyncio.gather(candidates, return_exceptions=True)
            if isinstance(listed, PrivateClientError):
                return listed
            cause = FailureCause.QUOTA_EXHAUSTED if exc.reason == "quota_exhausted" else FailureCause.TOKENS_UNAVAILABLE
            return PrivateClientError(f"{exc}; nothing was sent", cause)
        except BaseException:
            await _settle(candidates)
            raise

    async def _relisted(self, node: VerifiedNode) -> tuple[list[VerifiedNode], VerifiedNode | None]:
        """A fresh round of candidates, and `node` in it (the same attester key) under its new id."""
        self._verified = []
        nodes = await self._verified_candidates()
        return nodes, next((n for n in nodes if n.attester_kid == node.attester_kid), None)

    async def _forget_on_failure(self, events: AsyncIterator[bytes], node: VerifiedNode) -> AsyncGenerator[bytes, None]:
        """Pass a stream through; if it breaks off, the next request starts from a fresh round and
        is sent on this request's draw."""
        try:
            async for event in events:
                yield event
        except PrivateClientError:
            self._verified = []
            self.draws.keep(node)
            raise
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()

    def _failed(
        self, attempts: int, stream: bool, error: PrivateClientError, cause: Exception | None = None
    ) -> NoReturn:
        emit("client.request", ok=False, attempts=attempts, stream=stream)
        raise error from cause

    def _answered(self, node: VerifiedNode, nodes: list[VerifiedNode]) -> None:
        """Count where a request was answered, by attester key, against the round it was drawn from."""
        capacities = {n.attester_kid: n.capacity for n in nodes}
        capacities.setdefault(node.attester_kid, node.capacity)
        warning = self.routing.observe(node.attester_kid, capacities)
        if warning:
            warnings.warn(warning, RuntimeWarning, stacklevel=4)

    async def _send(self, node: VerifiedNode, path: bytes, payload: bytes | None, stream: bool, token):
        # GET (body None: the model list) or POST; padded to its bucket unless measuring without
        call = encapsulate_call(node.key_config, path, payload, stream=stream, pad=self.config.pad_requests)
        headers = {"content-type": call.media_type, "authorization": format_authorization(token)}
        url = f"{self._relay}/pcc/v1/ohttp/{node.node_id}"
        if not stream:
            r = await self._http.post(url, content=call.body, headers=headers)
            if r.status_code >= 500 or r.headers.get("content-type", "").split(";")[0] != "message/ohttp-res":
                _raise_outer(r.status_code, r.content)
            try:
                msg = open_response(call, r.content)
            except OHTTP_ERRORS:
                raise PrivateClientError("the response failed to decrypt") from None
            data = json.loads(msg.content)
            if msg.status != 200:
                raise UpstreamError(msg.status, data)
            return data
        return await self._open_stream(url, call.body, headers, call.context)

    async def _open_stream(self, url: str, enc: bytes, headers: dict, ctx) -> AsyncIterator[bytes]:
        req = self._http.build_request("POST", url, content=enc, headers=headers)
        r = await self._http.send(req, stream=True)
        if r.status_code != 200 or r.headers.get("content-type", "").split(";")[0] != "message/ohttp-chunked-res":
            body = await r.aread()
            await r.aclose()
            _raise_outer(r.status_code, body)
        decryptor, parser = ctx.decryptor(), ResponseStreamDecoder()
        head_it = _silence_limited(r.aiter_raw(), self.config.first_byte_timeout_s, "response head")
        head, first = await _read_head(head_it, decryptor, parser, r)
        it = _silence_limited(head_it.source, self.config.idle_timeout_s, "next chunk")
        pump = _Pump(it, r, self._pumps)
        if head.status != 200:
            rest = first + b"".join([c async for c in _events(pump, decryptor, parser)])
            raise UpstreamError(head.status, json.loads(rest or b"{}"))
        return _sse_events(_stream_with(first, _events(pump, decryptor, parser)))


class _NodeFailed(Exception):
    pass


class _OuterRefusal(UpstreamError):
    """A hop (gateway or relay) refused the request outside the encryption, with a 4xx."""


class _NodeUnknown(Exception):
    """The gateway answered 404 outside the encryption: it lists no node under this id."""


class _silence_limited:
    """An async iterator over `source` whose every step must come within `timeout_s`, else
    PathTimeoutError. `source` stays usable afterwards (the head and the body have their own limits)."""

    def __init__(self, source: AsyncIterator[bytes], timeout_s: float, waiting_for: str):
        self.source, self._timeout_s, self._waiting_for = source, timeout_s, waiting_for

    def __aiter__(self) -> _silence_limited:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await asyncio.wait_for(self.source.__anext__(), self._timeout_s)
        except TimeoutError:
            raise PathTimeoutError(
                f"nothing arrived for {self._timeout_s:g}s while waiting for the "
                f"{self._waiting_for}; the request was abandoned"
            ) from None


class _TokenRejected(Exception):
    pass


def _not_resent(exc: Exception, timeout_s: float) -> tuple[PrivateClientError, Exception | None]:
    """What a request that was sent and got no answer fails with, and the cause it is raised from."""
    if isinstance(exc, PathTimeoutError):  # a stream's head did not come in time
        return exc, None
    if isinstance(exc, httpx.TimeoutException):  # no answer after the request was sent
        return PathTimeoutError(f"no answer within {timeout_s:.0f}s; the request was abandoned"), exc
    return PrivateClientError("the node or a hop failed after the request was sent; it was not resent"), exc


def _check_listing_status(status: int) -> None:
    """The candidate list's HTTP status: 200, or the failure cause it means."""
    if status in (404, 503):
        raise PrivateClientError(f"no candidate nodes (gateway answered HTTP {status})", FailureCause.NO_HEALTHY_NODE)
    if status == 401:  # as for a request: fail, and fetch nothing because of it
        raise PrivateClientError(
            "the gateway refused this epoch's token for the candidate list", FailureCause.TOKEN_REFUSED
        )
    if status != 200:
        raise PrivateClientError(f"no candidate nodes (gateway answered HTTP {status})")


def _raise_outer(status: int, body: bytes) -> None:
    """An error outside the encryption (gateway, relay, or a node that could not decrypt)."""
    if status >= 500:
        raise _NodeFailed(f"upstream answered HTTP {status}")
    if status == 404:
        raise _NodeUnknown()
    if status == 401:  # a token for the epoch's public challenge refused
        raise _TokenRejected()
    try:
        data = json.loads(body)
    except ValueError:
        data = {"error": {"message": f"upstream answered HTTP {status}", "type": "upstream_error"}}
    raise _OuterRefusal(status, data)


async def _settle(task: asyncio.Task) -> None:
    """Cancel a task whose result is no longer wanted, and wait for it (its errors included)."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _read_head(it, decryptor, parser, response):
    """Decrypt until the inner response head; returns (head, content already received)."""
    head, got = None, []
    try:
        async for raw in it:
            for plain in decryptor.feed(raw):
                for item in parser.feed(plain):
                    if head is None:
                        head = item
                    else:
                        got.append(item)
            if head is not None:
                return head, b"".join(got)
    except OHTTP_ERRORS:
        await response.aclose()
        raise PrivateClientError("the response stream failed to decrypt") from None
    except PathTimeoutError:
        await response.aclose()
        raise
    except httpx.HTTPError:
        pass  # the node failed before answering: retry elsewhere
    await response.aclose()
    raise _NodeFailed("the stream ended before the response head")


class _Pump:
    """Reads a streamed response to its end on a task of its own, whoever reads the stream. The SDK
    stops at `[DONE]` and hangs up, which cancels the proxy's handler; if that closed the upstream, the
    hops would see the stream end where the answer ended instead of where the node's shaping ends (its
    padded length and tick count). So the reader only takes chunks from this queue, and when it leaves
    early the pump reads the rest, unread and undecrypted, then closes the response."""

    def __init__(self, it: AsyncIterator[bytes], response: httpx.Response, tasks: set[asyncio.Task]):
        self.chunks: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        self._abandoned = False
        task = asyncio.get_running_loop().create_task(self._run(it, response))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _run(self, it: AsyncIterator[bytes], response: httpx.Response) -> None:
        try:
            async for raw in it:  # bounded by the iterator's silence limit and the node's own end
                if not self._abandoned:
                    self.chunks.put_nowait(raw)
            self.chunks.put_nowait(None)
        except Exception as exc:  # handed to the reader, which maps it to the client's errors
            self.chunks.put_nowait(exc)
        finally:
            await response.aclose()

    def abandon(self) -> None:
        self._abandoned = True
        while not self.chunks.empty():
            self.chunks.get_nowait()


async def _events(pump: _Pump, decryptor, parser) -> AsyncGenerator[bytes, None]:
    ended = False  # read to the node's final chunk, or failed on the way
    try:
        while (raw := await pump.chunks.get()) is not None:
            if isinstance(raw, BaseException):
                ended = True
                raise raw
            for plain in decryptor.feed(raw):
                for item in parser.feed(plain):
                    yield item
        ended = True
        for item in parser.feed(decryptor.finish()):  # the final chunk (raises if the stream was cut before it)
            yield item
        if not parser.complete:
            raise PrivateClientError("the response stream was truncated")
    except OHTTP_ERRORS:
        raise PrivateClientError("the response stream failed to decrypt") from None
    except httpx.HTTPError:
        raise PrivateClientError("the response stream broke off (the node or a hop failed)") from None
    finally:
        parser.wipe()
        if not ended:
            pump.abandon()


async def _stream_with(first: bytes, rest: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    try:
        if first:
            yield first
        async for chunk in rest:
            yield chunk
    finally:
        await rest.aclose()


async def _sse_events(pieces: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    """One whole SSE event per item, without the comment and blank lines that pad a stream (a node
    packs events into fixed-size chunks, so one chunk may end inside an event)."""
    buf = bytearray()
    try:
        async for piece in pieces:
            buf += piece
            while (end := buf.find(b"\n\n")) >= 0:
                event = sse_event(bytes(buf[:end]))
                buf[: end + 2] = bytes(end + 2)
                del buf[: end + 2]
                if event is not None:
                    yield event
        if (event := sse_event(bytes(buf))) is not None:  # a last event without its blank line
            yield event
    finally:
        buf[:] = bytes(len(buf))
        await pieces.aclose()


class PrivateClient:
    """Synchronous facade over AsyncPrivateClient (runs its own event loop thread)."""

    def __init__(self, config: ClientConfig):
        import threading

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="private-client")
        self._thread.start()
        self._client = self._run(_make_async(config))

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def chat(self, body: dict):
        return self._wrap(self._run(self._client.request("/v1/chat/completions", body)))

    def completions(self, body: dict):
        return self._wrap(self._run(self._client.request("/v1/completions", body)))

    def _wrap(self, result):
        if isinstance(result, dict):
            return result

        def gen():
            try:
                while True:
                    try:
                        yield self._run(result.__anext__())
                    except StopAsyncIteration:
                        return
            finally:
                self._run(result.aclose())

        return gen()

    @property
    def routing(self) -> RoutingWatch:
        return self._client.routing

    def close(self) -> None:
        self._run(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


async def _make_async(config: ClientConfig) -> AsyncPrivateClient:
    client = AsyncPrivateClient(config)
    client.start()  # the token schedule runs from now on, not from the first request
    return client
