"""Background responses on the wire (docs/OPENAI.md, "Background responses"): `background: true`
answers at once and the generation runs with no client (gateway/engine_path/background.py);
`GET /v1/responses/{id}?stream=true&starting_after=N` streams its kept events after N, then
each as it comes, to its end; `POST /v1/responses/{id}/cancel` stops it."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing, suppress

from starlette.requests import Request

from gateway.engine_path.background import Background, Ending
from gateway.engine_path.responses import Responses
from gateway.http.chat import error_answer
from gateway.http.prepared import (
    CLIENT_GONE,
    JSON,
    SSE,
    SSE_HEADERS,
    Chunk,
    Prepared,
    Streamed,
    Whole,
)
from gateway.http.responses_events import Answer, answer_events
from gateway.http.streaming import Step, closer, open_stream
from gateway.state import Gateway
from gateway.stores.continuation import Key
from protocols.errors import ErrorKind, GenerationError, invalid
from protocols.events import Failed, Started
from protocols.openai_answers import error_of
from protocols.responses_answers import (
    SHUTDOWN,
    EventStream,
    cancelled,
    document,
    failed,
    interrupted,
    not_found,
    status_of,
    terminal_event,
)
from protocols.sse import split_events

RUNNING = ("queued", "in_progress")


def _accepted(step: Step) -> bool:
    """The prompt passed its checks (it waits for the engine), or it failed."""
    return bool(step)


async def start(
    request: Request, gateway: Gateway, answer: Answer, steps: AsyncGenerator[Step, None]
) -> Prepared:
    """The response kept (queued) and its generation running with no client: its object, or,
    with `stream`, its events from the first."""
    head = await open_stream(request, steps, _accepted)
    if head is None:
        return CLIENT_GONE
    refused = next((e for step in head for e in step if isinstance(e, Failed)), None)
    if refused is not None and not any(isinstance(e, Started) for s in head for e in s):
        await steps.aclose()
        return error_answer(refused.error())
    background = gateway.background
    key = answer.responses.events_key(answer.id)
    try:
        await answer.keep(answer.response)
        await background.start(key, _batches(head, steps, answer), _ending(answer))
    except GenerationError as e:
        await steps.aclose()
        return error_answer(e)
    if not answer.call.stream:
        return Whole(200, document(answer.response), JSON)
    return _streamed(background, key, -1)


async def _batches(
    head: list[Step], steps: AsyncGenerator[Step, None], answer: Answer
) -> AsyncGenerator[tuple[Sequence[bytes], bool], None]:
    events = EventStream()
    async with aclosing(steps), aclosing(answer_events(head, steps, answer, events)) as chunks:
        async for chunk in chunks:
            yield split_events(chunk.data), events.ended


def _ending(answer: Answer) -> Ending:
    async def ending(why: str, sequence_number: int) -> bytes:
        if why == "cancelled":
            response = cancelled(answer.response)
        elif why == "error":
            error = GenerationError(ErrorKind.ENGINE_ERROR, "The generation failed")
            response = failed(answer.response, error)
        else:
            response = interrupted(answer.response, SHUTDOWN)
        with suppress(GenerationError):  # the event still says how it ended
            await answer.keep(response)
        return terminal_event(response, sequence_number)

    return ending


def _streamed(background: Background, key: Key, after: int) -> Streamed:
    chunks = _read(background.events.read(key, after))
    return Streamed(SSE, chunks, closer(chunks), SSE_HEADERS)


async def _read(events: AsyncGenerator[bytes, None]) -> AsyncGenerator[Chunk, None]:
    async with aclosing(events):
        async for event in events:
            yield Chunk(event)


def starting_after(given: str | None) -> int:
    if given is None:
        return -1
    try:
        after = int(given)
    except ValueError:
        after = -2
    if after < -1:
        raise invalid("starting_after is a sequence number (0 or more)", "starting_after")
    return after


def stream_stored(
    gateway: Gateway, responses: Responses, response_id: str, document_: bytes, after: int
) -> Prepared:
    """A background response's events after `after`; a response that did not run in the
    background kept none."""
    if not status_of(document_).background:
        refused = invalid("Only a background response's events are kept to stream", "stream")
        return error_answer(refused)
    return _streamed(gateway.background, responses.events_key(response_id), after)


async def cancel(gateway: Gateway, responses: Responses, response_id: str) -> Prepared:
    """Stops a background response; cancelling one that ended answers it as it is."""
    stored = await responses.load(response_id)
    if stored is None:
        return Whole(404, not_found(response_id), JSON)
    if not status_of(stored.response).background:
        refused = invalid(
            "Only responses created with `background: true` can be cancelled", "response_id"
        )
        return error_answer(refused)
    kept = await stop(gateway, responses, response_id, stored.response)
    if status_of(kept).status in RUNNING:
        refused = invalid(
            "This response runs on a gateway process this one cannot reach (without a shared "
            "Redis); cancel it there",
            "response_id",
        )
        return Whole(409, error_of(refused)[1], JSON)
    return Whole(200, kept, JSON)


async def stop(gateway: Gateway, responses: Responses, response_id: str, kept: bytes) -> bytes:
    """A background response that runs stopped (here, or on another gateway sharing the
    Redis), and its stored state then."""
    if status_of(kept).status not in RUNNING:
        return kept
    if not await gateway.background.cancel(responses.events_key(response_id)):
        return kept
    again = await responses.load(response_id)
    return bytes(again.response) if again is not None else kept
