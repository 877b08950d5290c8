"""WS `/ws`: the batch-events protocol (batch-events-ws.md).

Each payload runs as its own task (`serve_payloads`); a bug in one, or a client that does not
read, still ends each of its accepted prompts with one event.
"""

from __future__ import annotations

from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from gateway.engine_path.batch import BatchRunner
from gateway.http.openapi import Op
from gateway.http.outbox import Outbox
from gateway.http.websocket_payloads import send_steps, serve_payloads
from gateway.state import Gateway
from protocols.batch_events import NO_ID, ErrorEvent, PayloadFrames, encode_frame
from protocols.batch_payload import decode_batch, refuse_repeated_ids
from protocols.errors import GenerationError
from protocols.names import Protocol


async def batch_events(websocket: WebSocket) -> None:
    await serve_payloads(websocket, Protocol.WS, _serve_payload, _refuse_payload)


async def _serve_payload(
    raw: bytes | str, gateway: Gateway, batches: BatchRunner, outbox: Outbox
) -> None:
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
    steps = batches.run_prompts(
        batch.items, batch.options, stream=batch.stream, protocol=Protocol.WS, adapter=batch.adapter
    )
    await send_steps(steps, frames, encode_frame, outbox)


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
operations: list[Op] = []  # a WebSocket: OpenAPI cannot describe it (docs/PROTOCOLS.md does)
