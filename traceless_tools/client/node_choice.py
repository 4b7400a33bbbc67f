"""The client draws the node for a request itself (threat T13, docs/threat-model.md), and a failed request's
draw is kept for the next request (threat T18).

Among the candidates it verified, node i is drawn with probability C_i / sum(C), C_i the capacity
the node's attestation claims (and its logged release allows). Nothing the gateway says enters:
not its order, not a number it announces. The draw uses the OS CSPRNG unless a test passes `rng`.

`Draws` keeps the draw of every request that failed (a 5xx, a dropped stream, a token refused, an
unreachable relay) and hands it to the next request before any fresh draw: each draw is used until
a request on it is answered. So what is answered is distributed as what is drawn, whatever fails:
a gateway that fails every request not bound for its own node (and a caller, such as the openai
SDK, that retries each failure) gets its capacity share and no more. A kept draw lapses when its
node (by attester key) is no longer among the verified candidates.
"""

from __future__ import annotations

import math
import random
import secrets
from collections import deque
from collections.abc import Sequence

from traceless_tools.client.node_verifier import VerifiedNode

MAX_KEPT_DRAWS = 256


def draw_node(nodes: Sequence[VerifiedNode], rng: random.Random | None = None) -> VerifiedNode:
    """One of `nodes`, by attested capacity; LookupError when there is none."""
    if not nodes:
        raise LookupError("no verified node to draw from")
    rng = rng if rng is not None else secrets.SystemRandom()
    # Sorted by node_id so the same set gives the same draw for the same random number, whatever
    # order it came in.
    pool = sorted(nodes, key=lambda node: node.node_id)
    point = rng.random() * math.fsum(node.capacity for node in pool)
    cumulative = 0.0
    for node in pool:
        cumulative += node.capacity
        if point < cumulative:
            return node
    return pool[-1]  # point landed on the total through float rounding


class Draws:
    """Fresh draws, and the kept draws of failed requests (by attester key), used first."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng
        self._kept: deque[str] = deque(maxlen=MAX_KEPT_DRAWS)

    def take(self, nodes: Sequence[VerifiedNode]) -> VerifiedNode:
        """A kept draw whose node is still verified, else a fresh draw."""
        by_key = {node.attester_kid: node for node in nodes}
        while self._kept:
            node = by_key.get(self._kept.popleft())
            if node is not None:
                return node
        return draw_node(nodes, self._rng)

    def keep(self, node: VerifiedNode) -> None:
        """The request on `node` failed: its draw serves the next request."""
        self._kept.appendleft(node.attester_kid)

    def __len__(self) -> int:
        return len(self._kept)
