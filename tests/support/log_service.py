"""Test helpers: run the log service on a free loopback port (real HTTP), forge a log's history."""

import json

from cryptography.hazmat.primitives import serialization

from traceless.http.serve import serve_in_thread
from traceless.privacy.translog import log as tl
from traceless.privacy.translog.merkle import leaf_hash, merkle_tree_hash
from traceless.privacy.translog.tree_head import sign_tree_head
from traceless_tools.cluster.log_service import build_server


def running_log_service(log_dir, witness_keys=()):
    return serve_in_thread(server=build_server(log_dir, witness_keys=tuple(witness_keys)), what="log service")


def rewrite_history(directory, leaves):
    """What a log operator holding the key could do: replace the history and re-sign it."""
    key = serialization.load_pem_private_key((directory / tl.SIGNING_KEY).read_bytes(), None)
    records = b"".join(len(x).to_bytes(4, "big") + x + leaf_hash(x) for x in leaves)
    (directory / tl.ENTRIES).write_bytes(tl.MAGIC + records)
    old = json.loads((directory / tl.STH).read_text())
    sth = sign_tree_head(key, len(leaves), old["timestamp"] + 1, merkle_tree_hash(leaves))
    (directory / tl.STH).write_text(json.dumps(sth.to_json()))
