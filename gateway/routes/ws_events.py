"""WS `/ws/events`: the START / PROGRESS / COMPLETE protocol (start-progress-ws.md).

Each START runs on its own (several at once on one connection) and starts afresh: its id is
not a continuation key. ids share the gateway's in-flight check, under an `events:` prefix.
A frame's STARTs run through `BatchRunner.run` without a key, and `FrameEvents` decides what
the client sees: the echo once every START has passed its checks, then each START's events.
"""

from __future__ import annotations

from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from gateway.engine_path.batch import BatchRunner
from gateway.http.openapi import Op
from gateway.http.outbox import Outbox
from gateway.http.websocket_payloads import send_steps, serve_payloads
from gateway.state import Gateway
from protocols.errors import GenerationError
from protocols.names import Protocol
from protocols.ws_events import Error, FrameEvents, decode_starts, encode_frame


async def ws_events(websocket: WebSocket) -> None:
    await serve_payloads(websocket, Protocol.WS_EVENTS, _serve_frame, _refuse_frame)


async def _serve_frame(
    raw: bytes | str, gateway: Gateway, batches: BatchRunner, outbox: Outbox
) -> None:
    accepted, refused = decode_starts(
        raw, gateway.settings.generation, gateway.settings.max_stop_sequences
    )
    frames = FrameEvents(accepted, refused)
    for frame in frames.frames([]):
        outbox.put(encode_frame(frame))
    if not accepted:
        return
    requests = [start.request(i) for i, start in enumerate(accepted)]
    steps = batches.run(requests, Protocol.WS_EVENTS)
    await send_steps(steps, frames, encode_frame, outbox)


def _refuse_frame(
    raw: bytes | str, gateway: Gateway, outbox: Outbox, error: GenerationError
) -> None:
    """One ERROR array: an event for each id the frame names (null for one it cannot read)."""
    accepted, refused = decode_starts(raw, gateway.settings.generation)
    named = [a.start.id for a in accepted] + [r.error.id for r in refused]
    outbox.put(encode_frame([Error(event_id, error.message) for event_id in dict.fromkeys(named)]))


routes = [WebSocketRoute("/ws/events", ws_events)]
operations: list[Op] = []  # a WebSocket: OpenAPI cannot describe it (docs/PROTOCOLS.md does)
