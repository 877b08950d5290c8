"""Cohere's chat (`POST /v2/chat`) requests, as the `cohere` SDK's `ClientV2.chat` and
`chat_stream` send them, decoded to the neutral vocabulary (no I/O).

A v2 chat request becomes the same `OpenAICall` a chat completion does: its messages the chat
template's (an assistant's `tool_calls` and `tool_plan`, a tool's results by `tool_call_id`),
its `tools` OpenAI's function tools (v2 has their shape), `tool_choice` `REQUIRED` OpenAI's
`required` and `NONE` its `none` (none given: `auto`), so the chat template, the tool parsers
and the grammars are the chat route's. Sampling defaults are Cohere's documented ones
(temperature 0.3, `p` 0.75, `k` off). Fields this server does not know are ignored, as on the
other routes; `safety_mode`, `citation_options`, `strict_tools` (calls are held to their
schemas whenever they are required) and `thinking` are accepted and have no effect. Images,
`documents` (grounded generation with citations) and `logprobs` are refused, naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from protocols.constraints import ANY_OBJECT, Constraint, constrained, schema_text
from protocols.errors import invalid
from protocols.generation import (
    GenerationRequest,
    MaxNewTokens,
    Priority,
    SamplingOptions,
    Seed,
    Temperature,
)
from protocols.openai_requests import OpenAICall, decode_body
from protocols.tool_calls import (
    FunctionName,
    FunctionSpec,
    Tool,
    ToolChoice,
    ToolUse,
    decode_tool_use,
)

# Cohere's documented bounds.
TopP = Annotated[float, Meta(ge=0.01, le=0.99)]
TopK = Annotated[int, Meta(ge=0, le=500)]
Penalty = Annotated[float, Meta(ge=0.0, le=1.0)]
StopSequences = Annotated[list[str], Meta(max_length=5)]
# Cohere's defaults, where the request gives none.
DEFAULT_TEMPERATURE = 0.3
DEFAULT_P = 0.75


class CohereCallFunction(msgspec.Struct, kw_only=True):
    name: str = ""
    arguments: str = "{}"  # JSON, as the answer gave it


class CohereToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: CohereCallFunction | None = None


class CohereMessage(msgspec.Struct, kw_only=True):
    """One of v2's four messages: `content` a string or a list of content blocks (`text`;
    `thinking` in an assistant's, `document` in a tool's)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[CohereToolCall] | None = None  # an assistant's
    tool_plan: str | None = None  # an assistant's plan for its calls
    tool_call_id: str | None = None  # a tool's: the call it answers


class CohereFunction(msgspec.Struct, kw_only=True):
    name: FunctionName
    parameters: dict[str, Any] | None = None
    description: str | None = None


class CohereTool(msgspec.Struct, kw_only=True):
    function: CohereFunction
    type: Literal["function"] = "function"


class CohereResponseFormat(msgspec.Struct, kw_only=True):
    type: Literal["text", "json_object"]
    json_schema: dict[str, Any] | None = None


class CohereChatRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: Annotated[list[CohereMessage], Meta(min_length=1)]
    stream: bool = False
    tools: Annotated[list[CohereTool], Meta(min_length=1, max_length=128)] | None = None
    strict_tools: bool | None = None
    tool_choice: Literal["REQUIRED", "NONE"] | None = None
    documents: list[Any] | None = None
    response_format: CohereResponseFormat | None = None
    max_tokens: MaxNewTokens | None = None
    stop_sequences: StopSequences | None = None
    temperature: Temperature | None = None
    seed: Seed | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    k: TopK | None = None
    p: TopP | None = None
    logprobs: bool | None = None
    priority: Priority | None = None  # a class at or behind the route's (docs/PRIORITIES.md)


_CHOICES: dict[str | None, ToolChoice | None] = {"REQUIRED": "required", "NONE": "none", None: None}
# The content blocks each role's message may carry.
_BLOCKS: dict[str, frozenset[str]] = {
    "system": frozenset({"text"}),
    "user": frozenset({"text"}),
    "assistant": frozenset({"text", "thinking"}),
    "tool": frozenset({"text", "document"}),
}


def decode_chat(raw: bytes, context: int) -> OpenAICall:
    """A `/v2/chat` request as the one-prompt chat call it asks for; `context`: the model's
    context length, the bound when `max_tokens` is not given."""
    body: CohereChatRequest = decode_body(raw, CohereChatRequest)
    if body.documents:
        raise invalid(
            "`documents` (grounded generation with citations) is not served here: put the "
            "documents in a message",
            "documents",
        )
    if body.logprobs:
        raise invalid("`logprobs` is not served on this route", "logprobs")
    messages = tuple(_message(m, i) for i, m in enumerate(body.messages))
    tool_use = _tool_use(body)
    temperature = DEFAULT_TEMPERATURE if body.temperature is None else body.temperature
    options = SamplingOptions(
        max_new_tokens=body.max_tokens or context,
        do_sample=temperature > 0,
        temperature=temperature,
        top_p=DEFAULT_P if body.p is None else body.p,
        top_k=body.k or -1,  # 0: off
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        seed=body.seed,
        stop=tuple(body.stop_sequences or ()),
    )
    constraint = _response_format(body.response_format)
    request = GenerationRequest(
        options=constrained(options, constraint),
        messages=messages,
        tools=tool_use.tools if tool_use is not None else None,
        prompt_field="messages",
        constraint_field=constraint.field if constraint is not None else None,
        stream=body.stream,
        priority=body.priority,
    )
    return OpenAICall(
        model=body.model,
        requests=[request],
        choices=1,
        stream=body.stream,
        include_usage=False,  # Cohere's usage always comes in message-end
        top_logprobs=None,
        tool_use=tool_use,
    )


def _message(message: CohereMessage, index: int) -> dict[str, Any]:
    """One v2 message as the chat template receives it."""
    field = f"messages[{index}]"
    role = message.role
    text = _text(message.content, role, f"{field}.content")
    turn: dict[str, Any] = {"role": role, "content": text}
    if message.tool_calls and role != "assistant":
        raise invalid("Only an assistant message has `tool_calls`", f"{field}.tool_calls")
    if role == "assistant":
        if message.tool_calls:
            turn["tool_calls"] = [_history_call(c) for c in message.tool_calls]
        # the plan the calls came with is what the assistant said
        turn["content"] = text or message.tool_plan or ""
        if not turn["content"] and not message.tool_calls:
            raise invalid("An assistant message needs `content` or `tool_calls`", field)
    elif message.content is None:
        raise invalid("A message needs `content`", f"{field}.content")
    if role == "tool":
        if message.tool_call_id is None:
            raise invalid(
                "A tool message needs the `tool_call_id` it answers", f"{field}.tool_call_id"
            )
        turn["tool_call_id"] = message.tool_call_id
    return turn


def _text(content: str | list[dict[str, Any]] | None, role: str, field: str) -> str:
    """A message's text: its text blocks joined by line breaks, a tool's documents each as the
    JSON of its `data`, an assistant's thinking left out."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for j, block in enumerate(content):
        kind = block.get("type")
        where = f"{field}[{j}]"
        if not isinstance(kind, str) or kind not in _BLOCKS[role]:
            unserved = f"`{kind}` content" if isinstance(kind, str) else "A block without `type`"
            served = ", ".join(f"`{b}`" for b in sorted(_BLOCKS[role]))
            raise invalid(
                f"{unserved} is not served in a {role} message: it reads {served} blocks",
                f"{where}.type",
            )
        if kind == "text":
            parts.append(_string(block.get("text"), f"{where}.text"))
        elif kind == "document":
            document = block.get("document")
            data = document.get("data") if isinstance(document, dict) else None
            if not isinstance(data, dict):
                raise invalid("A document block needs its `data` object", f"{where}.document")
            parts.append(msgspec.json.encode(data).decode())
    return "\n".join(parts)


def _string(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise invalid("Expected a string", field)
    return value


def _history_call(call: CohereToolCall) -> dict[str, Any]:
    """An earlier call as chat templates read it: its arguments an object (transformers'
    convention; arguments that are not a JSON object become an empty one)."""
    function = call.function or CohereCallFunction()
    try:
        arguments = msgspec.json.decode(function.arguments or "{}")
    except msgspec.DecodeError:
        arguments = {}
    if not isinstance(arguments, dict):
        arguments = {}
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": function.name, "arguments": arguments},
    }


def _tool_use(body: CohereChatRequest) -> ToolUse | None:
    if not body.tools:
        if body.tool_choice == "REQUIRED":
            raise invalid("tool_choice `REQUIRED` needs `tools`", "tool_choice")
        return None
    tools = [
        Tool(
            type="function",
            function=FunctionSpec(
                name=t.function.name,
                description=t.function.description,
                parameters=t.function.parameters,
            ),
        )
        for t in body.tools
    ]
    return decode_tool_use(tools, _CHOICES[body.tool_choice], None)


def _response_format(fmt: CohereResponseFormat | None) -> Constraint | None:
    """`json_object`: some JSON object, or one valid against its `json_schema`."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.json_schema is None:
        return Constraint("json", ANY_OBJECT, "response_format")
    where = "response_format.json_schema"
    return Constraint("json", schema_text(fmt.json_schema, where), where)
