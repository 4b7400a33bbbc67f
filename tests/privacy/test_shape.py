"""The bucket table and the fixed-size stream chunks (privacy/shape.py)."""

from __future__ import annotations

import pytest

from traceless.errors import ConfigError
from traceless.privacy.bhttp.stream import ResponseStreamDecoder, ResponseStreamEncoder
from traceless.privacy.shape import (
    BUCKETS,
    STREAM_CHUNK,
    ShapeError,
    ShapePadding,
    ShapePolicy,
    bucket_for,
    bucket_padding,
    content_room,
    json_filler,
    pack,
    split_sse,
    sse_filler,
)


def test_bucket_table_is_powers_of_two_from_1kib_to_16mib():
    assert BUCKETS[0] == 1024 and BUCKETS[-1] == 16 * 2**20
    assert all(b == 2 * a for a, b in zip(BUCKETS, BUCKETS[1:]))
    assert bucket_for(0) == bucket_for(1024) == 1024 and bucket_for(1025) == 2048
    assert bucket_for(3 * 2**20) == 4 * 2**20 and bucket_padding(1000) == 24
    with pytest.raises(ShapeError):
        bucket_for(16 * 2**20 + 1)
    with pytest.raises(ConfigError, match="shape padding must be one of buckets, off"):
        ShapePolicy("sometimes")
    with pytest.raises(ValueError):
        ShapePolicy(tick_ms=-1)


@pytest.mark.parametrize("total", [STREAM_CHUNK, STREAM_CHUNK - 2, STREAM_CHUNK - 37, 4096, 65536])
def test_every_chunk_has_exactly_its_size_and_the_events_come_back(total):
    events = [b"data: " + b"x" * n + b"\n\n" for n in (0, 1, 2, 3, 5, 57, 58, 59, 60, 61, 300, 1017, 1018, 5000)]
    pending, sent = bytearray(b"".join(events)), []
    while pending:
        chunk, took = pack(pending, total, sse_filler)
        assert len(chunk) == total
        del pending[:took]
        sent.append(chunk)
    # every filler length from 0 to 70 bytes after an event, and a chunk of filler alone
    tail = []
    for fill in range(71):
        event = b"data: " + b"y" * (content_room(total) - fill - 8) + b"\n\n"
        chunk, took = pack(bytearray(event), total, sse_filler)
        assert took == len(event) and len(chunk) == total
        sent.append(chunk)
        tail.append(event)
    sent.append(pack(bytearray(), total, sse_filler)[0])
    enc, dec = ResponseStreamEncoder(), ResponseStreamDecoder()
    items = dec.feed(enc.head(200) + b"".join(sent) + enc.end())
    assert dec.complete
    got = split_sse(b"".join(items[1:]))
    assert got == events + tail


def test_json_filler_is_whitespace():
    import json

    pending = bytearray(b'{"a": 1}')
    chunk, took = pack(pending, 1024, json_filler)
    assert took == 8 and len(chunk) == 1024 and json.loads(chunk[2:]) == {"a": 1}


def test_the_padding_mode_is_an_enum_and_its_word_is_what_is_measured():
    assert ShapePolicy("off").padding is ShapePadding.OFF and not ShapePolicy("off").on
    assert ShapePolicy().padding is ShapePadding.BUCKETS and ShapePolicy().on
    assert ShapePolicy().measured()["shape_padding"] == "buckets"
    assert ShapePolicy(ShapePadding.OFF, 0).measured()["shape_padding"] == "off"
