"""OpenAI's Responses API: POST `/v1/responses` (whole, or its typed server-sent events), GET
and DELETE `/v1/responses/{id}`, GET `/v1/responses/{id}/input_items`, POST
`/v1/responses/{id}/cancel`. The codecs are
protocols/responses_*.py; a turn's prompt and the stored responses are
gateway/engine_path/responses.py; every prompt goes through the one engine path. Its events are
gateway/http/responses_events.py's; `background`, streaming a stored response and `cancel` are
gateway/http/responses_background.py's.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.engine_path.chat_model import ChatModel
from gateway.engine_path.responses import Responses, StoredResponse, Turn
from gateway.http import responses_background
from gateway.http.chat import error_answer, openai_refusal, refusal
from gateway.http.model_choice import ModelRefused, asked_model, body_model, chat_model_for
from gateway.http.openapi import OPENAI_ERRORS, Events, Op
from gateway.http.prepared import (
    CLIENT_GONE,
    JSON,
    SSE,
    SSE_HEADERS,
    Prepared,
    Whole,
    streamed,
    to_response,
)
from gateway.http.responses_events import Answer, answer_events
from gateway.http.streaming import collect, ended, has_output
from gateway.state import Gateway, gateway_of
from protocols.errors import ErrorKind, GenerationError, invalid
from protocols.events import Failed
from protocols.names import Protocol
from protocols.openai_answers import ErrorBody
from protocols.openai_answers import not_found as model_not_found
from protocols.openai_requests import unknown_model
from protocols.responses_answers import (
    DeletedResponse,
    InputItems,
    InputTokenCount,
    ResponseEvent,
    ResponseObject,
    deleted,
    document,
    input_items,
    not_found,
)
from protocols.responses_requests import (
    ResponsesCall,
    ResponsesRequest,
    decode_responses,
    defaulted,
)
from protocols.tool_calls import ToolAnswers


def _responses(gateway: Gateway, chosen: ChatModel | None = None) -> Responses:
    """The stored responses, rendered and tokenized by `chosen` (None: the default model)."""
    model = chosen or gateway.chats.default
    return Responses(model.batches.store, model.served)


class _Turn(NamedTuple):
    call: ResponsesCall
    turn: Turn
    model: str  # the name the answer reports
    tools: ToolAnswers | None
    previous: StoredResponse | None


async def _chosen(request: Request, raw: bytes) -> ChatModel | Whole:
    chosen = chat_model_for(gateway_of(request), asked_model(request, body_model(raw)))
    return openai_refusal(chosen) if isinstance(chosen, ModelRefused) else chosen


async def _turn(responses: Responses, raw: bytes) -> _Turn | Whole:
    """The body's turn as the engine will be given it (its prompt rendered and tokenized),
    or the answer that refuses it. GenerationError: a refusal in OpenAI's shape."""
    served = responses.model
    tools: ToolAnswers | None = None
    call = defaulted(decode_responses(raw, served.context_length()), served.sampling_defaults)
    adapters = await served.adapter_names()
    why = unknown_model(call.model, served.name, adapters)
    if why is not None:
        return Whole(404, model_not_found(why), JSON)
    model = call.model or served.name
    if call.model is not None and call.model in adapters:
        adapted = msgspec.structs.replace(call.request, adapter=call.model)
        call = msgspec.structs.replace(call, request=adapted)
    previous: StoredResponse | None = None
    if call.previous_response_id is not None:
        previous = await responses.load(call.previous_response_id)
        if previous is None:
            missing = not_found(call.previous_response_id, "previous_response_id")
            return Whole(404, missing, JSON)
        if previous.model is not None and previous.model != served.name:
            raise invalid(
                f"The response {call.previous_response_id!r} was made on the model "
                f"`{previous.model}`: continue it on the same (or start a new conversation)",
                "previous_response_id",
            )
    if call.tool_use is not None:
        tools, [held] = await served.tool_calling(call.tool_use, [call.request])
        call = msgspec.structs.replace(call, request=held)
    return _Turn(call, await responses.turn(call, previous), model, tools, previous)


async def prepare(request: Request, raw: bytes) -> Prepared:
    gateway = gateway_of(request)
    chosen = await _chosen(request, raw)
    if isinstance(chosen, Whole):
        return chosen
    responses = _responses(gateway, chosen)
    try:
        decoded = await _turn(responses, raw)
        if isinstance(decoded, Whole):
            return decoded
        call, turn, model, tools, previous = decoded
        if call.store and previous is None and (down := await responses.store.problem()):
            # asked before the engine's work, not after it: `store: true` (OpenAI's default)
            # can only be honoured where the response can be kept
            message = f"{down}; but `store: true` keeps the response there: send `store: false`"
            raise GenerationError(ErrorKind.ENGINE_UNAVAILABLE, message, "store")
    except GenerationError as e:
        return error_answer(e)
    answer = Answer(call, turn, model, responses, tools)
    steps = chosen.batches.run([turn.request], Protocol.OPENAI_RESPONSES)
    if call.background:
        return await responses_background.start(request, gateway, answer, steps)
    if not call.stream:
        collected = await collect(request, steps)
        if collected is None:
            return CLIENT_GONE
        end = ended(collected)
        if isinstance(end, Failed):
            return error_answer(end.error())
        try:
            response = await answer.finish(end)
        except GenerationError as e:
            return error_answer(e)
        return Whole(200, document(response), JSON)
    return await streamed(
        request,
        steps,
        ready=has_output,
        refuse=refusal,
        chunks=partial(answer_events, answer=answer),
        media_type=SSE,
        headers=SSE_HEADERS,
    )


async def create(request: Request) -> Response:
    return to_response(await prepare(request, await request.body()))


async def count_input_tokens(request: Request) -> Response:
    """`responses.input_tokens.count`: the prompt tokens the same body's response would
    report as `usage.input_tokens` (the turn is rendered and tokenized as `create` does it;
    nothing is generated or stored)."""
    raw = await request.body()
    chosen = await _chosen(request, raw)
    if isinstance(chosen, Whole):
        return to_response(chosen)
    try:
        decoded = await _turn(_responses(gateway_of(request), chosen), raw)
    except GenerationError as e:
        return to_response(error_answer(e))
    if isinstance(decoded, Whole):
        return to_response(decoded)
    count = InputTokenCount(input_tokens=len(decoded.turn.prompt.token_ids))
    return to_response(Whole(200, msgspec.json.encode(count), JSON))


async def _stored(request: Request) -> tuple[str, StoredResponse | None]:
    response_id = request.path_params["response_id"]
    return response_id, await _responses(gateway_of(request)).load(response_id)


async def retrieve(request: Request) -> Response:
    """The stored response as it is; with `stream=true`, a background response's events after
    `starting_after`."""
    events = request.query_params.get("stream", "false").lower() == "true"
    try:
        after = responses_background.starting_after(request.query_params.get("starting_after"))
        response_id, stored = await _stored(request)
    except GenerationError as e:
        return to_response(error_answer(e))
    if stored is None:
        return to_response(Whole(404, not_found(response_id), JSON))
    if events:
        gateway = gateway_of(request)
        prepared = responses_background.stream_stored(
            gateway, _responses(gateway), response_id, bytes(stored.response), after
        )
        return to_response(prepared)
    return to_response(Whole(200, bytes(stored.response), JSON))


async def cancel(request: Request) -> Response:
    gateway = gateway_of(request)
    response_id = request.path_params["response_id"]
    try:
        prepared = await responses_background.cancel(gateway, _responses(gateway), response_id)
    except GenerationError as e:
        return to_response(error_answer(e))
    return to_response(prepared)


async def delete(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    gateway = gateway_of(request)
    responses = _responses(gateway)
    try:
        stored = await responses.load(response_id)
        if stored is not None:  # a background response deleted stops first
            await responses_background.stop(gateway, responses, response_id, stored.response)
        gone = await responses.delete(response_id)
        await gateway.background.events.delete(responses.events_key(response_id))
    except GenerationError as e:
        return to_response(error_answer(e))
    if not gone:
        return to_response(Whole(404, not_found(response_id), JSON))
    return to_response(Whole(200, deleted(response_id), JSON))


async def list_input_items(request: Request) -> Response:
    query = request.query_params
    try:
        limit = _limit(query.get("limit", "20"))
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise invalid("order is `asc` or `desc`", "order")
        response_id, stored = await _stored(request)
    except GenerationError as e:
        return to_response(error_answer(e))
    if stored is None:
        return to_response(Whole(404, not_found(response_id), JSON))
    page = input_items(stored.items, order=order, after=query.get("after"), limit=limit)
    return to_response(Whole(200, page, JSON))


def _limit(given: str) -> int:
    try:
        limit = int(given)
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise invalid("limit is a number from 1 to 100", "limit")
    return limit


routes = [
    Route("/v1/responses", create, methods=["POST"]),
    Route("/v1/responses/input_tokens", count_input_tokens, methods=["POST"]),
    Route("/v1/responses/{response_id}", retrieve, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete, methods=["DELETE"]),
    Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
    Route("/v1/responses/{response_id}/cancel", cancel, methods=["POST"]),
]
STORED_ERRORS = (400, 401, 404, 503)  # a stored response's: unknown (or another key's) is 404
RESPONSE = {JSON: ResponseObject, SSE: Events(ResponseEvent)}
operations = [
    Op(
        "post",
        "/v1/responses",
        "OpenAI Responses API: one turn, whole or as typed events",
        ResponsesRequest,
        RESPONSE,
        ErrorBody,
        OPENAI_ERRORS,
    ),
    Op(
        "post",
        "/v1/responses/input_tokens",
        "OpenAI Responses API: the input tokens a response to this body would count",
        ResponsesRequest,
        {JSON: InputTokenCount},
        ErrorBody,
        OPENAI_ERRORS,
    ),
    Op(
        "get",
        "/v1/responses/{response_id}",
        "A stored response; with stream=true, a background response's events after starting_after",
        None,
        RESPONSE,
        ErrorBody,
        STORED_ERRORS,
        (
            ("stream", {"type": "boolean"}),
            ("starting_after", {"type": "integer", "minimum": -1}),
        ),
    ),
    Op(
        "delete",
        "/v1/responses/{response_id}",
        "Delete a stored response",
        None,
        {JSON: DeletedResponse},
        ErrorBody,
        STORED_ERRORS,
    ),
    Op(
        "post",
        "/v1/responses/{response_id}/cancel",
        "Cancel a background response",
        None,
        {JSON: ResponseObject},
        ErrorBody,
        (*STORED_ERRORS, 409),
    ),
    Op(
        "get",
        "/v1/responses/{response_id}/input_items",
        "A stored response's input items",
        None,
        {JSON: InputItems},
        ErrorBody,
        STORED_ERRORS,
    ),
]
