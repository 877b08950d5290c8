"""Anthropic's Messages API: POST `/v1/messages` (whole, or streamed as Anthropic's event
sequence) and POST `/v1/messages/count_tokens`, for the `anthropic` SDK and the agents built on
it. A request becomes the chat call the OpenAI route makes (protocols/anthropic_requests.py),
so tools, adapters (`model`), keys, limits and priorities are the chat route's; the answers
and errors are Anthropic's (protocols/anthropic_answers.py). The key may come as `x-api-key`,
as the SDK sends it (gateway/edge/auth.py reads both).
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
from protocols import anthropic_answers, anthropic_requests
from protocols.anthropic_answers import AnthropicEncoder, encode_token_count, error_of, not_found
from protocols.anthropic_requests import decode_count_tokens, decode_messages
from protocols.errors import GenerationError
from protocols.names import Protocol
from protocols.openai_requests import unknown_model


def _error(error: GenerationError) -> Whole:
    refused(error)
    status, body = error_of(error)
    return Whole(status, body, JSON)


async def messages(request: Request) -> Response:
    return to_response(await _answer(request))


def _refused(refused: ModelRefused) -> Whole:
    if refused.status == 404:
        return Whole(404, not_found(refused.error.message), JSON)
    return _error(refused.error)


async def _answer(request: Request) -> Prepared:
    raw = await request.body()
    chosen = chat_model_for(gateway_of(request), asked_model(request, body_model(raw)))
    if isinstance(chosen, ModelRefused):
        return _refused(chosen)
    try:
        call, tools, served = await resolve(chosen.served, decode_messages(raw))
    except GenerationError as e:
        return _error(e)
    except ModelNotServed as e:
        return Whole(404, not_found(str(e)), JSON)
    encoder = AnthropicEncoder(call, served, tools)
    steps = chosen.batches.run(call.requests, Protocol.ANTHROPIC_MESSAGES)
    return await encoded_answer(request, steps, encoder, stream=call.stream, error=_error)


async def count_tokens(request: Request) -> Response:
    return to_response(await _counted(request))


async def _counted(request: Request) -> Prepared:
    raw = await request.body()
    chosen = chat_model_for(gateway_of(request), asked_model(request, body_model(raw)))
    if isinstance(chosen, ModelRefused):
        return _refused(chosen)
    model = chosen.served
    try:
        conversation = decode_count_tokens(raw)
        if unknown_model(conversation.model, model.name) is not None:
            why = unknown_model(conversation.model, model.name, await model.adapter_names())
            if why is not None:
                return Whole(404, not_found(why), JSON)
        use = conversation.tool_use
        prompt = await model.render_chat(
            conversation.messages, tools=use.tools if use is not None else None
        )
        ids = await model.tokenize(prompt)
    except GenerationError as e:
        return _error(e)
    return Whole(200, encode_token_count(len(ids)), JSON)


routes = [
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]
ERRORS = (400, 401, 404, 413, 429, 500, 529)
operations = [
    Op(
        "post",
        "/v1/messages",
        "Anthropic's Messages API: a message, or its event stream (`stream: true`)",
        anthropic_requests.MessagesRequest,
        {
            JSON: anthropic_answers.Message,
            SSE: Events(anthropic_answers.Event),
        },
        anthropic_answers.ErrorBody,
        ERRORS,
    ),
    Op(
        "post",
        "/v1/messages/count_tokens",
        "The prompt tokens a Messages request would take",
        anthropic_requests.CountTokensRequest,
        {JSON: anthropic_answers.TokenCount},
        anthropic_answers.ErrorBody,
        ERRORS,
    ),
]
