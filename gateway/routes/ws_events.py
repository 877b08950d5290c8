"""WS `/ws/events`: the START / PROGRESS / COMPLETE protocol (start-progress-ws.md).

Each START runs on its own (several at once on one connection) and starts afresh: its id is
not a continuation key. ids share the gateway's in-flight check, under an `events:` prefix.
A frame's STARTs run through `BatchRunner.run` without a key, and `FrameEvents` decides what
the client sees: the echo once every START has passed its checks, then each START's events.
"""

from __future__ import annotations

import logging
from contextlib import aclosing

from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from gateway.routes.websocket_payloads import Outbox, serve_payloads
from gateway.state import Gateway
from protocols.names import Protocol
from protocols.ws_events import FrameEvents, decode_starts, encode_frame, error_event

log = logging.getLogger(__name__)


async def ws_events(websocket: WebSocket) -> None:
    await serve_payloads(websocket, _serve_frame, Protocol.WS_EVENTS)


async def _serve_frame(raw: bytes | str, gateway: Gateway, outbox: Outbox) -> None:
    accepted, refused = decode_starts(
        raw, gateway.settings.generation, gateway.settings.max_stop_sequences
    )
    frames = FrameEvents(accepted, refused)
    for frame in frames.frames([]):
        outbox.put_nowait(encode_frame(frame))
    if not accepted:
        return
    requests = [start.request(i) for i, start in enumerate(accepted)]
    steps = gateway.batches.run(requests, Protocol.WS_EVENTS)
    try:
        async with aclosing(steps):
            async for step in steps:
                for frame in frames.frames(step):
                    outbox.put_nowait(encode_frame(frame))
    except Exception as e:  # a bug must still end every START with one terminal event
        log.exception("START frame failed")
        message = f"Internal error: {type(e).__name__}: {e}"
        for event_id in frames.unfinished:
            outbox.put_nowait(encode_frame([error_event(event_id, message)]))


routes = [WebSocketRoute("/ws/events", ws_events)]
