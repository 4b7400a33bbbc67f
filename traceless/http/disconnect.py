"""Racing a request's work against its client's disconnect: work for a client that left is
cancelled (which aborts every engine request it started), not run to its end."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


async def until_disconnect(request: Request) -> None:
    """Return when the client disconnects (call it once the body has been read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def race_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """The work's result, or None when the client left first (the work is then cancelled)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(until_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler itself was cancelled: so is the work
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task not in done:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return None
    return task.result()
