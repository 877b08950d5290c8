"""WS `/generate` and POST `/v1/generate`: the control protocol (control-ws.md).

The WebSocket feeds each client message to one `ControlSession`; a writer task sends what the
session says, in order. While the engine loads, the client gets `status` messages. The REST
route is a session that receives one `config`, answered as JSON or, with `stream`, as SSE
carrying the same messages.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import suppress

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from gateway.state import gateway_of
from gateway.control_session import ControlSession
from gateway.engine_holder import EngineHolder
from gateway.routes.http_errors import status_of
from gateway.routes.streaming import CLIENT_GONE_STATUS, ClosingStream, until_disconnect
from gateway.routes.websocket_payloads import write_frames
from protocols.control import (
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
from protocols.sse import sse_event

log = logging.getLogger(__name__)
STATUS_INTERVAL_SECONDS = 1.0
POLICY_VIOLATION = 1008
NO_CACHE = {"Cache-Control": "no-cache"}


async def control_ws(websocket: WebSocket) -> None:
    gateway = gateway_of(websocket)
    await websocket.accept()
    outbox: asyncio.Queue[bytes] = asyncio.Queue()
    session = ControlSession(gateway, lambda message: outbox.put_nowait(encode(message)))
    writer = asyncio.create_task(write_frames(websocket, outbox))
    ticker = asyncio.create_task(_loading_status(gateway.holder, session))
    connections = gateway.service.metrics.connections.labels("control")
    connections.inc()
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            try:
                decoded = decode_client(message.get("text") or message.get("bytes") or b"")
            except GenerationError as e:
                session.send(error_message(e))
                continue
            if session.state == "new" and not isinstance(decoded, Config):
                first = invalid("The first message must be a `config` message", "$.type")
                session.send(error_message(first, recoverable=False, recovery_action="reconnect"))
                await outbox.join()
                await websocket.close(POLICY_VIOLATION)
                break
            await session.handle(decoded)
    finally:
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


async def _sse(messages: asyncio.Queue[ServerMessage]) -> AsyncIterator[bytes]:
    while True:
        message = await messages.get()
        yield sse_event(encode(message))
        if isinstance(message, Completion | Error):
            return


async def _until_answer(
    messages: asyncio.Queue[ServerMessage],
) -> tuple[Init | None, Completion | Error]:
    init: Init | None = None
    while True:
        message = await messages.get()
        if isinstance(message, Init):
            init = message
        elif isinstance(message, Completion | Error):
            return init, message


async def rest_generate(request: Request) -> Response:
    gateway = gateway_of(request)
    try:
        config = rest_config(await request.body())
    except GenerationError as e:
        return _error_response(error_message(e), e.kind)
    messages: asyncio.Queue[ServerMessage] = asyncio.Queue()
    session = ControlSession(gateway, messages.put_nowait, protocol="v1_generate")
    await session.handle(config)
    if config.options.stream:
        return ClosingStream(_sse(messages), "text/event-stream", session.close, NO_CACHE)
    try:
        answer = await until_disconnect(request, _until_answer(messages))
    finally:
        await session.close()
    if answer is None:
        return Response(status_code=CLIENT_GONE_STATUS)
    init, last = answer
    if isinstance(last, Error):
        return _error_response(last, kind_of(last))
    body = rest_response(init.request_id if init else "", session.model, last)
    return Response(msgspec.json.encode(body), media_type="application/json")


def _error_response(error: Error, kind: ErrorKind) -> Response:
    return Response(encode(error), status_of(kind), media_type="application/json")


routes = [
    WebSocketRoute("/generate", control_ws),
    Route("/v1/generate", rest_generate, methods=["POST"]),
]
