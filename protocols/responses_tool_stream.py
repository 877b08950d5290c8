"""A streamed Responses API answer with tools (no I/O): each step read for calls as it comes
(`ToolAnswers.delta`), its text as `response.output_text.delta` events, each call an output
item opened as soon as its name is known and its arguments as
`response.function_call_arguments.delta` events; at the end, the response's output items
(read whole) take the ids, order and arguments the stream gave them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from protocols.events import Delta
from protocols.responses_answers import EventStream, Outcome, namespace_of, new_id
from protocols.tool_calls import ToolAnswers


def function_call_item(
    item_id: str,
    call_id: str,
    name: str,
    arguments: str,
    status: str,
    namespaces: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
        **namespace_of(name, namespaces),
    }


class _Call(msgspec.Struct):
    item_id: str
    call_id: str
    name: str
    output_index: int
    arguments: str = ""


class ToolStream:
    """One streamed answer's items as they open: `opened` holds their output indices."""

    def __init__(
        self, tools: ToolAnswers, message_id: str, namespaces: Mapping[str, str] | None = None
    ) -> None:
        self._tools = tools
        self._namespaces = namespaces
        self._message_id = message_id
        self._text_index: int | None = None
        self._calls: dict[int, _Call] = {}
        self.opened: set[int] = set()

    def step(self, delta: Delta, events: EventStream) -> bytes:
        parsed = self._tools.delta(0, delta.text, delta.token_ids, delta.finish_reason)
        out = b""
        if parsed.content:
            if self._text_index is None:
                self._text_index = self._open()
                out += events.text_opening(self._message_id, self._text_index)
            out += events.text_delta(self._message_id, self._text_index, parsed.content)
        for piece in parsed.tool_calls or []:
            function = piece.function if piece.function is not msgspec.UNSET else None
            call = self._calls.get(piece.index)
            if call is None:
                name = function.name if function is not None else msgspec.UNSET
                if name is msgspec.UNSET:
                    continue  # a call is opened with its name
                call_id = piece.id if piece.id is not msgspec.UNSET else new_id("call")
                call = _Call(new_id("fc"), call_id, name, self._open())
                self._calls[piece.index] = call
                item = function_call_item(
                    call.item_id, call_id, name, "", "in_progress", self._namespaces
                )
                out += events.event(
                    "response.output_item.added", output_index=call.output_index, item=item
                )
            arguments = function.arguments if function is not None else msgspec.UNSET
            if arguments is not msgspec.UNSET and arguments:
                call.arguments += arguments
                out += events.event(
                    "response.function_call_arguments.delta",
                    item_id=call.item_id,
                    output_index=call.output_index,
                    delta=arguments,
                )
        return out

    def _open(self) -> int:
        index = len(self.opened)
        self.opened.add(index)
        return index

    def settled(self, outcome: Outcome) -> Outcome:
        """`outcome`'s items in the order the stream opened them, each streamed call with the
        id, call id and arguments it streamed with; items it never opened come last."""
        placed: list[tuple[int, dict[str, Any]]] = []
        calls = iter(sorted(self._calls.values(), key=lambda c: c.output_index))
        late = len(self.opened)
        for item in outcome.output:
            index: int | None = None
            if item["type"] == "message":
                index = self._text_index
            else:
                call = next(calls, None)
                if call is not None:
                    index = call.output_index
                    item = {
                        **item,
                        "id": call.item_id,
                        "call_id": call.call_id,
                        "arguments": call.arguments,
                    }
            if index is None:
                index, late = late, late + 1
            placed.append((index, item))
        output = [item for _, item in sorted(placed, key=lambda p: p[0])]
        call_ids = [item["call_id"] for item in output if item["type"] == "function_call"]
        message = dict(outcome.message)
        if "tool_calls" in message:  # the next turn's history: the ids its results answer
            message["tool_calls"] = [
                {**call, "id": call_id}
                for call, call_id in zip(message["tool_calls"], call_ids, strict=False)
            ]
        return msgspec.structs.replace(outcome, output=output, message=message)

    def arguments_done(self, output_index: int, item: dict[str, Any], events: EventStream) -> bytes:
        """A streamed call's `response.function_call_arguments.done`, before its item's end."""
        if item["type"] != "function_call" or output_index not in self.opened:
            return b""
        return events.event(
            "response.function_call_arguments.done",
            item_id=item["id"],
            output_index=output_index,
            name=item["name"],
            arguments=item["arguments"],
        )
