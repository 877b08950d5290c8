"""HTTP helpers every streaming route shares: noticing a client that left, and closing the
generation behind a streamed body however the response ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

T = TypeVar("T")
CLIENT_GONE_STATUS = 499  # never seen by anyone: the client has left


async def until_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """Await `work`; if the client disconnects first, cancel it and return None."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return None
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class ClosingStream(StreamingResponse):
    """A streamed body that runs `close` however the response ends.

    Starlette does not close a body iterator it stops early (client gone, cancellation), so
    this does, which aborts the engine request at once rather than at garbage collection.
    """

    def __init__(
        self,
        body: AsyncIterator[bytes] | AsyncIterator[str],
        media_type: str,
        close: Callable[[], Awaitable[None]],
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(body, media_type=media_type, headers=headers)
        self._close = close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._close()
