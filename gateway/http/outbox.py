"""What waits to be written to one client, bounded: MAX_QUEUED_BYTES_PER_CONNECTION.

uvicorn writes a WebSocket message, or a chunk of an HTTP stream, only while the connection's
transport takes more (asyncio's 64 KiB write buffer): a client that does not read stops the
one writer, and what its generations go on producing waits in its outbox. Past the bound the
outbox overflows; the route then stops reading from that client, aborts its generations, ends
each with its protocol's error event and closes (WebSocket 1008). Nothing queued is dropped, so
each prompt keeps exactly one terminal event, for a client that reads again.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Generic, TypeVar

from starlette.websockets import WebSocket, WebSocketDisconnect

T = TypeVar("T")
GOING_AWAY = 1001
POLICY_VIOLATION = 1008


def not_reading(max_bytes: int) -> str:
    """Why the connection ends: also its close reason, so at most 123 bytes."""
    return (
        f"The client did not read: over {max_bytes} bytes waited for it "
        "(MAX_QUEUED_BYTES_PER_CONNECTION)"
    )


class BoundedQueue(Generic[T]):
    """Items waiting for one client, in order. `put` never waits; past `max_bytes`, with more
    than one item waiting (one larger item alone is a large answer, not a slow client), the
    queue is `overflowed`."""

    def __init__(self, max_bytes: int, size: Callable[[T], int]) -> None:
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        self.overflowed = asyncio.Event()
        self._size = size
        self._items: deque[tuple[T, int]] = deque()
        self._reader: asyncio.Future[None] | None = None  # the one `get` waiting, if any

    @property
    def why(self) -> str:
        return not_reading(self.max_bytes)

    def put(self, item: T) -> None:
        size = self._size(item)
        self._items.append((item, size))
        self.queued_bytes += size
        if self.queued_bytes > self.max_bytes and len(self._items) > 1:
            self.overflowed.set()
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)

    async def get(self) -> T:
        """The next item, once there is one (one reader at a time)."""
        while not self._items:
            self._reader = asyncio.get_running_loop().create_future()
            try:
                await self._reader
            finally:
                self._reader = None
        item, size = self._items.popleft()
        self.queued_bytes -= size
        return item


@dataclass(frozen=True)
class Close:
    code: int
    reason: str = ""


def _frame_size(frame: bytes | Close) -> int:
    return len(frame) if isinstance(frame, bytes) else 0


class Outbox(BoundedQueue[bytes | Close]):
    """One WebSocket's frames and the one task that sends them, in order, so frames never
    interleave; `close` ends the connection once everything queued before it is sent."""

    def __init__(self, websocket: WebSocket, max_bytes: int) -> None:
        super().__init__(max_bytes, _frame_size)
        self._writer = asyncio.create_task(self._write(websocket))

    def close(self, code: int, reason: str = "") -> None:
        self.put(Close(code, reason))

    async def closed(self) -> None:
        """Returns once the connection is closed (or the client left); never cancels the
        writer, whoever waits."""
        await asyncio.wait({self._writer})

    async def stop(self) -> None:
        """Nothing more is sent (the client left, or the connection ended)."""
        self._writer.cancel()
        await asyncio.gather(self._writer, return_exceptions=True)

    async def _write(self, websocket: WebSocket) -> None:
        with suppress(WebSocketDisconnect, RuntimeError):  # the client left
            while True:
                frame = await self.get()
                if isinstance(frame, Close):
                    await websocket.close(frame.code, frame.reason)
                    return
                await websocket.send({"type": "websocket.send", "text": frame.decode()})


async def close_going_away(outbox: Outbox) -> None:
    """The drain's end: send what is queued, then close with 1001 (the server is going away)."""
    outbox.close(GOING_AWAY)
    await outbox.closed()


async def until_overflow(reader: asyncio.Task[None], outbox: BoundedQueue[T]) -> bool:
    """Waits for the client's reader to end (the client left) or the outbox to overflow:
    True, with the reader cancelled (nothing more is read from that client), when it
    overflowed first."""
    overflow = asyncio.ensure_future(outbox.overflowed.wait())
    try:
        await asyncio.wait({reader, overflow}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        overflow.cancel()
    if reader.done():
        reader.result()  # a bug in the reader surfaces
        return False
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    return True
