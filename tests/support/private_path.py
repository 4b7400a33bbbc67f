"""A client of a `traceless up` deployment, configured from its endpoints as `traceless up` runs its proxy."""

from __future__ import annotations

import base64

from traceless.privacy.attestation.policy import AttesterPolicy
from traceless.privacy.translog.release_policy import ReleasePolicy
from traceless_tools.client.private_client import ClientConfig


def client_config(e: dict, relay: str, **changes) -> ClientConfig:
    cfg = dict(
        issuer_url=e["issuer"],
        api_key=e["api_key"],
        relay_url=relay,
        log_url=e["log"],
        log_public_key=base64.b64decode(e["log_public_key"]),
        attester_keys=tuple(base64.b64decode(k) for k in e["attester_keys"]),
        model=e["model"],
        witness_keys=(base64.b64decode(e["witness_public_key"]),),
        release_policy=ReleasePolicy.from_waivers(e["release_waivers"]),
        attester_policy=AttesterPolicy.DEVELOPMENT,
    )  # as `traceless up` runs the proxy
    cfg.update(changes)
    return ClientConfig(**cfg)
