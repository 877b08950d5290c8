"""POST `/api/generate-one` and `/api/generate-batch` (rest-generate.md).

A streamed answer commits to status 200 only once its prompt produced text (or ended), so
admission and validation errors still get a 4xx JSON body. A client that leaves, streaming
or not, cancels the work and so aborts its engine request.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from functools import partial

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from gateway.edge.http_errors import status_of
from gateway.routes.streaming import chained, client_gone, collect, stream_answer
from gateway.state import gateway_of
from protocols.errors import GenerationError
from protocols.events import Delta, Event, Failed, Finished, Initialized, Queued
from protocols.names import Protocol
from protocols.rest_generate import (
    batch_answers,
    decode_generate_batch,
    decode_one,
    encode_answers,
    encode_error,
    failure_of_one,
    first_failure,
)

Step = list[Event]


class GenerationAborted(Exception):
    """Raised inside a streamed body: the connection is cut instead of ending cleanly."""


def error_response(error: GenerationError) -> Response:
    return Response(encode_error(error), status_of(error.kind), media_type="application/json")


def _outcomes(steps: list[Step]) -> dict[int, Finished | Failed]:
    return {e.index: e for step in steps for e in step if isinstance(e, Finished | Failed)}


def _produced(step: Step) -> bool:
    return any(isinstance(e, Finished | Failed) or (isinstance(e, Delta) and e.text) for e in step)


def _refusal(head: list[Step]) -> Response | None:
    failed = next((e for e in head[-1] if isinstance(e, Failed)), None) if head else None
    return None if failed is None else error_response(failure_of_one(failed))


async def generate_one(request: Request) -> Response:
    gateway = gateway_of(request)
    try:
        one = decode_one(
            await request.body(), gateway.settings.generation, gateway.settings.max_stop_sequences
        )
    except GenerationError as e:
        return error_response(e)
    steps = gateway.batches.run_prompts(
        [one.item],
        one.options,
        stream=one.stream,
        protocol=Protocol.API_GENERATE_ONE,
        adapter=one.adapter,
    )
    if not one.stream:
        collected = await collect(request, steps)
        if collected is None:
            return client_gone()
        outcome = _outcomes(collected)[0]
        if isinstance(outcome, Failed):
            return error_response(failure_of_one(outcome))
        new, full = outcome.sequences[0].text, outcome.history.text
        return PlainTextResponse(new if one.only_new_tokens else full)

    return await stream_answer(
        request,
        steps,
        ready=_produced,
        refuse=_refusal,
        body=partial(_stream_text, only_new_tokens=one.only_new_tokens),
        media_type="text/plain; charset=utf-8",
    )


async def _stream_text(
    head: list[Step], rest: AsyncIterator[Step], *, only_new_tokens: bool
) -> AsyncGenerator[bytes, None]:
    async for step in chained(head, rest):
        for event in step:
            match event:
                case Delta(text=text):
                    yield text.encode()
                case Initialized(prompt_text=text) if not only_new_tokens:
                    yield text.encode()
                case Failed(message=message):
                    raise GenerationAborted(message)


async def generate_batch(request: Request) -> Response:
    gateway = gateway_of(request)
    try:
        batch = decode_generate_batch(
            await request.body(), gateway.settings.generation, gateway.settings.max_stop_sequences
        )
    except GenerationError as e:
        return error_response(e)
    if not batch.items:
        return error_response(batch.rejected[0].error)
    steps = gateway.batches.run_prompts(
        batch.items,
        batch.options,
        stream=False,
        protocol=Protocol.API_GENERATE_BATCH,
        adapter=batch.adapter,
    )
    collected = await collect(request, steps)
    if collected is None:
        return client_gone()
    outcomes = _outcomes(collected)
    if not any(isinstance(e, Queued) for step in collected for e in step):
        return error_response(first_failure(batch, outcomes))
    return Response(encode_answers(batch_answers(batch, outcomes)), media_type="application/json")


routes = [
    Route("/api/generate-one", generate_one, methods=["POST"]),
    Route("/api/generate-batch", generate_batch, methods=["POST"]),
]
