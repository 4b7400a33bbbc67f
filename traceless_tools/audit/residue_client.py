"""Bare clients for audits: OHTTP straight to a node (no gateway, no tokens), and plain HTTP to
`traceless serve`, with the same calls so one workload drives both."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from traceless.privacy.ohttp.call import OhttpCall, encapsulate_call, open_response
from traceless.privacy.ohttp.keys import decode_ohttp_keys


class OhttpTestClient:
    def __init__(self, node_url: str, offload_dir: Path, log_path: Path | None = None):
        self.url = node_url
        self.offload_dir = offload_dir
        self.log_path = log_path
        self.config = decode_ohttp_keys(httpx.get(node_url + "/pcc/v1/ohttp-keys").content)[0]
        self.spill_files_seen: set[str] = set()

    def _call(self, path: bytes, body: dict, stream: bool) -> OhttpCall:
        return encapsulate_call(self.config, path, json.dumps(body).encode(), stream=stream)  # as the client sends it

    def completion(self, body: dict, path: bytes = b"/v1/completions") -> int:
        call = self._call(path, body, stream=False)
        r = httpx.post(
            self.url + "/pcc/v1/ohttp", content=call.body, headers={"content-type": call.media_type}, timeout=600
        )
        return open_response(call, r.content).status

    def chat(self, body: dict) -> int:
        return self.completion(body, b"/v1/chat/completions")

    def stream(self, body: dict, abort_after: int | None = None) -> None:
        call = self._call(b"/v1/completions", {**body, "stream": True}, stream=True)
        with httpx.stream(
            "POST",
            self.url + "/pcc/v1/ohttp",
            content=call.body,
            headers={"content-type": call.media_type},
            timeout=600,
        ) as r:
            for i, _ in enumerate(r.iter_raw()):
                if abort_after is not None and i + 1 >= abort_after:
                    return  # leaving the block closes the connection: the node must abort

    def model_name(self) -> str:
        if self.log_path is None:
            raise RuntimeError("this client was given no node log to read the model name from")
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("model: "):
                return line.split(": ", 1)[1].strip()
        raise RuntimeError("the node did not report its model name")


class PlainTestClient:
    """The same calls as OhttpTestClient, as plain HTTP to `traceless serve`. Every call opens and
    closes its own connection, as separate clients would."""

    def __init__(self, url: str, offload_dir: Path):
        self.url = url
        self.offload_dir = offload_dir
        self.spill_files_seen: set[str] = set()

    def completion(self, body: dict, path: str = "/v1/completions") -> int:
        return httpx.post(self.url + path, json=body, timeout=600).status_code

    def chat(self, body: dict) -> int:
        return self.completion(body, "/v1/chat/completions")

    def stream(self, body: dict, abort_after: int | None = None) -> None:
        with httpx.stream("POST", self.url + "/v1/completions", json={**body, "stream": True}, timeout=600) as r:
            for i, _ in enumerate(r.iter_raw()):
                if abort_after is not None and i + 1 >= abort_after:
                    return  # leaving the block closes the connection: the server must abort

    def model_name(self) -> str:
        return httpx.get(self.url + "/v1/models").json()["data"][0]["id"]
