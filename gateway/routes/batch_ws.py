"""WS `/ws`: the batch-events protocol (batch-events-ws.md).

Each payload runs as its own task (`serve_payloads`); a bug in one, or a client that does not
read, still ends each of its accepted prompts with one event.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing

from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from gateway.routes.outbox import Outbox
from gateway.routes.websocket_payloads import serve_payloads
from gateway.state import Gateway
from protocols.batch_events import NO_ID, ErrorEvent, PayloadFrames, encode_frame
from protocols.batch_payload import decode_batch, refuse_repeated_ids
from protocols.errors import GenerationError
from protocols.names import Protocol

log = logging.getLogger(__name__)


async def batch_events(websocket: WebSocket) -> None:
    await serve_payloads(websocket, Protocol.WS, _serve_payload, _refuse_payload)


async def _serve_payload(raw: bytes | str, gateway: Gateway, outbox: Outbox) -> None:
    try:
        batch = refuse_repeated_ids(
            decode_batch(
                raw, gateway.settings.generation, max_stop=gateway.settings.max_stop_sequences
            )
        )
    except GenerationError as e:
        outbox.put(encode_frame([ErrorEvent(NO_ID, e.message)]))
        return
    frames = PayloadFrames(batch.items, batch.rejected, only_new_tokens=batch.only_new_tokens)
    if not batch.items:  # nothing to run: the refusals are all there is
        for frame in frames.frames([]):
            outbox.put(encode_frame(frame))
        return
    steps = gateway.batches.run_prompts(
        batch.items, batch.options, stream=batch.stream, protocol=Protocol.WS
    )
    try:
        async with aclosing(steps):
            async for step in steps:
                for frame in frames.frames(step):
                    outbox.put(encode_frame(frame))
    except asyncio.CancelledError:
        if outbox.overflowed.is_set():  # the client does not read: its prompts end here
            for frame in frames.abandon(outbox.why):
                outbox.put(encode_frame(frame))
        raise
    except Exception as e:  # a bug must still end every accepted prompt with one event
        log.exception("payload failed")
        for frame in frames.abandon(f"Internal error: {type(e).__name__}: {e}"):
            outbox.put(encode_frame(frame))


def _refuse_payload(
    raw: bytes | str, gateway: Gateway, outbox: Outbox, error: GenerationError
) -> None:
    """One ERROR array: an event for each request_id the payload names (or one with no id)."""
    try:
        batch = decode_batch(raw, gateway.settings.generation)
        named = [item.request_id for item in batch.items] + [r.request_id for r in batch.rejected]
    except GenerationError:
        named = [NO_ID]
    ids = dict.fromkeys(NO_ID if rid is None else rid for rid in named)
    outbox.put(encode_frame([ErrorEvent(rid, error.message) for rid in ids]))


routes = [WebSocketRoute("/ws", batch_events)]
