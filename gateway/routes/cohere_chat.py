"""Cohere's chat: POST `/v2/chat` (whole, or streamed as Cohere's event sequence), for the
`cohere` SDK's `ClientV2.chat` and `chat_stream`. A request becomes the chat call the OpenAI
route makes (protocols/cohere_chat.py), so tools, adapters (`model`), keys (the SDK's
`Authorization: Bearer`), limits and priorities are the chat route's; the answers and errors
are Cohere's (protocols/cohere_chat_answers.py, protocols/cohere.py's error shape).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from functools import partial

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.http.chat import ModelNotServed, refused_with, resolve
from gateway.http.openapi import Events, Op
from gateway.http.prepared import (
    CLIENT_GONE,
    JSON,
    SSE,
    SSE_HEADERS,
    Chunk,
    Prepared,
    Whole,
    streamed,
    to_response,
)
from gateway.http.streaming import Step, chained, collect, has_output
from gateway.state import gateway_of
from protocols import cohere, cohere_chat, cohere_chat_answers
from protocols.cohere_chat_answers import CohereChatEncoder
from protocols.errors import GenerationError, invalid
from protocols.events import Delta, Failed, Finished
from protocols.names import Protocol


def _error(error: GenerationError, status: int | None = None) -> Whole:
    own, body = cohere.error_of(error)
    return Whole(status or own, body, JSON)


async def chat(request: Request) -> Response:
    return to_response(await _answer(request))


async def _answer(request: Request) -> Prepared:
    gateway = gateway_of(request)
    try:
        decoded = cohere_chat.decode_chat(await request.body(), gateway.model.context_length())
        call, tools, _ = await resolve(gateway.model, decoded)
    except GenerationError as e:
        return _error(e)
    except ModelNotServed as e:
        return _error(invalid(str(e), "model"), 404)
    encoder = CohereChatEncoder(call, tools)
    steps = gateway.batches.run(call.requests, Protocol.COHERE_CHAT)
    if not call.stream:
        collected = await collect(request, steps)
        if collected is None:
            return CLIENT_GONE
        end = next(e for step in collected for e in step if isinstance(e, Finished | Failed))
        if isinstance(end, Failed):
            return _error(end.error())
        return Whole(200, encoder.document(end), JSON)
    return await streamed(
        request,
        steps,
        ready=has_output,
        refuse=refused_with(_error),
        chunks=partial(_events, encoder=encoder),
        media_type=SSE,
        headers=SSE_HEADERS,
    )


async def _events(
    head: list[Step], rest: AsyncIterator[Step], encoder: CohereChatEncoder
) -> AsyncGenerator[Chunk, None]:
    yield Chunk(encoder.opening())
    async for step in chained(head, rest):
        for event in step:
            match event:
                case Delta():
                    data = encoder.chunk(event)
                    if data:
                        yield Chunk(data)
                case Finished():
                    yield Chunk(encoder.closing(event))
                    return
                case Failed():
                    yield Chunk(encoder.failure(event.error()), event.message)
                    return


routes = [Route("/v2/chat", chat, methods=["POST"])]
operations = [
    Op(
        "post",
        "/v2/chat",
        "Cohere's chat: an answer, or its event stream (`stream: true`)",
        cohere_chat.CohereChatRequest,
        {
            JSON: cohere_chat_answers.ChatAnswer,
            SSE: Events(cohere_chat_answers.Event, done=True),
        },
        cohere.ErrorBody,
        (400, 401, 404, 413, 422, 429, 500, 503),
    ),
]
