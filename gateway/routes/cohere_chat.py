"""Cohere's chat: POST `/v2/chat` (whole, or streamed as Cohere's event sequence), for the
`cohere` SDK's `ClientV2.chat` and `chat_stream`. A request becomes the chat call the OpenAI
route makes (protocols/cohere_chat.py), so tools, adapters (`model`), keys (the SDK's
`Authorization: Bearer`), limits and priorities are the chat route's; the answers and errors
are Cohere's (protocols/cohere_chat_answers.py, protocols/cohere.py's error shape).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.http.chat import ModelNotServed, resolve
from gateway.http.encoded_chat import encoded_answer
from gateway.http.model_choice import ModelRefused, asked_model, body_model, chat_model_for
from gateway.http.openapi import Events, Op
from gateway.http.prepared import JSON, SSE, Prepared, Whole, to_response
from gateway.observability.tracing import refused
from gateway.state import gateway_of
from protocols import cohere, cohere_chat, cohere_chat_answers
from protocols.cohere_chat_answers import CohereChatEncoder
from protocols.errors import GenerationError, invalid
from protocols.names import Protocol


def _error(error: GenerationError, status: int | None = None) -> Whole:
    refused(error)
    own, body = cohere.error_of(error)
    return Whole(status or own, body, JSON)


async def chat(request: Request) -> Response:
    return to_response(await _answer(request))


async def _answer(request: Request) -> Prepared:
    raw = await request.body()
    chosen = chat_model_for(gateway_of(request), asked_model(request, body_model(raw)))
    if isinstance(chosen, ModelRefused):
        return _error(chosen.error, chosen.status)
    try:
        decoded = cohere_chat.decode_chat(raw, chosen.served.context_length())
        call, tools, _ = await resolve(chosen.served, decoded)
    except GenerationError as e:
        return _error(e)
    except ModelNotServed as e:
        return _error(invalid(str(e), "model"), 404)
    encoder = CohereChatEncoder(call, tools)
    steps = chosen.batches.run(call.requests, Protocol.COHERE_CHAT)
    return await encoded_answer(request, steps, encoder, stream=call.stream, error=_error)


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
