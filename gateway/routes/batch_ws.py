"""WS `/ws`: the batch-events protocol (batch-events-ws.md).

Each payload runs as its own task, so several payloads on one connection run concurrently;
one writer task sends every frame, so frames of different payloads never interleave inside a
message. When the client leaves, every task of the connection is cancelled, which aborts its
engine requests.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing, suppress

from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway.app import Gateway, gateway_of
from protocols.batch_events import (
    ErrorEvent,
    accepted_frame,
    encode_frame,
    rejected_frame,
    to_frames,
)
from protocols.batch_payload import decode_batch
from protocols.errors import GenerationError
from protocols.generation import Failed, Finished

log = logging.getLogger(__name__)

Outbox = asyncio.Queue[bytes]


async def batch_events(websocket: WebSocket) -> None:
    gateway = gateway_of(websocket)
    await websocket.accept()
    outbox: Outbox = asyncio.Queue()
    writer = asyncio.create_task(_write(websocket, outbox))
    payloads: set[asyncio.Task[None]] = set()
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            raw = message.get("text") or message.get("bytes") or b""
            task = asyncio.create_task(_serve_payload(raw, gateway, outbox))
            payloads.add(task)
            task.add_done_callback(payloads.discard)
    finally:
        for task in (*payloads, writer):
            task.cancel()
        await asyncio.gather(*payloads, writer, return_exceptions=True)


async def _write(websocket: WebSocket, outbox: Outbox) -> None:
    with suppress(WebSocketDisconnect, RuntimeError):
        while True:
            frame = await outbox.get()
            await websocket.send({"type": "websocket.send", "text": frame.decode()})


async def _serve_payload(raw: bytes | str, gateway: Gateway, outbox: Outbox) -> None:
    try:
        batch = decode_batch(raw, gateway.settings.generation)
    except GenerationError as e:
        outbox.put_nowait(encode_frame([ErrorEvent(None, e.message)]))
        return
    if batch.items:
        outbox.put_nowait(encode_frame(accepted_frame(batch.items)))
    if batch.rejected:
        outbox.put_nowait(encode_frame(rejected_frame(batch.rejected)))
    if not batch.items:
        return
    unfinished = {item.request_id for item in batch.items}
    steps = gateway.service.run(batch.items, batch.options, stream=batch.stream)
    try:
        async with aclosing(steps):
            async for step in steps:
                for frame in to_frames(step, batch.items, only_new_tokens=batch.only_new_tokens):
                    outbox.put_nowait(encode_frame(frame))
                unfinished.difference_update(
                    batch.items[e.index].request_id
                    for e in step
                    if isinstance(e, Finished | Failed)
                )
    except Exception as e:  # a bug must still end every accepted prompt with one event
        log.exception("payload failed")
        message = f"Internal error: {type(e).__name__}: {e}"
        outbox.put_nowait(encode_frame([ErrorEvent(rid, message) for rid in sorted(unfinished)]))


routes = [WebSocketRoute("/ws", batch_events)]
