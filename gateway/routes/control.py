"""WS `/generate` and POST `/v1/generate`: the control protocol (control-ws.md).

The WebSocket feeds each client message to one `ControlSession`; a writer task sends what the
session says, in order (gateway/http/outbox.py: a client that does not read has its
generation end with a `memory_pressure` error and the connection closed with 1008). While the
engine loads, the client gets `status` messages. The REST route is a session that receives
one `config`, answered as JSON or, with `stream`, as SSE carrying the same messages, through
the same bounded queue. With REATTACH_SECONDS, a WebSocket whose client drops leaves its
running generation waiting (gateway/engine_path/reattach.py), and a `reattach` on another
connection makes that generation's session the connection's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

import msgspec
from prometheus_client import Counter
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from gateway.edge.caller import current_caller
from gateway.edge.http_errors import status_of
from gateway.engine_path.chat_model import ChatModel
from gateway.engine_path.chat_models import ChatModels
from gateway.engine_path.control_session import ControlSession
from gateway.engine_path.reattach import Detached
from gateway.engine_path.served_model import ServedModel
from gateway.http.model_choice import asked_model
from gateway.http.openapi import GATEWAY_ERRORS, Events, Op
from gateway.http.outbox import (
    POLICY_VIOLATION,
    BoundedQueue,
    Outbox,
    close_going_away,
    until_overflow,
)
from gateway.http.prepared import (
    CLIENT_GONE,
    JSON,
    SSE,
    Chunk,
    Prepared,
    Whole,
    streamed,
    to_response,
)
from gateway.http.streaming import chained, collect
from gateway.observability.tracing import refused
from gateway.state import gateway_of
from protocols.control import (
    ClientMessage,
    Completion,
    Config,
    Error,
    Init,
    Reattach,
    RestRequest,
    RestResponse,
    ServerMessage,
    Status,
    decode_client,
    encode,
    error_message,
    kind_of,
    rest_config,
    rest_response,
    type_of,
)
from protocols.errors import ErrorKind, GenerationError, invalid
from protocols.names import Protocol
from protocols.sse import sse_event

log = logging.getLogger(__name__)
STATUS_INTERVAL_SECONDS = 1.0
NO_CACHE = {"Cache-Control": "no-cache"}


@dataclass
class _Connection:
    """One WebSocket's session: its own, or the one it reattached to."""

    session: ControlSession
    loading: asyncio.Task[None] | None = None  # statuses while a config's model loads


async def control_ws(websocket: WebSocket) -> None:
    gateway = gateway_of(websocket)
    metrics = gateway.service.metrics
    await websocket.accept()
    outbox = Outbox(websocket, gateway.settings.max_queued_bytes_per_connection)

    def deliver(message: ServerMessage) -> None:
        outbox.put(encode(message))

    session = ControlSession(
        gateway.settings,
        gateway.chats,
        gateway.feedback,
        gateway.feedback_limits,
        deliver,
        replay=gateway.detached.replay(),
        task_of=gateway.models.task_of,
        asked=asked_model(websocket, None),
    )
    connection = _Connection(session)
    ticker = asyncio.create_task(_loading_status(gateway.model, session))
    connections = metrics.connections.labels(Protocol.CONTROL)
    connections.inc()
    forget = gateway.drain.on_drained(lambda: close_going_away(outbox))
    reader = asyncio.create_task(
        _read(websocket, connection, outbox, gateway.detached, deliver, gateway.chats)
    )
    try:
        if await until_overflow(reader, outbox):
            await connection.session.abort(outbox.why)
            metrics.not_reading_closes.labels(Protocol.CONTROL).inc()
            outbox.close(POLICY_VIOLATION, outbox.why)
            await outbox.closed()
    finally:
        forget()
        connections.dec()
        loading = [connection.loading] if connection.loading is not None else []
        for task in (reader, ticker, *loading):
            task.cancel()
        await asyncio.gather(reader, ticker, *loading, return_exceptions=True)
        # The generation stops, or waits for its client (REATTACH_SECONDS).
        await gateway.detached.leave(connection.session, current_caller().owner)
        await outbox.stop()


async def _read(
    websocket: WebSocket,
    connection: _Connection,
    outbox: Outbox,
    detached: Detached,
    deliver: Callable[[ServerMessage], None],
    chats: ChatModels,
) -> None:
    """Each client message to the session, in order, until the client leaves (or is closed
    for sending something other than a `config`, or a `reattach`, first)."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        session = connection.session
        decoded: ClientMessage | None = None
        raw = message.get("text") or message.get("bytes") or b""
        try:
            decoded = decode_client(raw)
        except GenerationError as e:
            if type_of(raw) == "reattach":  # one refused whatever it holds says so first
                e = _reattach_refusal(session, detached) or e
            if session.state != "new" or e.field != "$.type":  # a bad config may be retried
                session.refuse(e)
                continue
        if isinstance(decoded, Reattach) and detached.enabled:
            try:
                connection.session = _reattach(session, decoded, detached, deliver)
            except GenerationError as e:
                session.refuse(e)
            continue
        if session.state == "new" and not isinstance(decoded, Config):
            first = invalid("The first message must be a `config` message", "$.type")
            session.send(error_message(first, recoverable=False, recovery_action="reconnect"))
            outbox.close(POLICY_VIOLATION)
            await outbox.closed()
            return
        if decoded is not None:
            await session.handle(decoded)
        chosen = chats.named(session.model) if isinstance(decoded, Config) else None
        if chosen is not None and not chosen.served.ready and connection.loading is None:
            connection.loading = asyncio.create_task(_model_loading(chosen, connection))


def _reattach(
    own: ControlSession,
    message: Reattach,
    detached: Detached,
    deliver: Callable[[ServerMessage], None],
) -> ControlSession:
    """The detached generation `message` names, now this connection's (what it missed sent
    first); the connection's own session must have nothing running or paused."""
    refusal = _reattach_refusal(own, detached)
    if refusal is not None:
        raise refusal
    return detached.take(message.request_id, current_caller().owner, message.received, deliver)


def _reattach_refusal(own: ControlSession, detached: Detached) -> GenerationError | None:
    """Why no `reattach` may be taken on this connection now, naming `$.type` (docs/CONTROL.md):
    reattaching is off, or the connection's own generation runs or is paused."""
    if not detached.enabled:
        return invalid("Reattaching is off on this server (REATTACH_SECONDS=0)", "$.type")
    if own.state in ("generating", "paused"):
        busy = "A generation is in progress here: send `stop` before a `reattach`"
        return invalid(busy, "$.type")
    return None


async def _loading_status(model: ServedModel, session: ControlSession) -> None:
    """`status` every second while the engine loads, so a waiting client sees progress."""
    while model.loading:
        progress, eta = model.loading_progress()
        session.send(
            Status("model_loading", progress, "Loading the model and starting the engine", eta)
        )
        await asyncio.sleep(STATUS_INTERVAL_SECONDS)


async def _model_loading(chosen: ChatModel, connection: _Connection) -> None:
    """`status` every second while the model a `config` named loads (docs/MODELS.md), until
    it is ready or its generation ended (a load refused or failed ends it with an error)."""
    model = chosen.served
    try:
        while not model.ready and connection.session.state == "generating":
            if model.status()[0] == "loading":
                progress, eta = model.loading_progress()
                message = f"Loading the model {chosen.name} and starting its engine"
                connection.session.send(Status("model_loading", progress, message, eta))
            await asyncio.sleep(STATUS_INTERVAL_SECONDS)
    finally:
        connection.loading = None


# --- POST /v1/generate ---------------------------------------------------------------------


Encoded = tuple[ServerMessage, bytes]  # a message, encoded once as it is queued


async def _messages(
    session: ControlSession, queue: BoundedQueue[Encoded], unread: Counter
) -> AsyncGenerator[Encoded, None]:
    """The session's messages up to its last (a completion or an error); closing this (the
    answer ended, or its client left) ends the session, which aborts its engine request. A
    client that does not read (its queue overflows) has its generation end there, with a
    `memory_pressure` error after what is queued."""

    async def abort_when_unread() -> None:
        await queue.overflowed.wait()
        unread.inc()
        await session.abort(queue.why)

    watcher = asyncio.create_task(abort_when_unread())
    try:
        while True:
            item = await queue.get()
            yield item
            if isinstance(item[0], Completion | Error):
                return
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await session.close()


async def _sse(head: list[Encoded], rest: AsyncIterator[Encoded]) -> AsyncGenerator[Chunk, None]:
    async for _, data in chained(head, rest):
        yield Chunk(sse_event(data))


def _refusal(head: list[Encoded]) -> Whole | None:
    """An error before `init` (the prompt was refused) keeps its HTTP status."""
    first = head[0][0]
    return _error_answer(first, kind_of(first)) if isinstance(first, Error) else None


async def v1_generate(request: Request) -> Response:
    return to_response(await _v1_generate(request))


async def _v1_generate(request: Request) -> Prepared:
    gateway = gateway_of(request)
    try:
        config = rest_config(await request.body(), gateway.settings.max_stop_sequences)
    except GenerationError as e:
        return _error_answer(error_message(e), e.kind)
    queue = BoundedQueue[Encoded](
        gateway.settings.max_queued_bytes_per_connection, lambda item: len(item[1])
    )
    session = ControlSession(
        gateway.settings,
        gateway.chats,
        gateway.feedback,
        gateway.feedback_limits,
        lambda message: queue.put((message, encode(message))),
        protocol=Protocol.V1_GENERATE,
        task_of=gateway.models.task_of,
        asked=asked_model(request, None),
    )
    await session.handle(config)
    unread = gateway.service.metrics.not_reading_closes.labels(Protocol.V1_GENERATE)
    messages = _messages(session, queue, unread)
    if config.options.stream:
        return await streamed(
            request,
            messages,
            ready=lambda _: True,
            refuse=_refusal,
            chunks=_sse,
            media_type=SSE,
            headers=NO_CACHE,
        )
    collected = await collect(request, messages)
    if collected is None:
        return CLIENT_GONE
    answer = [message for message, _ in collected]
    last = answer[-1]
    if isinstance(last, Error):
        return _error_answer(last, kind_of(last))
    assert isinstance(last, Completion)
    init = next((m for m in answer if isinstance(m, Init)), None)
    body = rest_response(init.request_id if init else "", session.model, last)
    return Whole(200, msgspec.json.encode(body), JSON)


def _error_answer(error: Error, kind: ErrorKind) -> Whole:
    refused(GenerationError(kind, error.message))
    return Whole(status_of(kind), encode(error), JSON)


routes = [
    WebSocketRoute("/generate", control_ws),
    Route("/v1/generate", v1_generate, methods=["POST"]),
]
operations = [
    Op(
        "post",
        "/v1/generate",
        "The control protocol's REST form",
        RestRequest,
        {JSON: RestResponse, SSE: Events(ServerMessage)},
        Error,
        GATEWAY_ERRORS,
    ),
]
