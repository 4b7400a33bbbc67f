"""Request bodies that are not plain, valid JSON, each of which once answered a 500."""

BAD_JSON = {
    "nesting": b"[" * 60_000,  # past any recursion limit, under the test servers' 64 KiB body cap
    "long integer": b'{"model": "tiny", "prompt": "x", "max_tokens": ' + b"7" * 5000 + b"}",
    "lone surrogate": b'{"model": "tiny", "prompt": "a\\ud800b"}',
    "lone low surrogate in a key": b'{"model": "tiny", "\\udc00": 1}',
    "encoded surrogate bytes": b'{"model": "tiny", "prompt": "\xed\xa0\x80"}',
    "utf-16 body": '{"model": "tiny"}'.encode("utf-16"),
}
