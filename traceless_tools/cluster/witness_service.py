"""`traceless log witness`: poll a log, cosign its head if it extends the last one cosigned, hand
the cosignature to the log (POST /log/v1/cosignature), which serves it with the head.

The witness has no listener of its own: everything it says is in the log's cosigned tree head,
and clients check it against the witness key they were given out of band. A head that does not
extend the recorded one is never cosigned; the witness keeps running (and keeps refusing), so the
fork shows as cosignatures that stop, which clients turn into refusals once they are too old.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from traceless.events import emit
from traceless.privacy.translog.client import LogClient, LogClientError
from traceless.privacy.translog.witness import CosignedHead, Witness

COMPONENT = "witness"


class CosignatureRejectedError(LogClientError):
    """The log did not take the cosignature (a new head meanwhile, or the witness key unknown to it)."""

    result = "rejected"


def submit(http: httpx.Client, log_url: str, head: CosignedHead) -> None:
    try:
        r = http.post(
            log_url.rstrip("/") + "/log/v1/cosignature",
            json={"sth": head.sth.to_json(), "cosignature": head.cosignature.to_json()},
        )
    except httpx.HTTPError as e:
        raise CosignatureRejectedError(f"log unreachable ({type(e).__name__})") from None
    if r.status_code != 200:
        raise CosignatureRejectedError(f"the log answered HTTP {r.status_code} to the cosignature")


def witness_once(witness: Witness, log: LogClient, http: httpx.Client, log_url: str) -> CosignedHead | None:
    """One round: the head cosigned and handed in, or None (the reason is emitted as an event)."""
    try:
        head = witness.cosign_latest(log)
        submit(http, log_url, head)
    except LogClientError as e:
        reason = (
            e.result
            if e.result
            in (
                "inconsistent",
                "bad_signature",
                "key_mismatch",
                "root_mismatch",
                "bad_proof",
                "unreachable",
                "rejected",
            )
            else "protocol"
        )
        emit("witness.refused", reason=reason)
        return None
    emit("witness.cosigned", tree_size=head.sth.tree_size)
    return head


def run(
    witness: Witness,
    log_url: str,
    interval_s: float,
    *,
    rounds: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Witness the log every `interval_s` seconds (forever, or `rounds` times)."""
    with httpx.Client(timeout=10.0) as http, LogClient(log_url, witness.log_public_key, http=http) as log:
        done = 0
        while rounds is None or done < rounds:
            witness_once(witness, log, http, log_url)
            done += 1
            if rounds is None or done < rounds:
                sleep(interval_s)
