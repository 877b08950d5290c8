"""POST `/api/generate-one` and `/api/generate-batch` (rest-generate.md).

A streamed answer commits to status 200 only once its prompt reached the engine, so
admission and validation errors still get a 4xx JSON body. A client that leaves, streaming
or not, cancels the handler's work and so aborts its engine request.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from gateway.state import gateway_of
from gateway.routes.http_errors import status_of
from gateway.routes.streaming import CLIENT_GONE_STATUS, ClosingStream, until_disconnect
from protocols.errors import GenerationError
from protocols.generation import Delta, Event, Failed, Finished, Initialized
from protocols.rest_generate import (
    batch_answers,
    decode_generate_batch,
    decode_one,
    encode_answers,
    encode_error,
    failure_of_one,
)

T = TypeVar("T")
Steps = AsyncGenerator[list[Event], None]
CLIENT_GONE = Response(status_code=CLIENT_GONE_STATUS)


class GenerationAborted(Exception):
    """Raised inside a streamed body: the connection is cut instead of ending cleanly."""


def error_response(error: GenerationError) -> Response:
    return Response(encode_error(error), status_of(error.kind), media_type="application/json")


async def _outcomes(steps: Steps) -> dict[int, Finished | Failed]:
    outcomes: dict[int, Finished | Failed] = {}
    async with aclosing(steps):
        async for step in steps:
            for event in step:
                if isinstance(event, Finished | Failed):
                    outcomes[event.index] = event
    return outcomes


async def generate_one(request: Request) -> Response:
    gateway = gateway_of(request)
    try:
        one = decode_one(await request.body(), gateway.settings.generation)
    except GenerationError as e:
        return error_response(e)
    steps = gateway.service.run(
        [one.item], one.options, stream=one.stream, protocol="api_generate_one"
    )
    if not one.stream:
        outcomes = await until_disconnect(request, _outcomes(steps))
        if outcomes is None:
            return CLIENT_GONE
        outcome = outcomes[0]
        if isinstance(outcome, Failed):
            return error_response(failure_of_one(outcome))
        return PlainTextResponse(outcome.new_text if one.only_new_tokens else outcome.full_text)
    first = await until_disconnect(request, anext(steps))
    failed = next((e for e in first or () if isinstance(e, Failed)), None)
    if first is None or failed is not None:
        await steps.aclose()
        return CLIENT_GONE if failed is None else error_response(failure_of_one(failed))
    body = _stream_text(first, steps, only_new_tokens=one.only_new_tokens)
    return ClosingStream(body, "text/plain; charset=utf-8", steps.aclose)


async def _stream_text(
    first: list[Event], steps: Steps, *, only_new_tokens: bool
) -> AsyncIterator[str]:
    step: list[Event] | None = first
    while step is not None:
        for event in step:
            match event:
                case Delta(text=text):
                    yield text
                case Initialized(prompt_text=text) if not only_new_tokens:
                    yield text
                case Failed(message=message):
                    raise GenerationAborted(message)
        step = await anext(steps, None)


async def generate_batch(request: Request) -> Response:
    gateway = gateway_of(request)
    try:
        batch = decode_generate_batch(await request.body(), gateway.settings.generation)
    except GenerationError as e:
        return error_response(e)
    if not batch.items:
        return error_response(batch.rejected[0].error)
    steps = gateway.service.run(
        batch.items, batch.options, stream=False, protocol="api_generate_batch"
    )
    outcomes = await until_disconnect(request, _outcomes(steps))
    if outcomes is None:
        return CLIENT_GONE
    answers = batch_answers(batch, outcomes)
    return Response(encode_answers(answers), media_type="application/json")


routes = [
    Route("/api/generate-one", generate_one, methods=["POST"]),
    Route("/api/generate-batch", generate_batch, methods=["POST"]),
]
