"""The client draws the node for a request itself (DESIGN invariant 6).

Among the candidates it verified, node i is drawn with probability C_i / sum(C), C_i the capacity
the node's attestation claims (and its logged release allows). Nothing the gateway says enters:
not its order, not a number it announces. The draw uses the OS CSPRNG unless a test passes `rng`.
"""
from __future__ import annotations

import math
import random
import secrets
from collections.abc import Sequence

from traceless.client.node_verifier import VerifiedNode


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
