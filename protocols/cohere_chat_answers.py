"""Cohere's chat (`/v2/chat`) answers: a whole answer (`id`, `finish_reason`, the assistant
`message`, `usage`) and its server-sent event stream, as the `cohere` SDK (7.x) parses them
(its `V2ChatResponse` and `V2ChatStreamResponse`, told apart by each event's `type`).

A stream is `message-start`, then a `content-start` / `content-delta`... / `content-end` block
for text and a `tool-call-start` / `tool-call-delta`... / `tool-call-end` block for each call,
then `message-end` with the finish reason and usage (or, when generation fails after the stream
began, with `finish_reason` `ERROR` and the `error`), then `data: [DONE]` (the terminator of
Cohere's API definition, where the SDK stops reading). A whole answer with calls carries the
text the model wrote before them as `tool_plan`, Cohere's convention; a stream sends that text
as it comes, before the calls are known, as content. Usage counts the prompt's tokens
(`cached_tokens` those read from the prefix cache) and the generated ones.
"""

from __future__ import annotations

import uuid
from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

from protocols.errors import GenerationError, named
from protocols.events import Delta, Finished, GeneratedSequence
from protocols.openai_requests import OpenAICall
from protocols.sse import sse_event
from protocols.tool_calls import ToolAnswers, ToolCallDelta, read_step

FinishReason = Literal["COMPLETE", "STOP_SEQUENCE", "MAX_TOKENS", "TOOL_CALL", "ERROR"]
_ENCODER = msgspec.json.Encoder()


class TokenCounts(msgspec.Struct):
    input_tokens: int
    output_tokens: int


class ChatUsage(msgspec.Struct):
    billed_units: TokenCounts
    tokens: TokenCounts
    cached_tokens: int


class ChatText(msgspec.Struct, tag="text", tag_field="type"):
    text: str


class ChatCallFunction(msgspec.Struct):
    name: str
    arguments: str  # JSON


class ChatToolCall(msgspec.Struct):
    id: str
    function: ChatCallFunction
    type: Literal["function"] = "function"


class AssistantMessage(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: Literal["assistant"]
    content: list[ChatText] | UnsetType = UNSET
    tool_calls: list[ChatToolCall] | UnsetType = UNSET
    tool_plan: str | UnsetType = UNSET


class ChatAnswer(msgspec.Struct):
    id: str
    finish_reason: FinishReason
    message: AssistantMessage
    usage: ChatUsage


# The stream's events: each `data` is one of these, its `type` the tag.


class StartedRole(msgspec.Struct):
    role: Literal["assistant"] = "assistant"


class StartedMessage(msgspec.Struct):
    message: StartedRole


class MessageStart(msgspec.Struct, tag="message-start", tag_field="type"):
    id: str
    delta: StartedMessage


class ChatTextPiece(msgspec.Struct):
    text: str


class StartedContent(msgspec.Struct):
    content: ChatText


class StartedContentMessage(msgspec.Struct):
    message: StartedContent


class ContentStart(msgspec.Struct, tag="content-start", tag_field="type"):
    index: int
    delta: StartedContentMessage


class ContentPiece(msgspec.Struct):
    content: ChatTextPiece


class ContentPieceMessage(msgspec.Struct):
    message: ContentPiece


class ContentDelta(msgspec.Struct, tag="content-delta", tag_field="type"):
    index: int
    delta: ContentPieceMessage


class ContentEnd(msgspec.Struct, tag="content-end", tag_field="type"):
    index: int


class StartedCall(msgspec.Struct):
    tool_calls: ChatToolCall


class StartedCallMessage(msgspec.Struct):
    message: StartedCall


class ToolCallStart(msgspec.Struct, tag="tool-call-start", tag_field="type"):
    index: int
    delta: StartedCallMessage


class ArgumentsPiece(msgspec.Struct):
    arguments: str


class CallPiece(msgspec.Struct):
    function: ArgumentsPiece


class CallPieceHolder(msgspec.Struct):
    tool_calls: CallPiece


class CallPieceMessage(msgspec.Struct):
    message: CallPieceHolder


class ToolCallDeltaEvent(msgspec.Struct, tag="tool-call-delta", tag_field="type"):
    index: int
    delta: CallPieceMessage


class ToolCallEnd(msgspec.Struct, tag="tool-call-end", tag_field="type"):
    index: int


class Ending(msgspec.Struct, omit_defaults=True):
    finish_reason: FinishReason
    usage: ChatUsage | UnsetType = UNSET
    error: str | UnsetType = UNSET


class MessageEnd(msgspec.Struct, tag="message-end", tag_field="type"):
    id: str
    delta: Ending


Event = (
    MessageStart
    | ContentStart
    | ContentDelta
    | ContentEnd
    | ToolCallStart
    | ToolCallDeltaEvent
    | ToolCallEnd
    | MessageEnd
)
DONE = sse_event(b"[DONE]")


def _event(event: Event) -> bytes:
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return sse_event(_ENCODER.encode(event), tag)


class CohereChatEncoder:
    """One `/v2/chat` call's answer, whole or streamed; `tools` reads the answer for tool
    calls, when the request has tools."""

    def __init__(self, call: OpenAICall, tools: ToolAnswers | None = None) -> None:
        self.tools = tools
        self.id = str(uuid.uuid4())
        self._stops = frozenset(call.requests[0].options.stop) if call.requests else frozenset()
        self._block = -1  # the last content block opened (-1: none yet)
        self._open: Literal["text", "call"] | None = None
        self._call = -1  # the call whose block is open, or was last
        self._called = False

    # A whole answer

    def document(self, done: Finished) -> bytes:
        [sequence] = done.sequences
        text, calls = sequence.text, list[ChatToolCall]()
        if self.tools is not None:
            parsed = self.tools.message(0, sequence.text, sequence.finish_reason)
            text = parsed.content or ""
            calls = [
                ChatToolCall(c.id, ChatCallFunction(c.function.name, c.function.arguments))
                for c in parsed.tool_calls
            ]
        message = AssistantMessage(role="assistant")
        if calls:
            message.tool_calls = calls
            if text:
                message.tool_plan = text
        elif text:
            message.content = [ChatText(text)]
        reason = self._finish_reason(sequence, bool(calls))
        return _ENCODER.encode(ChatAnswer(self.id, reason, message, _usage(done)))

    # A stream

    def opening(self) -> bytes:
        return _event(MessageStart(self.id, StartedMessage(StartedRole())))

    def chunk(self, delta: Delta) -> bytes:
        """A generated step's events: blocks opened, added to and closed as its text and calls
        arrive."""
        text, calls = read_step(self.tools, delta)
        out = self._text(text)
        for call in calls:
            out += self._call_piece(call)
        return out

    def closing(self, done: Finished) -> bytes:
        [sequence] = done.sequences
        ending = Ending(self._finish_reason(sequence, self._called), _usage(done))
        return self._close() + _event(MessageEnd(self.id, ending)) + DONE

    def failure(self, error: GenerationError) -> bytes:
        """A failure after the stream began: `message-end` with `ERROR` and the message."""
        message = named(error)
        return self._close() + _event(MessageEnd(self.id, Ending("ERROR", error=message))) + DONE

    def _text(self, text: str) -> bytes:
        if not text:
            return b""
        out = b""
        if self._open != "text":
            out += self._close()
            self._block += 1
            self._open = "text"
            started = StartedContentMessage(StartedContent(ChatText("")))
            out += _event(ContentStart(self._block, started))
        piece = ContentPieceMessage(ContentPiece(ChatTextPiece(text)))
        return out + _event(ContentDelta(self._block, piece))

    def _call_piece(self, call: ToolCallDelta) -> bytes:
        out = b""
        function = call.function if not isinstance(call.function, UnsetType) else None
        if not isinstance(call.id, UnsetType):
            out += self._close()
            name = function.name if function is not None else UNSET
            started = ChatToolCall(call.id, ChatCallFunction(name or "", ""))
            self._call = call.index
            self._open = "call"
            self._called = True
            out += _event(ToolCallStart(call.index, StartedCallMessage(StartedCall(started))))
        arguments = function.arguments if function is not None else UNSET
        if isinstance(arguments, str) and arguments and self._open == "call":
            piece = CallPieceMessage(CallPieceHolder(CallPiece(ArgumentsPiece(arguments))))
            out += _event(ToolCallDeltaEvent(self._call, piece))
        return out

    def _close(self) -> bytes:
        match self._open:
            case "text":
                out = _event(ContentEnd(self._block))
            case "call":
                out = _event(ToolCallEnd(self._call))
            case None:
                return b""
        self._open = None
        return out

    def _finish_reason(self, sequence: GeneratedSequence, called: bool) -> FinishReason:
        if sequence.finish_reason == "length":
            return "MAX_TOKENS"
        if called:
            return "TOOL_CALL"
        stop = sequence.stop_reason
        if isinstance(stop, str) and stop in self._stops:
            return "STOP_SEQUENCE"
        return "COMPLETE"


def _usage(done: Finished) -> ChatUsage:
    generated = sum(s.generated_tokens for s in done.sequences)
    counts = TokenCounts(done.prompt_tokens, generated)
    return ChatUsage(counts, counts, done.cached_tokens)
