"""Anthropic's Messages API answers: a whole `message`, its server-sent event sequence
(`message_start`, `content_block_start` / `content_block_delta` / `content_block_stop`,
`message_delta`, `message_stop`, `ping`), a token count, and Anthropic's error object.

`usage.input_tokens` counts the prompt's tokens that were not read from the prefix cache;
those that were are `cache_read_input_tokens` (Anthropic's total input is their sum). Text
outside tool calls is one `text` block; each call a `tool_use` block whose `input` is its
arguments object (`{}` when a call cut by `max_tokens` left them incomplete).
"""

from __future__ import annotations

import uuid
from typing import Any, Literal, assert_never

import msgspec
from msgspec import UNSET, UnsetType

from protocols.errors import ErrorKind, GenerationError, named
from protocols.events import Delta, Finished, GeneratedSequence
from protocols.openai_requests import OpenAICall
from protocols.sse import sse_event
from protocols.tool_calls import ToolAnswers, ToolCall, ToolCallDelta, read_step

_ENCODER = msgspec.json.Encoder()
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class Usage(msgspec.Struct):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class TextContent(msgspec.Struct, tag="text", tag_field="type"):
    text: str


class ToolUseContent(msgspec.Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any]


Content = TextContent | ToolUseContent


class Message(msgspec.Struct, tag="message", tag_field="type"):
    id: str
    model: str
    content: list[Content]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: Usage
    role: Literal["assistant"] = "assistant"


class TextDelta(msgspec.Struct, tag="text_delta", tag_field="type"):
    text: str


class InputJsonDelta(msgspec.Struct, tag="input_json_delta", tag_field="type"):
    partial_json: str


class MessageStart(msgspec.Struct, tag="message_start", tag_field="type"):
    message: Message


class BlockStart(msgspec.Struct, tag="content_block_start", tag_field="type"):
    index: int
    content_block: Content


class BlockDelta(msgspec.Struct, tag="content_block_delta", tag_field="type"):
    index: int
    delta: TextDelta | InputJsonDelta


class BlockStop(msgspec.Struct, tag="content_block_stop", tag_field="type"):
    index: int


class StopDelta(msgspec.Struct):
    stop_reason: StopReason
    stop_sequence: str | None


class MessageDelta(msgspec.Struct, tag="message_delta", tag_field="type"):
    delta: StopDelta
    usage: Usage


class MessageStop(msgspec.Struct, tag="message_stop", tag_field="type"):
    pass


class Ping(msgspec.Struct, tag="ping", tag_field="type"):
    pass


class TokenCount(msgspec.Struct):
    input_tokens: int


class ErrorDetail(msgspec.Struct):
    type: str
    message: str


class ErrorBody(msgspec.Struct, tag="error", tag_field="type"):
    error: ErrorDetail


Event = MessageStart | BlockStart | BlockDelta | BlockStop | MessageDelta | MessageStop | Ping


def error_of(error: GenerationError) -> tuple[int, bytes]:
    """The status the `anthropic` client maps to its exception classes, and Anthropic's body."""
    status, kind = _status(error.kind)
    return status, _ENCODER.encode(ErrorBody(ErrorDetail(kind, named(error))))


def not_found(message: str) -> bytes:
    return _ENCODER.encode(ErrorBody(ErrorDetail("not_found_error", message)))


def error_event(error: GenerationError) -> bytes:
    """A failure after the stream began: Anthropic's `error` event."""
    return sse_event(error_of(error)[1], "error")


def encode_token_count(input_tokens: int) -> bytes:
    return _ENCODER.encode(TokenCount(input_tokens))


def _status(kind: ErrorKind) -> tuple[int, str]:
    match kind:
        case (
            ErrorKind.INVALID_REQUEST
            | ErrorKind.CONTEXT_LENGTH_EXCEEDED
            | ErrorKind.UNPROCESSABLE
            | ErrorKind.DUPLICATE_REQUEST_ID
        ):
            return 400, "invalid_request_error"
        case ErrorKind.RATE_LIMITED:
            return 429, "rate_limit_error"
        case ErrorKind.UNAUTHORIZED:
            return 401, "authentication_error"
        case ErrorKind.ENGINE_ERROR:
            return 500, "api_error"
        case ErrorKind.ENGINE_UNAVAILABLE:
            return 529, "overloaded_error"
        case _:
            assert_never(kind)


def _event(event: Event) -> bytes:
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return sse_event(_ENCODER.encode(event), tag)


def _arguments(text: str) -> dict[str, Any]:
    try:
        arguments = msgspec.json.decode(text or "{}")
    except msgspec.DecodeError:
        return {}
    return arguments if isinstance(arguments, dict) else {}


class AnthropicEncoder:
    """One Messages call's answer, whole or streamed. `served` names the model when the call
    named none; `tools` reads the answer for tool calls, when the request has tools."""

    def __init__(self, call: OpenAICall, served: str, tools: ToolAnswers | None = None) -> None:
        self.call = call
        self.model = call.model or served
        self.tools = tools
        self.id = "msg_" + uuid.uuid4().hex
        self._stops = frozenset(call.requests[0].options.stop) if call.requests else frozenset()
        self._block = -1  # the streamed content block open now (-1: none yet)
        self._block_kind: Literal["text", "tool_use"] | None = None
        self._called = False  # a tool_use block was streamed

    # A whole answer

    def document(self, done: Finished) -> bytes:
        [sequence] = done.sequences
        content: list[Content] = []
        text, calls = sequence.text, list[ToolCall]()
        called = False
        if self.tools is not None:
            parsed = self.tools.message(0, sequence.text, sequence.finish_reason)
            text, calls = parsed.content or "", parsed.tool_calls
            called = bool(calls)
        if text:
            content.append(TextContent(text))
        for call in calls:
            content.append(
                ToolUseContent(call.id, call.function.name, _arguments(call.function.arguments))
            )
        reason, stop = self._stop_reason(sequence, called)
        message = Message(self.id, self.model, content, reason, stop, self._usage(done))
        return _ENCODER.encode(message)

    # A stream

    def opening(self) -> bytes:
        """`message_start` (the prompt's tokens are counted in `message_delta`), then a ping."""
        start = Message(self.id, self.model, [], None, None, Usage(0, 0))
        return _event(MessageStart(start)) + _event(Ping())

    def chunk(self, delta: Delta) -> bytes:
        """A generated step's events: blocks opened, added to and closed as its text and calls
        arrive."""
        text, calls = read_step(self.tools, delta)
        out = self._text(text)
        for call in calls:
            out += self._call(call)
        return out

    def closing(self, done: Finished) -> bytes:
        """The open block's stop, `message_delta` with the stop reason and usage, `message_stop`."""
        [sequence] = done.sequences
        reason, stop = self._stop_reason(sequence, self._called)
        out = self._close_block()
        out += _event(MessageDelta(StopDelta(reason, stop), self._usage(done)))
        return out + _event(MessageStop())

    def failure(self, error: GenerationError) -> bytes:
        return error_event(error)

    def _text(self, text: str) -> bytes:
        if not text:
            return b""
        out = b""
        if self._block_kind != "text":
            out += self._open(TextContent(""), "text")
        return out + _event(BlockDelta(self._block, TextDelta(text)))

    def _call(self, call: ToolCallDelta) -> bytes:
        out = b""
        function = call.function if not isinstance(call.function, UnsetType) else None
        if not isinstance(call.id, UnsetType):
            name = function.name if function is not None else UNSET
            out += self._open(
                ToolUseContent(call.id, name if isinstance(name, str) else "", {}), "tool_use"
            )
            self._called = True
        arguments = function.arguments if function is not None else UNSET
        if isinstance(arguments, str) and arguments and self._block_kind == "tool_use":
            out += _event(BlockDelta(self._block, InputJsonDelta(arguments)))
        return out

    def _open(self, block: Content, kind: Literal["text", "tool_use"]) -> bytes:
        out = self._close_block()
        self._block += 1
        self._block_kind = kind
        return out + _event(BlockStart(self._block, block))

    def _close_block(self) -> bytes:
        if self._block_kind is None:
            return b""
        self._block_kind = None
        return _event(BlockStop(self._block))

    def _stop_reason(
        self, sequence: GeneratedSequence, called: bool
    ) -> tuple[StopReason, str | None]:
        if called:
            return "tool_use", None
        if sequence.finish_reason == "length":
            return "max_tokens", None
        stop = sequence.stop_reason
        if isinstance(stop, str) and stop in self._stops:
            return "stop_sequence", stop
        return "end_turn", None

    @staticmethod
    def _usage(done: Finished) -> Usage:
        generated = sum(s.generated_tokens for s in done.sequences)
        cached = done.cached_tokens
        return Usage(done.prompt_tokens - cached, generated, 0, cached)
