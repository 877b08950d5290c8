"""The shape shared by the payload WebSockets (`/ws`, `/ws/events`).

Each client message runs as its own task, so several on one connection run concurrently, at
most MAX_PAYLOADS_PER_CONNECTION (a payload past them is refused, not queued); one writer
sends every frame (gateway/http/outbox.py). When the client leaves, every task of the
connection is cancelled, which aborts its engine requests. When the client does not read
(its outbox overflows), nothing more is read from it, every payload is cancelled and ends
each of its prompts with an ERROR (`serve` sees `outbox.overflowed`), and the connection
closes with 1008.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable, Coroutine
from contextlib import aclosing
from typing import Any, TypeVar
from typing import Protocol as Interface

from starlette.websockets import WebSocket

from gateway.engine_path.batch import BatchRunner
from gateway.http.model_choice import ModelRefused, asked_model, chat_model_for
from gateway.http.outbox import POLICY_VIOLATION, Outbox, close_going_away, until_overflow
from gateway.observability.tracing import connection_is_traced, traced_message
from gateway.state import Gateway, gateway_of
from protocols.errors import ErrorKind, GenerationError
from protocols.names import Protocol

log = logging.getLogger(__name__)
# A payload's run on the connection's chat model (X-Model, or the `model` query parameter).
Handler = Callable[[bytes | str, Gateway, BatchRunner, Outbox], Coroutine[Any, Any, None]]
# A payload refused before it runs: each prompt it names gets the error, nothing else.
Refusal = Callable[[bytes | str, Gateway, Outbox, GenerationError], None]


Step = TypeVar("Step", contravariant=True)
Frame = TypeVar("Frame")


class PromptFrames(Interface[Step, Frame]):
    """A payload's prompts as its protocol frames them: each engine step's frames, and the
    frames that end every prompt still running with an error."""

    def frames(self, step: Step) -> list[Frame]: ...

    def abandon(self, message: str) -> list[Frame]: ...


async def send_steps(
    steps: AsyncGenerator[Step, None],
    frames: PromptFrames[Step, Frame],
    encode: Callable[[Frame], bytes],
    outbox: Outbox,
) -> None:
    """Each step's frames into the outbox. A client that does not read (the outbox overflowed:
    the payload is cancelled) or a bug still ends each running prompt with one error."""
    try:
        async with aclosing(steps):
            async for step in steps:
                for frame in frames.frames(step):
                    outbox.put(encode(frame))
    except asyncio.CancelledError:
        if outbox.overflowed.is_set():
            for frame in frames.abandon(outbox.why):
                outbox.put(encode(frame))
        raise
    except Exception as e:
        log.exception("payload failed")
        for frame in frames.abandon(f"Internal error: {type(e).__name__}: {e}"):
            outbox.put(encode(frame))


def too_many_payloads(limit: int) -> GenerationError:
    return GenerationError(
        ErrorKind.RATE_LIMITED,
        f"Too many payloads running on this connection: at most {limit} "
        "(MAX_PAYLOADS_PER_CONNECTION); send the next once one has ended",
    )


async def serve_payloads(
    websocket: WebSocket, protocol: Protocol, serve: Handler, refuse: Refusal
) -> None:
    """Serve one connection, counted in the protocol's open connections while it is open."""
    gateway = gateway_of(websocket)
    settings = gateway.settings
    metrics = gateway.service.metrics
    # A model nothing serves: each payload is refused naming it, in the protocol's frames
    chosen = chat_model_for(gateway, asked_model(websocket, None))
    connections = metrics.connections.labels(protocol)
    await websocket.accept()
    connections.inc()
    outbox = Outbox(websocket, settings.max_queued_bytes_per_connection)
    payloads: set[asyncio.Task[None]] = set()
    limit = settings.max_payloads_per_connection
    traced = connection_is_traced()  # each payload its own trace

    async def read() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            raw = message.get("text") or message.get("bytes") or b""
            if isinstance(chosen, ModelRefused):
                refuse(raw, gateway, outbox, chosen.error)
                continue
            if len(payloads) >= limit:
                refuse(raw, gateway, outbox, too_many_payloads(limit))
                continue
            payload = serve(raw, gateway, chosen.batches, outbox)
            if traced:
                payload = _traced(protocol, payload)
            task = asyncio.create_task(payload)
            payloads.add(task)
            task.add_done_callback(payloads.discard)

    async def going_away() -> None:  # the drain's end: every payload has its last frame
        await asyncio.gather(*payloads, return_exceptions=True)
        await close_going_away(outbox)

    forget = gateway.drain.on_drained(going_away)
    reader = asyncio.create_task(read())
    try:
        if await until_overflow(reader, outbox):
            await _cancel(set(payloads))  # each ends its prompts with an ERROR, queued in order
            metrics.not_reading_closes.labels(protocol).inc()
            outbox.close(POLICY_VIOLATION, outbox.why)
            await outbox.closed()
    finally:
        forget()
        connections.dec()
        await _cancel({*payloads, reader})
        await outbox.stop()


async def _traced(protocol: Protocol, payload: Coroutine[Any, Any, None]) -> None:
    """A payload's run: its own trace, when the connection is traced."""
    with traced_message(protocol.value):
        await payload


async def _cancel(tasks: set[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
