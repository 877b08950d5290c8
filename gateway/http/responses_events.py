"""One response being made, and its typed server-sent events: what a streamed response sends
and a background response keeps (gateway/routes/responses.py, responses_background.py)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import suppress

import msgspec

from gateway.engine_path.deadlines import SHUTTING_DOWN
from gateway.engine_path.responses import Responses, Turn
from gateway.http.prepared import Chunk
from gateway.http.streaming import Step, chained
from protocols.errors import GenerationError
from protocols.events import Delta, Failed, Finished, Started
from protocols.responses_answers import (
    SHUTDOWN,
    EventStream,
    ResponseObject,
    document,
    failed,
    finished,
    interrupted,
    new_id,
    opened,
    outcome_of,
)
from protocols.responses_requests import ResponsesCall
from protocols.responses_tool_stream import ToolStream
from protocols.tool_calls import ToolAnswers


class Answer:
    """One response being made: its id, its object so far, and what it keeps when stored."""

    def __init__(
        self,
        call: ResponsesCall,
        turn: Turn,
        model: str,
        responses: Responses,
        tools: ToolAnswers | None,
    ) -> None:
        self.call = call
        self.turn = turn
        self.responses = responses
        self.tools = tools
        self.id = new_id("resp")
        self.message_id = new_id("msg")
        self.stream: ToolStream | None = None  # a streamed answer with tools, as it streams
        self.response = opened(self.id, model, call.echo)
        if call.background:
            self.response = msgspec.structs.replace(self.response, status="queued")

    async def finish(self, done: Finished) -> ResponseObject:
        """The finished response, stored (when asked) before anyone is told it is done."""
        outcome = outcome_of(done, self.message_id, self.tools, self.call.namespaces)
        if self.stream is not None:
            outcome = self.stream.settled(outcome)
        self.response = finished(self.response, done, outcome)
        if self.call.store:
            await self.responses.save(
                self.id,
                document(self.response),
                self.call,
                self.turn,
                done,
                outcome.message,
            )
        return self.response

    async def keep(self, response: ResponseObject) -> ResponseObject:
        """A state with no Finished (a background response's progress or early end), stored."""
        self.response = response
        await self.responses.save_state(self.id, document(response), self.call, self.turn)
        return response


async def answer_events(
    head: list[Step], rest: AsyncIterator[Step], answer: Answer, events: EventStream | None = None
) -> AsyncGenerator[Chunk, None]:
    """The typed events (made by `events`, which says when the terminal one was): the text
    streams as it comes; with tools the output is read for calls as it comes too, each call's
    arguments streamed (protocols/responses_tool_stream.py). A background response is first
    `queued`, and `in_progress` once the engine takes it; one the drain ends is `incomplete`."""
    events = events or EventStream()
    background = answer.call.background
    if answer.tools is not None:
        answer.stream = ToolStream(answer.tools, answer.message_id, answer.call.namespaces)
    if background:
        yield Chunk(events.queued(answer.response))
    else:
        yield Chunk(events.opening(answer.response))
        if answer.tools is None:
            yield Chunk(events.text_opening(answer.message_id, 0))
    async for step in chained(head, rest):
        for event in step:
            match event:
                case Started() if background:
                    progress = msgspec.structs.replace(answer.response, status="in_progress")
                    with suppress(
                        GenerationError
                    ):  # its state is kept at its end; the events tell it meanwhile
                        await answer.keep(progress)
                    opening = events.event("response.in_progress", response=progress)
                    if answer.tools is None:
                        opening += events.text_opening(answer.message_id, 0)
                    yield Chunk(opening)
                case Delta(text=text) if text and answer.stream is None:
                    yield Chunk(events.text_delta(answer.message_id, 0, text))
                case Delta() if answer.stream is not None:
                    streamed = answer.stream.step(event, events)
                    if streamed:
                        yield Chunk(streamed)
                case Finished():
                    try:
                        response = await answer.finish(event)
                    except GenerationError as e:
                        yield Chunk(events.failed(failed(answer.response, e)), e.message)
                        return
                    yield Chunk(_items(events, response, answer))
                    yield Chunk(events.completed(response))
                    return
                case Failed():
                    yield Chunk(await _failure(events, answer, event), event.message)
                    return


async def _failure(events: EventStream, answer: Answer, event: Failed) -> bytes:
    """A failed response; a background one the drain ended (only the drain's end fails a
    prompt with SHUTTING_DOWN) is `incomplete`, saying so."""
    error = event.error()
    ended = answer.call.background and event.message == SHUTTING_DOWN
    response = interrupted(answer.response, SHUTDOWN) if ended else failed(answer.response, error)
    if answer.call.background:
        with suppress(
            GenerationError
        ):  # the store cannot be reached: the event still says how it ended
            await answer.keep(response)
    return events.completed(response)


def _items(events: EventStream, response: ResponseObject, answer: Answer) -> bytes:
    """Each output item's end; the items not yet opened (calls read at the end) open first."""
    out = b""
    stream = answer.stream
    for index, item in enumerate(response.output):
        opened = stream.opened if stream is not None else {0}
        if index not in opened:
            if item["type"] == "message":
                out += events.text_opening(item["id"], index)
                out += events.text_delta(item["id"], index, item["content"][0]["text"])
            else:
                out += events.event("response.output_item.added", output_index=index, item=item)
        elif stream is not None:
            out += stream.arguments_done(index, item, events)
        out += events.item_done(index, item)
    return out
