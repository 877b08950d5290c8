"""POST `/api/generate-one` and `/api/generate-batch` (rest-generate.md).

A streamed answer commits to status 200 only once its prompt produced text (or ended), so
admission and validation errors still get a 4xx JSON body. A client that leaves, streaming
or not, cancels the work and so aborts its engine request.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from functools import partial
from typing import Annotated, Any

from msgspec import Meta
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.edge.http_errors import status_of
from gateway.engine_path.batch import BatchRunner
from gateway.http.model_choice import ModelRefused, asked_model, chat_model_for
from gateway.http.openapi import GATEWAY_ERRORS, TEXT, Op
from gateway.http.prepared import (
    CLIENT_GONE,
    JSON,
    Chunk,
    Prepared,
    Whole,
    streamed,
    to_response,
)
from gateway.http.streaming import Step, chained, collect
from gateway.observability.tracing import refused
from gateway.state import gateway_of
from protocols.batch_payload import PayloadSettings
from protocols.errors import GenerationError
from protocols.events import Delta, Failed, Finished, Initialized, Queued
from protocols.names import Protocol
from protocols.rest_generate import (
    BatchAnswer,
    ErrorBody,
    _OnePayload,
    batch_answers,
    decode_generate_batch,
    decode_one,
    encode_answers,
    encode_error,
    failure_of_one,
    first_failure,
)

TEXT_PLAIN = "text/plain; charset=utf-8"


class GenerationAborted(Exception):
    """Raised inside a streamed body: the connection is cut instead of ending cleanly."""


def error_answer(error: GenerationError) -> Whole:
    refused(error)
    return Whole(status_of(error.kind), encode_error(error), JSON)


def _outcomes(steps: list[Step]) -> dict[int, Finished | Failed]:
    return {e.index: e for step in steps for e in step if isinstance(e, Finished | Failed)}


def _produced(step: Step) -> bool:
    return any(isinstance(e, Finished | Failed) or (isinstance(e, Delta) and e.text) for e in step)


def _refusal(head: list[Step]) -> Whole | None:
    failed = next((e for e in head[-1] if isinstance(e, Failed)), None) if head else None
    return None if failed is None else error_answer(failure_of_one(failed))


async def generate_one(request: Request) -> Response:
    return to_response(await _one(request))


def _chosen(request: Request) -> BatchRunner | Whole:
    """The X-Model header's chat model (the default with none): `/api/*` names no model."""
    chosen = chat_model_for(gateway_of(request), asked_model(request, None))
    if isinstance(chosen, ModelRefused):
        return Whole(chosen.status, encode_error(chosen.error), JSON)
    return chosen.batches


async def _one(request: Request) -> Prepared:
    gateway = gateway_of(request)
    batches = _chosen(request)
    if isinstance(batches, Whole):
        return batches
    try:
        one = decode_one(
            await request.body(), gateway.settings.generation, gateway.settings.max_stop_sequences
        )
    except GenerationError as e:
        return error_answer(e)
    steps = batches.run_prompts(
        [one.item],
        one.options,
        stream=one.stream,
        protocol=Protocol.API_GENERATE_ONE,
        adapter=one.adapter,
    )
    if not one.stream:
        collected = await collect(request, steps)
        if collected is None:
            return CLIENT_GONE
        outcome = _outcomes(collected)[0]
        if isinstance(outcome, Failed):
            return error_answer(failure_of_one(outcome))
        new, full = outcome.sequences[0].text, outcome.history.text
        return Whole(200, (new if one.only_new_tokens else full).encode(), TEXT_PLAIN)
    return await streamed(
        request,
        steps,
        ready=_produced,
        refuse=_refusal,
        chunks=partial(_stream_text, only_new_tokens=one.only_new_tokens),
        media_type=TEXT_PLAIN,
    )


async def _stream_text(
    head: list[Step], rest: AsyncIterator[Step], *, only_new_tokens: bool
) -> AsyncGenerator[Chunk, None]:
    async for step in chained(head, rest):
        for event in step:
            match event:
                case Delta(text=text):
                    yield Chunk(text.encode())
                case Initialized(prompt_text=text) if not only_new_tokens:
                    yield Chunk(text.encode())
                case Failed(message=message):
                    raise GenerationAborted(message)


async def generate_batch(request: Request) -> Response:
    return to_response(await _batch(request))


async def _batch(request: Request) -> Prepared:
    gateway = gateway_of(request)
    batches = _chosen(request)
    if isinstance(batches, Whole):
        return batches
    try:
        batch = decode_generate_batch(
            await request.body(), gateway.settings.generation, gateway.settings.max_stop_sequences
        )
    except GenerationError as e:
        return error_answer(e)
    if not batch.items:
        return error_answer(batch.rejected[0].error)
    steps = batches.run_prompts(
        batch.items,
        batch.options,
        stream=False,
        protocol=Protocol.API_GENERATE_BATCH,
        adapter=batch.adapter,
    )
    collected = await collect(request, steps)
    if collected is None:
        return CLIENT_GONE
    outcomes = _outcomes(collected)
    if not any(isinstance(e, Queued) for step in collected for e in step):
        return error_answer(first_failure(batch, outcomes))
    return Whole(200, encode_answers(batch_answers(batch, outcomes)), JSON)


routes = [
    Route("/api/generate-one", generate_one, methods=["POST"]),
    Route("/api/generate-batch", generate_batch, methods=["POST"]),
]
PROMPTS = "Each a {request_id, prompt} object; a bad one fails alone, in the 200 answer"


class _BatchPayload(PayloadSettings, forbid_unknown_fields=True, kw_only=True):
    """`/api/generate-batch`'s body (protocols/batch_payload.py)."""

    prompts: Annotated[list[Any], Meta(min_length=1, description=PROMPTS)]


operations = [
    Op(
        "post",
        "/api/generate-one",
        "One prompt, as plain text",
        _OnePayload,
        {"text/plain": TEXT},
        ErrorBody,
        GATEWAY_ERRORS,
    ),
    Op(
        "post",
        "/api/generate-batch",
        "Several prompts, one JSON answer",
        _BatchPayload,
        {JSON: list[BatchAnswer]},
        ErrorBody,
        GATEWAY_ERRORS,
    ),
]
