"""The shape shared by the payload WebSockets (`/ws`, `/ws/events`).

Each client message runs as its own task, so several on one connection run concurrently; one
writer task sends every frame, so frames never interleave inside a message. When the client
leaves, every task of the connection is cancelled, which aborts its engine requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from contextlib import suppress
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway.state import Gateway, gateway_of
from protocols.names import Protocol

GOING_AWAY = 1001
Outbox = asyncio.Queue[bytes]
Handler = Callable[[bytes | str, Gateway, Outbox], Coroutine[Any, Any, None]]


async def serve_payloads(websocket: WebSocket, handle: Handler, protocol: Protocol) -> None:
    """Serve one connection, counted in the protocol's open connections while it is open."""
    gateway = gateway_of(websocket)
    connections = gateway.service.metrics.connections.labels(protocol)
    await websocket.accept()
    connections.inc()
    outbox: Outbox = asyncio.Queue()
    writer = asyncio.create_task(write_frames(websocket, outbox))
    payloads: set[asyncio.Task[None]] = set()

    async def going_away() -> None:  # the drain's end: every payload has its last frame
        await asyncio.gather(*payloads, return_exceptions=True)
        await close_going_away(websocket, outbox)

    forget = gateway.drain.on_drained(going_away)
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            raw = message.get("text") or message.get("bytes") or b""
            task = asyncio.create_task(handle(raw, gateway, outbox))
            payloads.add(task)
            task.add_done_callback(payloads.discard)
    finally:
        forget()
        connections.dec()
        for task in (*payloads, writer):
            task.cancel()
        await asyncio.gather(*payloads, writer, return_exceptions=True)


async def write_frames(websocket: WebSocket, outbox: Outbox) -> None:
    """Send each queued frame as one text message, in order, until the client is gone."""
    with suppress(WebSocketDisconnect, RuntimeError):
        while True:
            frame = await outbox.get()
            try:
                await websocket.send({"type": "websocket.send", "text": frame.decode()})
            finally:
                outbox.task_done()


async def close_going_away(websocket: WebSocket, outbox: Outbox) -> None:
    """Send what is queued, then close with 1001: the server is going away."""
    await outbox.join()
    with suppress(RuntimeError):  # the client left first
        await websocket.close(GOING_AWAY)
