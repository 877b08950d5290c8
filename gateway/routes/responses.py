"""OpenAI's Responses API: POST `/v1/responses` (whole, or its typed server-sent events), GET
and DELETE `/v1/responses/{id}`, GET `/v1/responses/{id}/input_items`, POST
`/v1/responses/{id}/cancel`. The codecs are
protocols/responses_*.py; a turn's prompt and the stored responses are
gateway/engine_path/responses.py; every prompt goes through the one engine path. Its events are
routes/responses_events.py's; `background`, streaming a stored response and `cancel` are
routes/responses_background.py's.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.config.settings import served_model_name
from gateway.engine.tool_calls import ToolCalling
from gateway.engine_path.responses import Responses, StoredResponse
from gateway.routes import responses_background
from gateway.routes.openai import SSE, SSE_HEADERS, context_length, error_answer, opened_stream
from gateway.routes.prepared import CLIENT_GONE, JSON, Prepared, Streamed, Whole, to_response
from gateway.routes.responses_events import Answer, answer_events
from gateway.routes.streaming import closer, collect
from gateway.state import Gateway, gateway_of
from protocols.errors import GenerationError, invalid
from protocols.events import Failed, Finished
from protocols.names import Protocol
from protocols.openai_answers import not_found as model_not_found
from protocols.openai_requests import unknown_model
from protocols.responses_answers import deleted, document, input_items, not_found
from protocols.responses_requests import decode_responses


def _responses(gateway: Gateway) -> Responses:
    return Responses(gateway.batches.store, gateway.service.chat_template)


async def prepare(request: Request, raw: bytes) -> Prepared:
    gateway = gateway_of(request)
    responses = _responses(gateway)
    tools: ToolCalling | None = None
    try:
        call = decode_responses(raw, context_length(gateway))
        engine = await gateway.holder.wait()
        served = served_model_name(gateway.settings.engine)
        why = unknown_model(call.model, served, engine.adapters.names)
        if why is not None:
            return Whole(404, model_not_found(why), JSON)
        model = call.model or served
        if call.model is not None and call.model in engine.adapters.names:
            adapted = msgspec.structs.replace(call.request, adapter=call.model)
            call = msgspec.structs.replace(call, request=adapted)
        previous: StoredResponse | None = None
        if call.previous_response_id is not None:
            previous = await responses.load(call.previous_response_id)
            if previous is None:
                missing = not_found(call.previous_response_id, "previous_response_id")
                return Whole(404, missing, JSON)
        if call.tool_use is not None:
            tools = gateway.tool_parsing.calling(call.tool_use, engine)
            [held] = tools.constrained([call.request])
            call = msgspec.structs.replace(call, request=held)
        turn = await responses.turn(engine, call, previous)
    except GenerationError as e:
        return error_answer(e)
    answer = Answer(call, turn, model, engine, responses, tools)
    steps = gateway.batches.run([turn.request], Protocol.OPENAI_RESPONSES)
    if call.background:
        return await responses_background.start(request, gateway, answer, steps)
    if not call.stream:
        collected = await collect(request, steps)
        if collected is None:
            return CLIENT_GONE
        end = next(e for step in collected for e in step if isinstance(e, Finished | Failed))
        if isinstance(end, Failed):
            return error_answer(end.error())
        try:
            response = await answer.finish(end)
        except GenerationError as e:
            return error_answer(e)
        return Whole(200, document(response), JSON)
    head = await opened_stream(request, steps)
    if isinstance(head, Whole):
        return head
    chunks = answer_events(head, steps, answer)
    return Streamed(SSE, chunks, closer(chunks, steps), SSE_HEADERS)


async def create(request: Request) -> Response:
    return to_response(await prepare(request, await request.body()))


async def _stored(request: Request) -> tuple[str, StoredResponse | None]:
    response_id = request.path_params["response_id"]
    return response_id, await _responses(gateway_of(request)).load(response_id)


async def retrieve(request: Request) -> Response:
    """The stored response as it is; with `stream=true`, a background response's events after
    `starting_after`."""
    streamed = request.query_params.get("stream", "false").lower() == "true"
    try:
        after = responses_background.starting_after(request.query_params.get("starting_after"))
        response_id, stored = await _stored(request)
    except GenerationError as e:
        return to_response(error_answer(e))
    if stored is None:
        return Response(not_found(response_id), 404, media_type=JSON)
    if streamed:
        gateway = gateway_of(request)
        prepared = responses_background.stream_stored(
            gateway, _responses(gateway), response_id, bytes(stored.response), after
        )
        return to_response(prepared)
    return Response(bytes(stored.response), media_type=JSON)


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
        return Response(not_found(response_id), 404, media_type=JSON)
    return Response(deleted(response_id), media_type=JSON)


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
        return Response(not_found(response_id), 404, media_type=JSON)
    page = input_items(stored.items, order=order, after=query.get("after"), limit=limit)
    return Response(page, media_type=JSON)


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
    Route("/v1/responses/{response_id}", retrieve, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete, methods=["DELETE"]),
    Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
    Route("/v1/responses/{response_id}/cancel", cancel, methods=["POST"]),
]
