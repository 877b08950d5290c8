"""OpenAI's Responses API: POST `/v1/responses` (whole, or its typed server-sent events), GET
and DELETE `/v1/responses/{id}`, GET `/v1/responses/{id}/input_items`. The codecs are
protocols/responses_*.py; a turn's prompt and the stored responses are
gateway/engine_path/responses.py; every prompt goes through the one engine path.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.config.settings import served_model_name
from gateway.engine.adapter import Engine
from gateway.engine.tool_calls import ToolCalling
from gateway.engine_path.responses import Responses, StoredResponse, Turn
from gateway.routes.openai import SSE, SSE_HEADERS, Step, context_length, opened_stream
from gateway.routes.prepared import CLIENT_GONE, JSON, Chunk, Prepared, Streamed, Whole, to_response
from gateway.routes.streaming import chained, closer, collect
from gateway.state import Gateway, gateway_of
from protocols.errors import GenerationError, invalid
from protocols.events import Delta, Failed, Finished
from protocols.names import Protocol
from protocols.openai_answers import error_of
from protocols.openai_answers import not_found as model_not_found
from protocols.openai_requests import unknown_model
from protocols.responses_answers import (
    EventStream,
    ResponseObject,
    deleted,
    document,
    failed,
    finished,
    input_items,
    new_id,
    not_found,
    opened,
    turn_of,
)
from protocols.responses_requests import ResponsesCall, decode_responses


def _error(error: GenerationError) -> Whole:
    status, body = error_of(error)
    return Whole(status, body, JSON)


def _responses(gateway: Gateway) -> Responses:
    return Responses(gateway.batches.store, gateway.service.chat_template)


class _Answer:
    """One response being made: its id, its object so far, and what it keeps when stored."""

    def __init__(
        self,
        call: ResponsesCall,
        turn: Turn,
        model: str,
        engine: Engine,
        responses: Responses,
        tools: ToolCalling | None,
    ) -> None:
        self.call = call
        self.turn = turn
        self.engine = engine
        self.responses = responses
        self.tools = tools
        self.id = new_id("resp")
        self.message_id = new_id("msg")
        self.response = opened(self.id, model, call.echo)

    async def finish(self, done: Finished) -> ResponseObject:
        """The finished response, stored (when asked) before anyone is told it is done."""
        turn = turn_of(done, self.message_id, self.tools)
        self.response = finished(self.response, done, turn)
        if self.call.store:
            await self.responses.save(
                self.id,
                document(self.response),
                self.call,
                self.turn,
                done,
                turn.message,
                self.engine,
            )
        return self.response


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
                return Whole(404, _previous_not_found(call.previous_response_id), JSON)
        if call.tool_use is not None:
            tools = gateway.tool_parsing.calling(call.tool_use, engine)
            [held] = tools.constrained([call.request])
            call = msgspec.structs.replace(call, request=held)
        turn = await responses.turn(engine, call, previous)
    except GenerationError as e:
        return _error(e)
    answer = _Answer(call, turn, model, engine, responses, tools)
    steps = gateway.batches.run([turn.request], Protocol.OPENAI_RESPONSES)
    if not call.stream:
        collected = await collect(request, steps)
        if collected is None:
            return CLIENT_GONE
        end = next(e for step in collected for e in step if isinstance(e, Finished | Failed))
        if isinstance(end, Failed):
            return _error(end.error())
        try:
            response = await answer.finish(end)
        except GenerationError as e:
            return _error(e)
        return Whole(200, document(response), JSON)
    head = await opened_stream(request, steps)
    if isinstance(head, Whole):
        return head
    chunks = _chunks(head, steps, answer)
    return Streamed(SSE, chunks, closer(chunks, steps), SSE_HEADERS)


def _previous_not_found(response_id: str) -> bytes:
    body: dict[str, Any] = msgspec.json.decode(not_found(response_id))
    body["error"]["message"] = f"Previous response with id '{response_id}' not found."
    body["error"]["param"] = "previous_response_id"
    return msgspec.json.encode(body)


async def _chunks(
    head: list[Step], rest: AsyncIterator[Step], answer: _Answer
) -> AsyncGenerator[Chunk, None]:
    """The typed events: the text streams as it comes; with tools the output is read for calls
    at its end, and its items come then."""
    events = EventStream()
    yield Chunk(events.opening(answer.response))
    if answer.tools is None:
        yield Chunk(events.text_opening(answer.message_id, 0))
    async for step in chained(head, rest):
        for event in step:
            match event:
                case Delta(text=text) if text and answer.tools is None:
                    yield Chunk(events.text_delta(answer.message_id, 0, text))
                case Finished():
                    try:
                        response = await answer.finish(event)
                    except GenerationError as e:
                        yield Chunk(events.failed(failed(answer.response, e)), e.message)
                        return
                    yield Chunk(_items(events, response, answer.tools is None))
                    yield Chunk(events.completed(response))
                    return
                case Failed():
                    error = event.error()
                    yield Chunk(events.failed(failed(answer.response, error)), error.message)
                    return


def _items(events: EventStream, response: ResponseObject, opened: bool) -> bytes:
    """Each output item's end; the items not yet opened (a tool call's answer) open first."""
    out = b""
    for index, item in enumerate(response.output):
        if not opened:
            if item["type"] == "message":
                out += events.text_opening(item["id"], index)
                out += events.text_delta(item["id"], index, item["content"][0]["text"])
            else:
                out += events.event("response.output_item.added", output_index=index, item=item)
        out += events.item_done(index, item)
    return out


async def create(request: Request) -> Response:
    return to_response(await prepare(request, await request.body()))


async def _stored(request: Request) -> tuple[str, StoredResponse | None]:
    response_id = request.path_params["response_id"]
    return response_id, await _responses(gateway_of(request)).load(response_id)


async def retrieve(request: Request) -> Response:
    if request.query_params.get("stream", "false").lower() == "true":
        refused = invalid("Streaming a stored response is not served yet", "stream")
        return to_response(_error(refused))
    try:
        response_id, stored = await _stored(request)
    except GenerationError as e:
        return to_response(_error(e))
    if stored is None:
        return Response(not_found(response_id), 404, media_type=JSON)
    return Response(bytes(stored.response), media_type=JSON)


async def delete(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    try:
        gone = await _responses(gateway_of(request)).delete(response_id)
    except GenerationError as e:
        return to_response(_error(e))
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
        return to_response(_error(e))
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
]
