"""HTTP answers over a generation, the machinery under gateway/http/prepared.py.

A streamed answer commits to its status only once the generation produced something worth
sending (`ready`), so a failure before that still gets the protocol's error status; the
body's generator and the source are closed however the response ends (finished, failed, or
the client gone), which aborts the engine requests; a client that leaves before the answer
cancels the work and gets 499, which nobody sees.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import aclosing
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from protocols.events import Delta, Event, Failed, Finished

T = TypeVar("T")
Step = list[Event]  # what one engine step brought a batch of prompts (BatchRunner.run)
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


async def _until_ready(source: AsyncIterator[T], ready: Callable[[T], bool]) -> list[T]:
    """The source's items up to and including the first that is `ready` (or its end)."""
    head: list[T] = []
    async for item in source:
        head.append(item)
        if ready(item):
            break
    return head


def ended(steps: Iterable[Step]) -> Finished | Failed:
    """A one-prompt answer's terminal event, from all its steps."""
    return next(e for step in steps for e in step if isinstance(e, Finished | Failed))


def has_output(step: Step) -> bool:
    """A step worth committing a stream on: text, or an end."""
    return any(isinstance(e, Delta | Finished | Failed) for e in step)


async def open_stream(
    request: Request, source: AsyncGenerator[T, None], ready: Callable[[T], bool]
) -> list[T] | None:
    """The source's items until one is `ready` to commit on; None (source closed) if the
    client left first."""
    head = await until_disconnect(request, _until_ready(source, ready))
    if head is None:
        await source.aclose()
    return head


def closer(*parts: AsyncGenerator[object, None]) -> Callable[[], Awaitable[None]]:
    """Closes a streamed body's generators, outermost first (also those never started)."""

    async def close() -> None:
        for part in parts:
            await part.aclose()

    return close


async def chained(head: list[T], rest: AsyncIterator[T]) -> AsyncIterator[T]:
    """What `open_stream` read before committing, then the rest of the source."""
    for item in head:
        yield item
    async for item in rest:
        yield item


async def collect(request: Request, source: AsyncGenerator[T, None]) -> list[T] | None:
    """Every item of the source, or None (the work cancelled) if the client left first."""

    async def drain() -> list[T]:
        async with aclosing(source):
            return [item async for item in source]

    return await until_disconnect(request, drain())


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
