"""WS `/ws/events`: the START / PROGRESS / COMPLETE protocol (start-progress-ws.md).

Each START runs on its own (several at once on one connection) and starts afresh: its id is
not a continuation key. ids share the gateway's in-flight check, under an `events:` prefix.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing

from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from gateway.routes.websocket_payloads import Outbox, serve_payloads
from gateway.state import Gateway
from protocols.generation import Delta, Failed, Finished, GenerationRequest
from protocols.names import Protocol
from protocols.ws_events import (
    Accepted,
    Complete,
    Progress,
    decode_starts,
    encode_frame,
    error_event,
)

log = logging.getLogger(__name__)


async def ws_events(websocket: WebSocket) -> None:
    await serve_payloads(websocket, _serve_frame, Protocol.WS_EVENTS)


async def _serve_frame(raw: bytes | str, gateway: Gateway, outbox: Outbox) -> None:
    accepted, errors = decode_starts(raw, gateway.settings.generation)
    if accepted:
        outbox.put_nowait(encode_frame([a.start for a in accepted]))
    if errors:
        outbox.put_nowait(encode_frame(list(errors)))
    await asyncio.gather(*(_run(start, gateway, outbox) for start in accepted))


async def _run(accepted: Accepted, gateway: Gateway, outbox: Outbox) -> None:
    event_id = accepted.start.id
    request = GenerationRequest(
        options=accepted.options, prompt=accepted.start.data, request_id=f"events:{event_id}"
    )
    events = gateway.service.generate(request, Protocol.WS_EVENTS)
    try:
        async with aclosing(events):
            async for event in events:
                match event:
                    case Delta(text=text) if text:
                        outbox.put_nowait(encode_frame([Progress(event_id, text)]))
                    case Finished(history=after, sequences=[new, *_]):
                        done = Complete(event_id, new.text, after.ended_at_eos)
                        outbox.put_nowait(encode_frame([done]))
                    case Failed(message=message, field=field):
                        outbox.put_nowait(encode_frame([error_event(event_id, message, field)]))
    except Exception as e:  # a bug must still end the START with one terminal event
        log.exception("START %r failed", event_id)
        outbox.put_nowait(encode_frame([error_event(event_id, f"Internal error: {e}")]))


routes = [WebSocketRoute("/ws/events", ws_events)]
