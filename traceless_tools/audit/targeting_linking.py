"""The linking and log attacks of `traceless audit targeting` (threats T21, T22 and T26, docs/threat-model.md), each run
against the real components on loopback: the real issuer and gateway apps, the real transparency
log service with a real witness, and the client's own TokenWallet and LogClient.

    unique_challenge    the gateway hands every challenge fetch its own redemption context (to tag
                        a wallet and link its redemptions). Success: a wallet fetches tokens for it.
    issuer_key_tagging  the issuer's directory shows one user a key of its own (never logged), so
                        tokens under it would name the user. Success: the wallet takes that key.
    log_fork            the log operator shows a second history: a head of the same size with a
                        different root, signed with the log's key. Success: a client accepts it
                        (one that verified the log before, with its saved head, and a fresh one).

Each row: N attack trials and how many succeeded, and N honest trials (the same client against the
same components behaving honestly) and how many were accepted, both with 95% Wilson intervals.
The attacks must succeed 0/N times while the honest baseline is accepted N/N: a check that refused
everything would fail the second half.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import httpx

from traceless_tools.audit.stats import wilson_interval

LINKING_STRATEGIES = ("unique_challenge", "issuer_key_tagging", "log_fork")
ISSUER_HOST = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class LinkingEstimate:
    strategy: str
    trials: int
    attack_successes: int
    honest_accepted: int
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def detected(self) -> bool:
        """Every attack failed and the honest baseline always passed."""
        return self.attack_successes == 0 and self.honest_accepted == self.trials

    def to_json(self) -> dict:
        return {
            "strategy": self.strategy,
            "trials": self.trials,
            "attack_success_rate": self.attack_successes / self.trials,
            "attack_95ci": list(wilson_interval(self.attack_successes, self.trials)),
            "honest_accept_rate": self.honest_accepted / self.trials,
            "honest_95ci": list(wilson_interval(self.honest_accepted, self.trials)),
            "detected": self.detected,
            "notes": self.notes,
        }


# --- the world: log + witness, issuer, gateway --------------------------------------------------
@dataclass
class World:
    dir: Path
    log_url: str
    log_key: bytes
    witness: object  # traceless.privacy.translog.witness.Witness
    issuer_url: str
    gateway_url: str
    issuer_key_spki: bytes
    api_key: str


@contextmanager
def world() -> Iterator[World]:
    """A witnessed log holding the issuer's key, the real issuer and the real gateway, on loopback."""
    from traceless.http.serve import serve_in_thread
    from traceless.privacy.attestation.policy import AttesterPolicy
    from traceless.privacy.privacypass.batch_issuance import ApiKeyStore
    from traceless.privacy.privacypass.protocol import Issuer
    from traceless.privacy.translog.log import TransparencyLog
    from traceless.privacy.translog.manifest import IssuerKeyEntry
    from traceless.privacy.translog.witness import Witness
    from traceless_tools.audit.targeting_nodes import AuditReleases
    from traceless_tools.cluster.gateway import GatewayConfig, create_gateway_app
    from traceless_tools.cluster.issuer import IssuerConfig, create_issuer_app
    from traceless_tools.cluster.issuer_directory import issuer_name
    from traceless_tools.cluster.log_service import build_server

    with ExitStack() as stack:
        d = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="traceless-linking-")))
        api_key = secrets.token_urlsafe(16)
        issuer = Issuer.generate()
        issuer_url = stack.enter_context(
            serve_in_thread(
                create_issuer_app(IssuerConfig(tokens_per_window=10**6), ApiKeyStore({"user": api_key}), issuer=issuer),
                what="issuer",
            )
        )
        log = TransparencyLog.create(d / "log")
        now = int(time.time())
        log.append(IssuerKeyEntry(issuer_name(issuer_url), issuer.public_key.spki, now - 60, now + 86400).encode())
        witness = Witness(d / "witness", log.public_key_bytes())
        log_url = stack.enter_context(
            serve_in_thread(server=build_server(d / "log", witness_keys=(witness.public_key,)), what="log")
        )
        cfg = GatewayConfig(issuer_url=issuer_url, health_interval_s=3600, attester_policy=AttesterPolicy.DEVELOPMENT)
        gateway_url = stack.enter_context(
            serve_in_thread(create_gateway_app(cfg, [issuer.public_key], releases=AuditReleases()), what="gateway")
        )
        w = World(d, log_url, log.public_key_bytes(), witness, issuer_url, gateway_url, issuer.public_key.spki, api_key)
        witness_round(w)
        yield w


def witness_round(w: World) -> bool:
    """One round of the real witness against the log; True if it cosigned."""
    from traceless.privacy.translog.client import LogClient
    from traceless_tools.cluster.witness_service import witness_once

    with httpx.Client(timeout=10) as http, LogClient(w.log_url, w.log_key, http=http) as log:
        return witness_once(w.witness, log, http, w.log_url) is not None  # type: ignore[arg-type]


def _log_client(w: World, state: Path | None):
    from traceless.privacy.translog.client import LogClient
    from traceless.privacy.translog.cosignature import WitnessPolicy

    return LogClient(
        w.log_url,
        w.log_key,
        witness=WitnessPolicy((w.witness.public_key,)),  # type: ignore[attr-defined]
        state_path=state,
    )


def _wallet_config(w: World, relay_url: str, gateway_url: str, issuer_url: str) -> SimpleNamespace:
    return SimpleNamespace(
        token_batch=4,
        token_low_water=2,
        token_refill_delay_s=(1.0, 1.0),
        token_wait_s=5.0,
        token_release_delay_s=(0.01, 0.02),
        challenge_epoch_s=3600.0,
        clock_leeway_s=60,
        issuer_url=issuer_url,
        relay_url=relay_url,
        gateway_url=gateway_url,
        origin_name="traceless",
        api_key=w.api_key,
    )


def _logged_keys(w: World) -> Callable[[str, bool], list]:
    from traceless.privacy.translog.release_index import ReleaseIndex

    index = ReleaseIndex(_log_client(w, None), refresh_s=0.0)
    return lambda issuer, refresh: index.issuer_keys(issuer, refresh=refresh)


def _wallet_run(w: World, cfg: SimpleNamespace, attempt: Callable) -> bool:
    """True if `attempt(wallet)` completes (the wallet accepted what it was shown)."""
    from traceless_tools.cluster.issuer_directory import issuer_name

    return _wallet_run_named(w, cfg, attempt, issuer_name(cfg.issuer_url))


# --- unique challenges ---------------------------------------------------------------------------
@contextmanager
def tagging_gateway(w: World) -> Iterator[str]:
    """A gateway that answers every challenge fetch with a redemption context of its own."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from traceless.http.serve import serve_in_thread
    from traceless.privacy.privacypass.http import PrivateTokenChallenge, format_www_authenticate
    from traceless.privacy.privacypass.wire import TOKEN_TYPE_BLIND_RSA, TokenChallenge
    from traceless_tools.cluster.issuer_directory import issuer_name

    async def challenge(request: Request) -> Response:
        tagged = TokenChallenge(TOKEN_TYPE_BLIND_RSA, issuer_name(w.issuer_url), os.urandom(32), "")
        header = format_www_authenticate([PrivateTokenChallenge(tagged.encode(), w.issuer_key_spki, 3600)])
        return Response(status_code=200, headers={"WWW-Authenticate": header})

    with serve_in_thread(Starlette(routes=[Route("/pcc/v1/challenge", challenge)]), what="tagging gateway") as url:
        yield url


def unique_challenge(w: World, trials: int) -> LinkingEstimate:
    async def refill(wallet) -> None:
        await wallet.refill_once()
        if not wallet._tokens:
            raise AssertionError("no tokens after a refill that passed its checks")

    with tagging_gateway(w) as tagger:
        # The relay forwards to the gateway, so both of the wallet's copies come from the tagging gateway.
        attacked = sum(_wallet_run(w, _wallet_config(w, tagger, tagger, w.issuer_url), refill) for _ in range(trials))
    honest = sum(
        _wallet_run(w, _wallet_config(w, w.gateway_url, w.gateway_url, w.issuer_url), refill) for _ in range(trials)
    )
    return LinkingEstimate(
        "unique_challenge", trials, attacked, honest, {"attack": "a fresh redemption context per challenge fetch"}
    )


# --- issuer key tagging --------------------------------------------------------------------------
@contextmanager
def tagging_directory(w: World) -> Iterator[str]:
    """The issuer's directory, as a tagging issuer shows it to one user: a key of that user's own."""
    from cryptography.hazmat.primitives.asymmetric import rsa
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from traceless.http.serve import serve_in_thread
    from traceless.privacy.privacypass.http import b64url_encode
    from traceless.privacy.privacypass.keys import encode_token_key

    user_key = encode_token_key(rsa.generate_private_key(65537, 2048).public_key())

    async def directory(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "issuer-request-uri": "/token-request",
                "token-keys": [{"token-type": 2, "token-key": b64url_encode(user_key)}],
            }
        )

    with serve_in_thread(Starlette(routes=[Route("/token-issuer-directory", directory)]), what="tagging issuer") as url:
        yield url


def issuer_key_tagging(w: World, trials: int) -> LinkingEstimate:
    async def take_key(wallet) -> None:
        await wallet._issuer_key()

    from traceless_tools.cluster.issuer_directory import issuer_name

    with tagging_directory(w) as tagger:
        # The tagging issuer answers under the real issuer's name (the one its logged key is under).
        cfg = _wallet_config(w, w.gateway_url, w.gateway_url, tagger)
        attacked = sum(_wallet_run_named(w, cfg, take_key, issuer_name(w.issuer_url)) for _ in range(trials))
    honest = sum(
        _wallet_run(w, _wallet_config(w, w.gateway_url, w.gateway_url, w.issuer_url), take_key) for _ in range(trials)
    )
    return LinkingEstimate(
        "issuer_key_tagging", trials, attacked, honest, {"attack": "a per-user issuer key, not in the transparency log"}
    )


def _wallet_run_named(w: World, cfg: SimpleNamespace, attempt: Callable, name: str) -> bool:
    """As _wallet_run, with the wallet looking up logged keys under `name` (the tagging issuer
    impersonates the real one, whose logged key it cannot replace)."""
    from traceless_tools.client.tokens import TokenError, TokenWallet

    class NamedWallet(TokenWallet):
        def _issuer_name(self) -> str:
            return name

    async def run() -> bool:
        async with httpx.AsyncClient(timeout=10) as http:
            wallet = NamedWallet(cfg, http, _logged_keys(w))
            try:
                await attempt(wallet)
                return True
            except TokenError:
                return False

    return asyncio.run(run())


def measure_linking(trials: int = 30, strategies: tuple[str, ...] = LINKING_STRATEGIES) -> list[LinkingEstimate]:
    """Every linking/log strategy, `trials` attack and `trials` honest trials each, in one world."""
    runs = {"unique_challenge": unique_challenge, "issuer_key_tagging": issuer_key_tagging, "log_fork": log_fork}
    with world() as w:
        return [runs[s](w, trials) for s in strategies]


# --- log fork ------------------------------------------------------------------------------------
@contextmanager
def forked_log(directory: Path) -> Iterator[None]:
    """What a log operator holding the key can do: replace the last leaf and re-sign a head of the
    same size. On exit the operator gives the fork up (the original files are put back)."""
    from traceless.privacy.translog import log as tl

    saved = {name: (directory / name).read_bytes() for name in (tl.ENTRIES, tl.STH)}
    _fork(directory)
    try:
        yield
    finally:
        for name, data in saved.items():
            (directory / name).write_bytes(data)


def _fork(directory: Path) -> None:
    import json

    from cryptography.hazmat.primitives import serialization

    from traceless.privacy.translog import log as tl
    from traceless.privacy.translog.merkle import leaf_hash, merkle_tree_hash
    from traceless.privacy.translog.tree_head import sign_tree_head

    log = tl.TransparencyLog.open(directory)
    leaves = log.get_entries(0, log.tree_size - 1)
    leaves[-1] = os.urandom(32)
    key = serialization.load_pem_private_key((directory / tl.SIGNING_KEY).read_bytes(), None)
    records = b"".join(len(x).to_bytes(4, "big") + x + leaf_hash(x) for x in leaves)
    (directory / tl.ENTRIES).write_bytes(tl.MAGIC + records)
    sth = sign_tree_head(key, len(leaves), log.sth.timestamp + 1, merkle_tree_hash(leaves))  # type: ignore[arg-type]
    (directory / tl.STH).write_text(json.dumps(sth.to_json()))


def log_fork(w: World, trials: int) -> LinkingEstimate:
    """Each trial: a client verifies the log (saving its head); honest trial: the log grows by one leaf,
    the witness runs, the client accepts the new head; attack: the operator forks the log, the witness
    runs, and the attack succeeds if the client that kept its head, or a fresh one, accepts the fork."""
    from traceless.privacy.translog.client import LogClientError
    from traceless.privacy.translog.log import TransparencyLog

    attacked = honest = 0
    for i in range(trials):
        state = w.dir / f"client-{i}.json"
        with _log_client(w, state) as client:
            client.update()
        TransparencyLog.open(w.dir / "log").append(os.urandom(32))  # honest growth
        witness_round(w)
        with _log_client(w, state) as client:
            try:
                client.update()
                honest += 1
            except LogClientError:
                pass
        with forked_log(w.dir / "log"):
            witness_round(w)  # refuses: the fork does not extend what it cosigned
            accepted = False
            for saved in (state, None):
                with _log_client(w, saved) as client:
                    try:
                        client.update()
                        accepted = True
                    except LogClientError:
                        pass
        attacked += accepted
        witness_round(w)  # the fork is given up: the witness cosigns the honest head again
    return LinkingEstimate(
        "log_fork", trials, attacked, honest, {"attack": "a second head of the same size, signed with the log's key"}
    )
