"""The one capture of schema events (traceless/events.py) for tests: the `captured_events` fixture
(tests/conftest.py) is this, around one test."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from traceless import events


class EventLog:
    """What the event logger wrote: `log()` the events as dicts, `log.text()` the raw lines."""

    def __init__(self, stream: io.StringIO):
        self._stream = stream

    def text(self) -> str:
        return self._stream.getvalue()

    def __call__(self) -> list[dict]:
        return [json.loads(line) for line in self.text().splitlines()]


@contextmanager
def capture_events() -> Iterator[EventLog]:
    """Every event emitted inside the block, at INFO; the logger's level, propagation and handlers
    as they were afterwards (the handler is removed before its stream could be closed)."""
    stream = io.StringIO()
    logger = logging.getLogger(events.LOGGER_NAME)
    handler = logging.StreamHandler(stream)
    old_level, old_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield EventLog(stream)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate
