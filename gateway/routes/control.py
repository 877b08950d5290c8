"""WS `/generate` and POST `/v1/generate`: the control protocol (control-ws.md).

The WebSocket feeds each client message to one `ControlSession`; a writer task sends what the
session says, in order. While the engine loads, the client gets `status` messages. The REST
route is a session that receives one `config`, answered as JSON or, with `stream`, as SSE
carrying the same messages.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import suppress

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from gateway.edge.http_errors import status_of
from gateway.engine.holder import EngineHolder
from gateway.engine_path.control_session import ControlSession
from gateway.routes.streaming import chained, client_gone, collect, stream_answer
from gateway.routes.websocket_payloads import close_going_away, write_frames
from gateway.state import gateway_of
from protocols.control import (
    ClientMessage,
    Completion,
    Config,
    Error,
    Init,
    ServerMessage,
    Status,
    decode_client,
    encode,
    error_message,
    kind_of,
    rest_config,
    rest_response,
)
from protocols.errors import ErrorKind, GenerationError, invalid
from protocols.names import Protocol
from protocols.sse import sse_event

log = logging.getLogger(__name__)
STATUS_INTERVAL_SECONDS = 1.0
POLICY_VIOLATION = 1008
NO_CACHE = {"Cache-Control": "no-cache"}


async def control_ws(websocket: WebSocket) -> None:
    gateway = gateway_of(websocket)
    await websocket.accept()
    outbox: asyncio.Queue[bytes] = asyncio.Queue()
    session = ControlSession(
        gateway.settings,
        gateway.service,
        gateway.feedback,
        lambda message: outbox.put_nowait(encode(message)),
    )
    writer = asyncio.create_task(write_frames(websocket, outbox))
    ticker = asyncio.create_task(_loading_status(gateway.holder, session))
    connections = gateway.service.metrics.connections.labels(Protocol.CONTROL)
    connections.inc()
    forget = gateway.drain.on_drained(lambda: close_going_away(websocket, outbox))
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            decoded: ClientMessage | None = None
            try:
                decoded = decode_client(message.get("text") or message.get("bytes") or b"")
            except GenerationError as e:
                if session.state != "new" or e.field != "$.type":  # a bad config may be retried
                    session.refuse(e)
                    continue
            if session.state == "new" and not isinstance(decoded, Config):
                first = invalid("The first message must be a `config` message", "$.type")
                session.send(error_message(first, recoverable=False, recovery_action="reconnect"))
                await outbox.join()
                await websocket.close(POLICY_VIOLATION)
                break
            if decoded is not None:
                await session.handle(decoded)
    finally:
        forget()
        connections.dec()
        await session.close()
        ticker.cancel()
        with suppress(Exception):
            await asyncio.wait_for(outbox.join(), 1.0)  # let the last messages go out
        writer.cancel()
        await asyncio.gather(writer, ticker, return_exceptions=True)


async def _loading_status(holder: EngineHolder, session: ControlSession) -> None:
    """`status` every second while the engine loads, so a waiting client sees progress."""
    while not holder.ready and holder.status == "loading":
        progress, eta = holder.loading_progress()
        session.send(
            Status("model_loading", progress, "Loading the model and starting the engine", eta)
        )
        await asyncio.sleep(STATUS_INTERVAL_SECONDS)


# --- POST /v1/generate ---------------------------------------------------------------------


async def _messages(
    session: ControlSession, queue: asyncio.Queue[ServerMessage]
) -> AsyncGenerator[ServerMessage, None]:
    """The session's messages up to its last (a completion or an error); closing this (the
    answer ended, or its client left) ends the session, which aborts its engine request."""
    try:
        while True:
            message = await queue.get()
            yield message
            if isinstance(message, Completion | Error):
                return
    finally:
        await session.close()


async def _sse(
    head: list[ServerMessage], rest: AsyncIterator[ServerMessage]
) -> AsyncGenerator[bytes, None]:
    async for message in chained(head, rest):
        yield sse_event(encode(message))


def _refusal(head: list[ServerMessage]) -> Response | None:
    """An error before `init` (the prompt was refused) keeps its HTTP status."""
    first = head[0]
    return _error_response(first, kind_of(first)) if isinstance(first, Error) else None


async def v1_generate(request: Request) -> Response:
    gateway = gateway_of(request)
    try:
        config = rest_config(await request.body(), gateway.settings.max_stop_sequences)
    except GenerationError as e:
        return _error_response(error_message(e), e.kind)
    queue: asyncio.Queue[ServerMessage] = asyncio.Queue()
    session = ControlSession(
        gateway.settings,
        gateway.service,
        gateway.feedback,
        queue.put_nowait,
        protocol=Protocol.V1_GENERATE,
    )
    await session.handle(config)
    messages = _messages(session, queue)
    if config.options.stream:
        return await stream_answer(
            request,
            messages,
            ready=lambda _: True,
            refuse=_refusal,
            body=_sse,
            media_type="text/event-stream",
            headers=NO_CACHE,
        )
    answer = await collect(request, messages)
    if answer is None:
        return client_gone()
    last = answer[-1]
    if isinstance(last, Error):
        return _error_response(last, kind_of(last))
    assert isinstance(last, Completion)
    init = next((m for m in answer if isinstance(m, Init)), None)
    body = rest_response(init.request_id if init else "", session.model, last)
    return Response(msgspec.json.encode(body), media_type="application/json")


def _error_response(error: Error, kind: ErrorKind) -> Response:
    return Response(encode(error), status_of(kind), media_type="application/json")


routes = [
    WebSocketRoute("/generate", control_ws),
    Route("/v1/generate", v1_generate, methods=["POST"]),
]
