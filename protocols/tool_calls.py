"""OpenAI's tool calls on the wire (no I/O, no engine): the `tools` and `tool_choice` a chat
request gives, decoded to a `ToolUse`; the tool calls and tool results of a conversation's
history, as the chat template receives them; and the tool calls an answer carries, whole or
streamed. Parsing the model's output into calls is vLLM's (gateway/engine/tool_calls.py),
behind `ToolAnswers`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Protocol

import msgspec
from msgspec import UNSET, Meta, UnsetType

from protocols.errors import invalid
from protocols.events import Delta

# OpenAI's rule for a function's name.
FunctionName = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


class FunctionSpec(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; none: no arguments
    strict: bool | None = None  # accepted: `required` and a named function are always held to it


class Tool(msgspec.Struct, kw_only=True):
    # A field, not msgspec's tag: a lone tagged Struct decodes without its tag.
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(msgspec.Struct):
    name: str


class NamedChoice(msgspec.Struct, kw_only=True):
    function: NamedFunction
    type: Literal["function"] = "function"  # huggingface_hub (TGI's schema) leaves it out


ToolChoice = Literal["none", "auto", "required"] | NamedChoice
Tools = Annotated[list[Tool], Meta(min_length=1, max_length=128)]


class ToolUse(msgspec.Struct, frozen=True, kw_only=True):
    """What a chat request asks of tools: `tools` as the chat template receives them, `choice`
    (`function`: the one named `function`), whether several calls may come at once, and
    `prompt`, TGI's `tool_prompt` (what tells a model without a tool parser how to call)."""

    tools: tuple[dict[str, Any], ...]
    choice: Literal["none", "auto", "required", "function"]
    function: str | None = None
    parallel: bool = True
    prompt: str | None = None

    @property
    def forced(self) -> bool:
        """The answer must be calls: generation is held to the tools' schemas."""
        return self.choice in ("required", "function")


def decode_tool_use(
    tools: list[Tool] | None,
    choice: ToolChoice | None,
    parallel: bool | None,
    prompt: str | None = None,
) -> ToolUse | None:
    """The request's tools and choice (OpenAI's default: `auto` when tools are given), or None
    for a request without tools. A choice without tools, or naming a function `tools` does not
    have, is a refusal naming the field."""
    if tools is None:
        if choice is not None and choice != "none":
            raise invalid("`tool_choice` is only allowed when `tools` are given", "tool_choice")
        return None
    names = [t.function.name for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise invalid(f"Two tools are named {name!r}", f"tools[{i}].function.name")
    wire = tuple(msgspec.to_builtins(t) for t in tools)
    parallel = parallel is not False
    if isinstance(choice, NamedChoice):
        name = choice.function.name
        if name not in names:
            raise invalid(
                f"tool_choice names the function {name!r}, which `tools` does not have "
                f"(it has {', '.join(map(repr, names))})",
                "tool_choice.function.name",
            )
        return ToolUse(
            tools=wire, choice="function", function=name, parallel=parallel, prompt=prompt
        )
    return ToolUse(tools=wire, choice=choice or "auto", parallel=parallel, prompt=prompt)


class CalledFunction(msgspec.Struct):
    name: str
    arguments: str  # JSON, as OpenAI sends it


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


def history_fields(
    role: str, tool_calls: list[ToolCall] | None, tool_call_id: str | None, index: int
) -> dict[str, Any]:
    """A message's tool fields as chat templates read them: an assistant's `tool_calls` with
    their arguments as objects (transformers' convention, which vLLM follows: arguments that
    are not a JSON object become an empty one), a tool result's `tool_call_id`."""
    fields: dict[str, Any] = {}
    if tool_calls:
        if role != "assistant":
            raise invalid("Only an assistant message has `tool_calls`", f"messages[{index}]")
        fields["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": _object(call)},
            }
            for call in tool_calls
        ]
    if role == "tool":
        if tool_call_id is None:
            raise invalid(
                "A tool message needs the `tool_call_id` it answers",
                f"messages[{index}].tool_call_id",
            )
        fields["tool_call_id"] = tool_call_id
    return fields


def _object(call: ToolCall) -> dict[str, Any]:
    try:
        arguments = msgspec.json.decode(call.function.arguments or "{}")
    except msgspec.DecodeError:
        return {}
    return arguments if isinstance(arguments, dict) else {}


# What an answer carries.


class FunctionDelta(msgspec.Struct, omit_defaults=True):
    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET


class ToolCallDelta(msgspec.Struct, omit_defaults=True):
    """A piece of a streamed call: its first piece has `id`, `type` and the function's
    `name`; the arguments follow in pieces, the same `index` on each."""

    index: int
    id: str | UnsetType = UNSET
    type: Literal["function"] | UnsetType = UNSET
    function: FunctionDelta | UnsetType = UNSET


class ParsedMessage(msgspec.Struct, frozen=True):
    """A whole choice: its text outside calls (None when there is none), its calls, and its
    finish reason (`tool_calls` when the model chose to call)."""

    content: str | None
    tool_calls: list[ToolCall]
    finish_reason: str


class ParsedDelta(msgspec.Struct, frozen=True):
    """What one streamed step of a choice adds: text, pieces of calls, or neither (a step
    inside a call's markup); `finish_reason` on the last."""

    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None
    finish_reason: str | None = None


class ToolAnswers(Protocol):
    """A chat answer's choices read for tool calls: each choice's text whole, or its streamed
    steps in order (one parser state per choice)."""

    def message(self, index: int, text: str, finish_reason: str) -> ParsedMessage: ...

    def delta(
        self, index: int, text: str, token_ids: list[int], finish_reason: str | None
    ) -> ParsedDelta: ...


def read_step(tools: ToolAnswers | None, delta: Delta) -> tuple[str, list[ToolCallDelta]]:
    """A streamed step's text outside calls and its pieces of calls (all text without tools),
    for the encoders that open a block per text run and per call."""
    if tools is None:
        return delta.text, []
    parsed = tools.delta(delta.index, delta.text, delta.token_ids, delta.finish_reason)
    return parsed.content or "", parsed.tool_calls or []
