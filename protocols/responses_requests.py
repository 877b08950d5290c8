"""OpenAI's Responses API request (`POST /v1/responses`), decoded to the neutral vocabulary (no
I/O). `input` is a string or a list of items: messages (`content` a string or text parts),
`function_call` and `function_call_output` items (and `reasoning` items sent back, not shown to
the model); `tools` are function tools, and `namespace` tools whose functions are the model's as
the top-level ones are (their calls name the namespace). OpenAI's built-in tools (`web_search`,
`file_search`, `shell`...: what Codex CLI sends by default) are accepted and never called: this
server runs none, and its models are shown none, as OpenAI's API leaves a tool the model does
not choose. Fields this server does not know are ignored, as the chat route ignores them; what
it knows but does not serve (`custom` tools, images, files, `conversation`, `background`
without `store`) is refused naming the field.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal, cast

import msgspec
from msgspec import Meta

from protocols.constraints import Constraint, TextFormat, constrained, text_format
from protocols.errors import GenerationError, invalid, validation_error
from protocols.generation import GenerationRequest, MaxNewTokens, Priority, SamplingOptions, TopP
from protocols.openai_requests import Temperature, decode_body
from protocols.sampling_defaults import SamplingDefaults, left_out, with_defaults
from protocols.tool_calls import (
    CalledFunction,
    FunctionSpec,
    NamedChoice,
    NamedFunction,
    Tool,
    ToolCall,
    ToolUse,
    decode_tool_use,
    history_fields,
)

# OpenAI's bounds on `metadata`: 16 pairs, keys up to 64 characters, values up to 512.
Metadata = Annotated[
    dict[Annotated[str, Meta(max_length=64)], Annotated[str, Meta(max_length=512)]],
    Meta(max_length=16),
]
ResponseId = Annotated[str, Meta(min_length=1, max_length=128)]
# OpenAI's built-in tools (the openai SDK's `Tool` union less `function`, `custom` and
# `namespace`): accepted and never called, none shown to the model.
BUILT_IN_TOOLS = frozenset(
    {
        "web_search",
        "web_search_2025_08_26",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "file_search",
        "computer",
        "computer_use_preview",
        "mcp",
        "code_interpreter",
        "programmatic_tool_calling",
        "image_generation",
        "local_shell",
        "shell",
        "tool_search",
        "apply_patch",
    }
)


class TextConfig(msgspec.Struct, kw_only=True):
    format: TextFormat | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    input: str | Annotated[list[dict[str, Any]], Meta(min_length=1)]
    instructions: str | None = None
    previous_response_id: ResponseId | None = None
    store: bool = True
    stream: bool = False
    background: bool = False
    max_output_tokens: MaxNewTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    text: TextConfig | None = None
    metadata: Metadata | None = None
    tools: Annotated[list[dict[str, Any]], Meta(max_length=128)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    conversation: Any = None
    user: str | None = None
    priority: Priority | None = None  # the gateway's extension, as on the chat route


# Input items, each decoded by its `type` (a message may leave it out).


class _Part(msgspec.Struct):
    type: str
    text: str | None = None


class _Message(msgspec.Struct, kw_only=True):
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[_Part]
    type: Literal["message"] = "message"


class _FunctionCall(msgspec.Struct, kw_only=True, omit_defaults=True):
    type: Literal["function_call"]
    call_id: Annotated[str, Meta(min_length=1)]
    name: str
    arguments: str
    namespace: str | None = None  # a `namespace` tool's function


class _FunctionCallOutput(msgspec.Struct, kw_only=True):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Meta(min_length=1)]
    output: str | list[_Part]


_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


class ResponsesCall(msgspec.Struct, frozen=True, kw_only=True):
    """A decoded request. `request` holds the options (and the output constraint); its prompt
    is set by the gateway, which renders `messages` after the stored conversation of
    `previous_response_id`. `items` are the input items as `input_items` lists them (each with
    its id); `echo` the request's fields as the response object repeats them."""

    model: str | None
    request: GenerationRequest
    messages: tuple[dict[str, Any], ...]
    items: tuple[dict[str, Any], ...]
    instructions: str | None
    previous_response_id: str | None
    store: bool
    stream: bool
    background: bool
    tool_use: ToolUse | None
    echo: dict[str, Any]
    # the namespace of each function a `namespace` tool holds (its calls name it)
    namespaces: dict[str, str] = msgspec.field(default_factory=dict)


def defaulted(call: ResponsesCall, defaults: SamplingDefaults) -> ResponsesCall:
    """`call` sampling with the served model's defaults for what it left out, its response
    object reporting the temperature and top_p it samples with."""
    request = with_defaults(call.request, defaults)
    if request is call.request:
        return call
    options = request.options
    echo = {**call.echo, "temperature": options.temperature, "top_p": options.top_p}
    return msgspec.structs.replace(call, request=request, echo=echo)


def decode_responses(raw: bytes, context: int) -> ResponsesCall:
    body: ResponsesRequest = decode_body(raw, ResponsesRequest)
    if body.background and not body.store:
        raise invalid("A `background` response is stored: `store` must be true", "background")
    if body.conversation is not None:
        raise invalid(
            "Conversations are not served: continue with `previous_response_id`", "conversation"
        )
    functions, namespaces = _functions(body.tools or [])
    tool_use = _tool_use(body, functions)
    items = _items(body.input)
    messages = tuple(_messages(items))
    fmt = body.text.format if body.text is not None else None
    constraint = text_format(fmt) if fmt is not None else None
    temperature = 1.0 if body.temperature is None else body.temperature
    options = SamplingOptions(
        max_new_tokens=body.max_output_tokens or context,
        do_sample=temperature > 0,
        temperature=temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=-1,
    )
    request = GenerationRequest(
        options=constrained(options, constraint),
        tools=tool_use.tools if tool_use is not None else None,
        prompt_field="input",
        stream=body.stream or body.background,  # a background response's readers stream it
        priority=body.priority,
        constraint_field=_field(constraint),
        left_out=left_out(temperature=body.temperature, top_p=body.top_p),
    )
    echo = {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {},
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "store": body.store,
        "background": body.background,
        "temperature": temperature,
        "top_p": options.top_p,
        "text": {"format": msgspec.to_builtins(fmt) if fmt else {"type": "text"}},
        "tool_choice": body.tool_choice or ("auto" if body.tools else "none"),
        "tools": body.tools or [],
        "user": body.user,
    }
    return ResponsesCall(
        model=body.model,
        request=request,
        messages=messages,
        items=tuple(items),
        instructions=body.instructions,
        previous_response_id=body.previous_response_id,
        store=body.store,
        stream=body.stream,
        background=body.background,
        tool_use=tool_use,
        echo=echo,
        namespaces=namespaces,
    )


def _field(constraint: Constraint | None) -> str | None:
    return constraint.field if constraint is not None else None


def _functions(given: list[dict[str, Any]]) -> tuple[list[Tool], dict[str, str]]:
    """The functions the model is shown: the function tools and each `namespace` tool's
    functions (with the namespace of each); built-in tools are left out."""
    tools: list[Tool] = []
    namespaces: dict[str, str] = {}
    for i, tool in enumerate(given):
        kind = tool.get("type")
        if not isinstance(kind, str):
            raise invalid("A tool's `type` is a string", f"tools[{i}].type")
        if kind in BUILT_IN_TOOLS:
            continue
        if kind == "namespace":
            name = tool.get("name")
            inner = tool.get("tools")
            if not isinstance(name, str) or not isinstance(inner, list):
                raise invalid("A namespace tool has a `name` and its `tools`", f"tools[{i}]")
            for j, function in enumerate(inner):
                if not isinstance(function, dict):
                    raise invalid("A namespace's tool is an object", f"tools[{i}].tools[{j}]")
                tools.append(_function(function, f"tools[{i}].tools[{j}]"))
                namespaces[tools[-1].function.name] = name
            continue
        tools.append(_function(tool, f"tools[{i}]"))
    return tools, namespaces


def _function(given: dict[str, Any], field: str) -> Tool:
    kind = given.get("type")
    if kind != "function":
        raise invalid(
            f"Function, namespace and built-in tools are served, not `{kind}`", f"{field}.type"
        )
    spec = {k: v for k, v in given.items() if k in ("name", "description", "parameters")}
    try:
        return Tool(type="function", function=msgspec.convert(spec, FunctionSpec))
    except msgspec.ValidationError as e:
        raise validation_error(e, f"$.{field}") from e


def _tool_use(body: ResponsesRequest, tools: list[Tool]) -> ToolUse | None:
    """The functions, as the chat route's tools: their flat form (`{"type": "function",
    "name", "parameters"}`) made the chat's, and `tool_choice` likewise (`auto` or `required`
    with built-in tools alone is `auto` with none to call; `required` is refused)."""
    choice = body.tool_choice
    named: Literal["none", "auto", "required"] | NamedChoice | None
    if choice is None or choice in ("none", "auto", "required"):
        named = cast(Literal["none", "auto", "required"] | None, choice)
    elif isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if not isinstance(name, str):
            raise invalid("A function tool_choice names its function", "tool_choice.name")
        named = NamedChoice(function=NamedFunction(name))
    else:
        raise invalid(
            "tool_choice is `none`, `auto`, `required` or a function tool "
            '(`{"type": "function", "name": ...}`)',
            "tool_choice",
        )
    if not tools and body.tools:  # built-in tools only: none for the model to call
        if named == "required":
            raise invalid(
                "tool_choice `required` needs a function tool: built-in tools are never "
                "called here",
                "tool_choice",
            )
        named = None
    try:
        return decode_tool_use(tools or None, named, body.parallel_tool_calls)
    except GenerationError as e:  # it names the chat's fields; the Responses API's are flat
        e.field = e.field.replace(".function.", ".") if e.field else e.field
        raise


def _items(given: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input items as `input_items` lists them, each checked and given an id."""
    if isinstance(given, str):
        given = [{"role": "user", "content": given}]
    items = []
    for i, item in enumerate(given):
        kind = item.get("type", "message")
        where = f"$.input[{i}]"
        try:
            match kind:
                case "message":
                    message = msgspec.convert(item, _Message)
                    items.append(_message_item(message, i))
                case "function_call":
                    call = msgspec.convert(item, _FunctionCall)
                    items.append(
                        {"id": "fc_" + uuid.uuid4().hex, **msgspec.to_builtins(call)}
                        | {"status": "completed"}
                    )
                case "reasoning":
                    continue  # an earlier answer's reasoning: these models are not shown it
                case "function_call_output":
                    out = msgspec.convert(item, _FunctionCallOutput)
                    text = _text(out.output, f"input[{i}].output")
                    items.append(
                        {
                            "id": "fco_" + uuid.uuid4().hex,
                            "type": "function_call_output",
                            "call_id": out.call_id,
                            "output": text,
                            "status": "completed",
                        }
                    )
                case _:
                    raise invalid(
                        f"Input items are messages, function_call, function_call_output and "
                        f"reasoning items, not `{kind}`",
                        f"input[{i}].type",
                    )
        except msgspec.ValidationError as e:
            raise validation_error(e, where) from e
    return items


def _message_item(message: _Message, index: int) -> dict[str, Any]:
    text = _text(message.content, f"input[{index}].content")
    part = "output_text" if message.role == "assistant" else "input_text"
    content: dict[str, Any] = {"type": part, "text": text}
    if part == "output_text":
        content["annotations"] = []
    return {
        "id": "msg_" + uuid.uuid4().hex,
        "type": "message",
        "role": message.role,
        "status": "completed",
        "content": [content],
    }


def _text(content: str | list[_Part], field: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type not in _TEXT_PARTS or part.text is None:
            raise invalid(
                f"Only text content is served (`input_text`), not `{part.type}`",
                f"{field}[{j}].type",
            )
        texts.append(part.text)
    return "\n".join(texts)


def _messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items as the chat template receives them: a function call joins the assistant
    message before it (or opens one), its output is a `tool` message."""
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        match item["type"]:
            case "message":
                messages.append({"role": item["role"], "content": item["content"][0]["text"]})
            case "function_call":
                call = ToolCall(
                    id=item["call_id"], function=CalledFunction(item["name"], item["arguments"])
                )
                [wire] = history_fields("assistant", [call], None, i)["tool_calls"]
                last = messages[-1] if messages else None
                if last is None or last["role"] != "assistant":
                    last = {"role": "assistant", "content": ""}
                    messages.append(last)
                last.setdefault("tool_calls", []).append(wire)
            case "function_call_output":
                fields = history_fields("tool", None, item["call_id"], i)
                messages.append({"role": "tool", "content": item["output"], **fields})
    return messages
