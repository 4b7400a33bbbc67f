"""Reading an issuer's `/token-issuer-directory` (RFC 9578 section 4) to learn its token keys.

The gateway fetches it once at start: the keys are public, and a verifier needs nothing else
to check tokens. It waits a little for the issuer to come up, since `traceless up` starts
both at once.
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import httpx

from traceless.errors import TracelessError
from traceless.privacy.privacypass.errors import DecodeError
from traceless.privacy.privacypass.http import b64url_decode
from traceless.privacy.privacypass.keys import IssuerPublicKey
from traceless.privacy.privacypass.wire import TOKEN_TYPE_BLIND_RSA

DIRECTORY_PATH = "/token-issuer-directory"


class IssuerDirectoryError(TracelessError):
    """The issuer could not be reached, or its directory lists no usable token key."""


def parse_directory(body: object) -> list[IssuerPublicKey]:
    """The type-2 token keys of a directory, in its order (the first is preferred)."""
    entries = body.get("token-keys") if isinstance(body, dict) else None
    if not isinstance(entries, list):
        raise IssuerDirectoryError("issuer directory has no token-keys list")
    keys = []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("token-type") != TOKEN_TYPE_BLIND_RSA:
            continue  # other token types are not ours to verify
        encoded = entry.get("token-key")
        if not isinstance(encoded, str):
            raise IssuerDirectoryError("issuer directory holds a malformed token key")
        try:
            keys.append(IssuerPublicKey.from_spki(b64url_decode(encoded, "token-key")))
        except (DecodeError, TypeError, AttributeError):
            raise IssuerDirectoryError("issuer directory holds a malformed token key") from None
    if not keys:
        raise IssuerDirectoryError("issuer directory lists no token key of type 2")
    return keys


def issuer_name(issuer_url: str) -> str:
    """The issuer's server name (host[:port]) for TokenChallenge.issuer_name; no userinfo."""
    parts = urlsplit(issuer_url)
    if not parts.hostname:
        raise IssuerDirectoryError("issuer URL has no host")
    return parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"


def fetch_issuer_keys(issuer_url: str, wait_s: float = 10.0) -> list[IssuerPublicKey]:
    """GET the directory, retrying refused connections for up to `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    url = issuer_url.rstrip("/") + DIRECTORY_PATH
    while True:
        try:
            response = httpx.get(url, timeout=5.0, trust_env=False)
            break
        except httpx.TransportError:
            if time.monotonic() >= deadline:
                raise IssuerDirectoryError("the issuer could not be reached") from None
            time.sleep(0.2)
    if response.status_code != 200:
        raise IssuerDirectoryError(f"the issuer directory answered HTTP {response.status_code}")
    try:
        body = response.json()
    except ValueError:
        raise IssuerDirectoryError("the issuer directory is not JSON") from None
    return parse_directory(body)
