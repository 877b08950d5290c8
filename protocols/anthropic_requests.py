"""Anthropic's Messages API requests (`POST /v1/messages`, `/v1/messages/count_tokens`),
decoded to the neutral vocabulary (no I/O).

A Messages request becomes the same `OpenAICall` a chat completion does: its `system` a
system message, its `tool_use` blocks an assistant's tool calls, its `tool_result` blocks tool
messages, its `tools` OpenAI's function tools (so the chat template, the tool parsers and the
grammars are the chat route's). Fields this server does not know are ignored, as on the other
routes; `thinking` is accepted and ignored (the served models do not think). Tools marked
`defer_loading` stay out of the prompt until a `tool_reference` block (in a tool result: what
Claude Code's tool search answers) names them, as Anthropic's tool search has it. Images,
documents and Anthropic's server tools (web search, code execution...) are refused, naming
the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from protocols.constraints import Constraint, constrained, only_one
from protocols.errors import invalid, validation_error
from protocols.generation import GenerationRequest, MaxNewTokens, SamplingOptions, TopK, TopP
from protocols.openai_requests import OpenAICall, decode_body
from protocols.sampling_defaults import left_out
from protocols.tool_calls import (
    FunctionSpec,
    NamedChoice,
    NamedFunction,
    Tool,
    ToolUse,
    decode_tool_use,
)

Temperature = Annotated[float, Meta(ge=0.0, le=1.0)]
StopSequences = Annotated[list[str], Meta(max_length=16)]
# Anthropic's rule for a tool's name, no longer than OpenAI's (the chat route's tools)
ToolName = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


class TextBlock(msgspec.Struct, tag="text", kw_only=True):
    text: str


class ToolUseBlock(msgspec.Struct, tag="tool_use", kw_only=True):
    id: str
    name: str
    input: dict[str, Any]


class ToolReferenceBlock(msgspec.Struct, tag="tool_reference", kw_only=True):
    """A tool result's reference to a tool of `tools`: a deferred one is loaded by it."""

    tool_name: str


ResultBlock = TextBlock | ToolReferenceBlock


class ToolResultBlock(msgspec.Struct, tag="tool_result", kw_only=True):
    tool_use_id: str
    content: str | list[dict[str, Any]] = ""
    is_error: bool = False


class ThinkingBlock(msgspec.Struct, tag="thinking", kw_only=True):
    """An earlier answer's thinking, sent back as the API asks: not shown to these models."""

    thinking: str = ""
    signature: str = ""


class RedactedThinkingBlock(msgspec.Struct, tag="redacted_thinking", kw_only=True):
    data: str = ""


Block = TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
_BLOCK_TYPES = frozenset(b.__struct_config__.tag for b in Block.__args__)


class InputMessage(msgspec.Struct, kw_only=True):
    # `system` among the messages, as Claude Code sends it: folded into the system prompt
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class CustomTool(msgspec.Struct, kw_only=True):
    name: ToolName
    # required of a custom tool; optional here so a server tool, which has none, is refused
    # naming its `type`
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    type: str | None = None  # `custom`, or left out; anything else is a server tool
    # out of the prompt until a `tool_reference` names it (Anthropic's tool search)
    defer_loading: bool = False


class ToolChoiceParam(msgspec.Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class Metadata(msgspec.Struct, kw_only=True):
    user_id: str | None = None


class JsonOutputFormat(msgspec.Struct, kw_only=True):
    """Anthropic's structured outputs: the answer's text is JSON valid against `schema`."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = msgspec.field(name="schema")


class OutputConfig(msgspec.Struct, kw_only=True):
    format: JsonOutputFormat | None = None  # `effort` and the rest: ignored


class _Conversation(msgspec.Struct, kw_only=True):
    """What a Messages request and a token count share."""

    model: str
    messages: Annotated[list[InputMessage], Meta(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: Annotated[list[CustomTool], Meta(max_length=128)] | None = None
    tool_choice: ToolChoiceParam | None = None


class MessagesRequest(_Conversation, kw_only=True):
    max_tokens: MaxNewTokens
    stop_sequences: StopSequences | None = None
    stream: bool = False
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    metadata: Metadata | None = None
    output_config: OutputConfig | None = None
    output_format: JsonOutputFormat | None = None  # the structured-outputs beta's name for it


class CountTokensRequest(_Conversation, kw_only=True):
    pass


class Conversation(msgspec.Struct, frozen=True, kw_only=True):
    """A request's chat, as the chat template receives it."""

    model: str
    messages: tuple[dict[str, Any], ...]
    tool_use: ToolUse | None


def decode_messages(raw: bytes) -> OpenAICall:
    """A `/v1/messages` request as the one-prompt chat call it asks for."""
    body: MessagesRequest = decode_body(raw, MessagesRequest)
    conversation = _conversation(body)
    temperature = 1.0 if body.temperature is None else body.temperature
    options = SamplingOptions(
        max_new_tokens=body.max_tokens,
        do_sample=temperature > 0,
        temperature=temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=-1 if body.top_k is None else body.top_k,
        stop=tuple(body.stop_sequences or ()),
    )
    tools = conversation.tool_use.tools if conversation.tool_use is not None else None
    constraint = only_one(
        _format(body.output_config.format if body.output_config else None, "output_config.format"),
        _format(body.output_format, "output_format"),
    )
    request = GenerationRequest(
        options=constrained(options, constraint),
        messages=conversation.messages,
        tools=tools,
        prompt_field="messages",
        stream=body.stream,
        constraint_field=constraint.field if constraint is not None else None,
        left_out=left_out(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k),
    )
    return OpenAICall(
        model=body.model,
        requests=[request],
        choices=1,
        stream=body.stream,
        include_usage=False,  # Anthropic's usage always comes in message_delta
        top_logprobs=None,
        tool_use=conversation.tool_use,
    )


def _format(fmt: JsonOutputFormat | None, field: str) -> Constraint | None:
    """Structured outputs held by the engine as every route's JSON schemas are (the same
    constraint budget)."""
    if fmt is None:
        return None
    return Constraint("json", msgspec.json.encode(fmt.schema_).decode(), f"{field}.schema")


def decode_count_tokens(raw: bytes) -> Conversation:
    """A `/v1/messages/count_tokens` request: the chat whose prompt tokens it counts."""
    return _conversation(decode_body(raw, CountTokensRequest))


def _conversation(body: _Conversation) -> Conversation:
    """The chat: one system message first, `system` and then every `system` message among the
    messages in their order (the chat templates take one system turn, at the start)."""
    system: list[str] = []
    if body.system is not None:
        system.append(body.system if isinstance(body.system, str) else _joined(body.system))
    said: list[dict[str, Any]] = []
    referenced: dict[str, str] = {}  # each tool a `tool_reference` names, and where
    for i, message in enumerate(body.messages):
        if message.role == "system":
            system.append(_system_text(message, i))
        else:
            said.extend(_chat_messages(message, i, referenced))
    if not said:
        raise invalid("messages needs a user or assistant message", "messages")
    messages = [{"role": "system", "content": "\n\n".join(system)}] if system else []
    messages.extend(said)
    tool_use = _tool_use(body, referenced)
    return Conversation(model=body.model, messages=tuple(messages), tool_use=tool_use)


def _system_text(message: InputMessage, index: int) -> str:
    """A `system` message's text: a string or text blocks, nothing else."""
    if isinstance(message.content, str):
        return message.content
    texts: list[TextBlock] = []
    for j, raw_block in enumerate(message.content):
        field = f"messages[{index}].content[{j}]"
        block = _block(raw_block, field)
        if not isinstance(block, TextBlock):
            raise invalid("A system message holds only `text` blocks", f"{field}.type")
        texts.append(block)
    return _joined(texts)


def _chat_messages(
    message: InputMessage, index: int, referenced: dict[str, str]
) -> list[dict[str, Any]]:
    """One input message as chat-template messages: a user's tool results come first, each a
    tool message; an assistant's tool uses are its `tool_calls`. The tools `tool_reference`
    blocks name go into `referenced`."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, raw_block in enumerate(message.content):
        field = f"messages[{index}].content[{j}]"
        block = _block(raw_block, field)
        match block:
            case TextBlock(text=text):
                texts.append(text)
            case ToolUseBlock() if message.role == "assistant":
                function = {"name": block.name, "arguments": block.input}
                calls.append({"id": block.id, "type": "function", "function": function})
            case ToolResultBlock() if message.role == "user":
                text = _result_text(block.content, f"{field}.content", referenced)
                results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": text})
            case ToolUseBlock() | ToolResultBlock():
                raise invalid(
                    f"A `{block.__struct_config__.tag}` block belongs in "
                    f"{'an assistant' if isinstance(block, ToolUseBlock) else 'a user'} message",
                    f"{field}.type",
                )
    if not texts and not calls and not results:
        raise invalid(
            "A message needs text, `tool_use` or `tool_result` content",
            f"messages[{index}].content",
        )
    said: list[dict[str, Any]] = []
    if texts or calls:
        turn: dict[str, Any] = {"role": message.role, "content": "\n".join(texts)}
        if calls:
            turn["tool_calls"] = calls
        said.append(turn)
    return results + said


def _result_text(
    content: str | list[dict[str, Any]], field: str, referenced: dict[str, str]
) -> str:
    """A tool result's text: its text blocks, and a line for each tool a `tool_reference`
    block loads (the tool itself joins the prompt's tools)."""
    if isinstance(content, str):
        return content
    lines: list[str] = []
    for k, raw in enumerate(content):
        where = f"{field}[{k}]"
        if raw.get("type") not in ("text", "tool_reference"):
            kind = raw.get("type")
            raise invalid(
                f"`{kind}` content is not served in a tool result here: `text` and "
                "`tool_reference` blocks are",
                f"{where}.type",
            )
        try:
            block: ResultBlock = msgspec.convert(raw, ResultBlock)
        except msgspec.ValidationError as e:
            raise validation_error(e, where) from e
        if isinstance(block, ToolReferenceBlock):
            referenced.setdefault(block.tool_name, f"{where}.tool_name")
            lines.append(f"Tool loaded: {block.tool_name}")
        else:
            lines.append(block.text)
    return "\n".join(lines)


def _block(raw: dict[str, Any], field: str) -> Block:
    kind = raw.get("type")
    if not isinstance(kind, str) or kind not in _BLOCK_TYPES:
        unserved = f"`{kind}` content" if isinstance(kind, str) else "A block without its `type`"
        raise invalid(
            f"{unserved} is not served here: this server's models read text, `tool_use` and "
            "`tool_result` blocks",
            f"{field}.type",
        )
    try:
        block: Block = msgspec.convert(raw, Block)
    except msgspec.ValidationError as e:
        raise validation_error(e, field) from e
    return block


def _joined(blocks: list[TextBlock]) -> str:
    return "\n".join(block.text for block in blocks)


def _tool_use(body: _Conversation, referenced: dict[str, str]) -> ToolUse | None:
    """Anthropic's tools and tool_choice as OpenAI's: `any` is `required`, `tool` names a
    function, `disable_parallel_tool_use` is `parallel_tool_calls: false`. A deferred tool
    is among them once referenced (or named by `tool_choice`); a reference to a tool `tools`
    does not have is refused where it is."""
    choice = body.tool_choice
    declared = [t.name for t in body.tools or ()]
    for name, where in referenced.items():
        if name not in declared:
            raise invalid(f"The tool_reference names {name!r}, which `tools` does not have", where)
    if not body.tools:
        if choice is not None and choice.type in ("any", "tool"):
            raise invalid(f"tool_choice `{choice.type}` needs `tools`", "tool_choice.type")
        return None
    for i, tool in enumerate(body.tools):
        if tool.type not in (None, "custom"):
            raise invalid(
                f"The server tool `{tool.type}` is not served here: only custom tools",
                f"tools[{i}].type",
            )
        if tool.input_schema is None:
            raise invalid(
                f"A custom tool needs its `input_schema` - at `tools[{i}].input_schema`",
                f"tools[{i}].input_schema",
            )
    named = choice.name if choice is not None and choice.type == "tool" else None
    if choice is not None and choice.type == "tool" and named not in declared:
        raise invalid(
            f"tool_choice names the tool {named!r}, which `tools` does not have "
            f"(it has {', '.join(map(repr, declared))})",
            "tool_choice.name",
        )
    loaded = [
        t for t in body.tools if not t.defer_loading or t.name in referenced or t.name == named
    ]
    if not loaded:  # every tool deferred, none referenced yet: none shown to the model
        if choice is not None and choice.type == "any":
            raise invalid(
                "tool_choice `any` needs a tool the model is shown: every tool is deferred "
                "(`defer_loading`) and none referenced",
                "tool_choice.type",
            )
        return None
    tools = [
        Tool(
            type="function",
            function=FunctionSpec(
                name=t.name, description=t.description, parameters=t.input_schema or {}
            ),
        )
        for t in loaded
    ]
    if choice is None:
        return decode_tool_use(tools, None, None)
    parallel = not choice.disable_parallel_tool_use
    match choice.type:
        case "auto" | "none":
            return decode_tool_use(tools, choice.type, parallel)
        case "any":
            return decode_tool_use(tools, "required", parallel)
        case "tool":
            assert choice.name is not None  # checked above
            return decode_tool_use(
                tools, NamedChoice(function=NamedFunction(choice.name)), parallel
            )
