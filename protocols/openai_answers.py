"""OpenAI's answers: chat completions and completions, whole or as `chat.completion.chunk` /
`text_completion` server-sent events ending in `data: [DONE]`, and OpenAI's error object."""

from __future__ import annotations

import datetime
import math
import time
import uuid
from typing import Any, Literal, assert_never

import msgspec
from msgspec import UNSET, UnsetType

from protocols.errors import ErrorKind, GenerationError
from protocols.events import Delta, Finished, GeneratedSequence, TokenInfo, top_tokens
from protocols.openai_requests import OpenAICall
from protocols.sse import sse_event
from protocols.tool_calls import ToolAnswers

DONE = sse_event(b"[DONE]")
_ENCODER = msgspec.json.Encoder()


class PromptDetails(msgspec.Struct):
    cached_tokens: int  # read from vLLM's prefix cache


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptDetails


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct):
    content: list[TokenLogprob]


class TextLogprobs(msgspec.Struct):
    """null for a token the engine scored nothing for: an echoed prompt's first."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class Message(msgspec.Struct, omit_defaults=True):
    role: Literal["assistant"] | UnsetType = UNSET
    content: str | UnsetType | None = UNSET  # null beside tool calls
    # protocols/tool_calls.py: ToolCall in a whole answer, ToolCallDelta in a chunk
    tool_calls: list[Any] | UnsetType = UNSET


class ChatChoice(msgspec.Struct):
    index: int
    message: Message
    logprobs: ChatLogprobs | None
    finish_reason: str


class ChunkChoice(msgspec.Struct):
    index: int
    delta: Message
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class TextChoice(msgspec.Struct):
    index: int
    text: str
    logprobs: TextLogprobs | None
    finish_reason: str | None


class Answer(msgspec.Struct, omit_defaults=True):
    """Every answer shape: `object` tells which."""

    id: str
    object: str
    created: int
    model: str
    choices: list[Any]  # ChatChoice, ChunkChoice or TextChoice
    usage: Usage | UnsetType | None = UNSET


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | int | None


class ErrorBody(msgspec.Struct):
    error: ErrorDetail


class Model(msgspec.Struct, kw_only=True):
    """One model GET `/v1/models` lists: the served model, or a LoRA adapter (as vLLM lists
    it: `root` where it was loaded from, `parent` the base model). One shape both families'
    SDKs accept (each ignores the other's fields): `object`, `created` and `owned_by` for the
    openai SDK's `Model`; `type`, `display_name`, `created_at` and `lifecycle` for the
    anthropic SDK's `ModelInfo` (`max_input_tokens`: the context)."""

    id: str
    max_model_len: int
    created: int
    object: str = "model"
    owned_by: str = "llm-gateway"
    type: str = "model"
    display_name: str = ""
    created_at: str = ""  # RFC 3339, `created`'s
    lifecycle: str = "active"
    max_input_tokens: int | UnsetType = UNSET
    root: str | UnsetType = UNSET
    parent: str | UnsetType = UNSET
    task: str | UnsetType = UNSET  # set for a model that does not generate (`embed`)
    status: str | UnsetType = UNSET  # an embedding model's engine: ready, loading or failed
    # Whether its engine is loaded (docs/MODELS.md): loaded, loading, unloaded or failed
    state: str | UnsetType = UNSET

    def __post_init__(self) -> None:
        self.display_name = self.display_name or self.id
        if not self.created_at:
            when = datetime.datetime.fromtimestamp(self.created, datetime.UTC)
            self.created_at = when.isoformat().replace("+00:00", "Z")
        if self.max_input_tokens is UNSET:
            self.max_input_tokens = self.max_model_len


class ModelList(msgspec.Struct, kw_only=True):
    """OpenAI's list (`object`, `data`) and Anthropic's page (`has_more`, `first_id`,
    `last_id`: every model on one page)."""

    data: list[Model]
    object: str = "list"
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None

    def __post_init__(self) -> None:
        if self.data:
            self.first_id, self.last_id = self.data[0].id, self.data[-1].id


def error_of(error: GenerationError) -> tuple[int, bytes]:
    """The status the `openai` client maps to its exception classes, and OpenAI's body."""
    status, kind = _status(error.kind)
    code = _CODES.get(error.kind)
    param = (error.field or "").removeprefix("$").removeprefix(".") or None  # as sent
    return status, _ENCODER.encode(ErrorBody(ErrorDetail(error.message, kind, param, code)))


_CODES = {
    ErrorKind.CONTEXT_LENGTH_EXCEEDED: "context_length_exceeded",
    ErrorKind.UNAUTHORIZED: "invalid_api_key",
}


def not_found(message: str) -> bytes:
    detail = ErrorDetail(message, "invalid_request_error", "model", "model_not_found")
    return _ENCODER.encode(ErrorBody(detail))


def _status(kind: ErrorKind) -> tuple[int, str]:
    match kind:
        case ErrorKind.INVALID_REQUEST | ErrorKind.CONTEXT_LENGTH_EXCEEDED:
            return 400, "invalid_request_error"
        case ErrorKind.UNPROCESSABLE:
            return 422, "invalid_request_error"
        case ErrorKind.DUPLICATE_REQUEST_ID:
            return 409, "invalid_request_error"
        case ErrorKind.RATE_LIMITED:
            return 429, "rate_limit_error"
        case ErrorKind.UNAUTHORIZED:
            return 401, "invalid_request_error"
        case ErrorKind.ENGINE_ERROR:
            return 500, "server_error"
        case ErrorKind.ENGINE_UNAVAILABLE:
            return 503, "server_error"
        case _:
            assert_never(kind)


class OpenAIEncoder:
    """One call's answer: `chat` picks chat completions over text completions; `lines` frames
    a stream as JSON lines (LMI's chat streaming) rather than server-sent events ending in
    `[DONE]`. `served` names the model when the request named none. `tools` reads a chat's
    choices for tool calls (gateway/engine/tool_calls.py), when the request has tools."""

    def __init__(
        self,
        call: OpenAICall,
        served: str,
        *,
        chat: bool,
        lines: bool = False,
        tools: ToolAnswers | None = None,
    ) -> None:
        self.call = call
        self.chat = chat
        self.tools = tools
        self.model = call.model or served
        self._frame = _line if lines else sse_event
        self._done = b"" if lines else DONE
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self._object = "chat.completion" if chat else "text_completion"
        self._chunk = "chat.completion.chunk" if chat else "text_completion"
        self._prompt_tokens = self._completion_tokens = self._cached_tokens = 0

    def document(self, finished: list[Finished]) -> bytes:
        """The whole answer, from each prompt's Finished in order."""
        choices: list[ChatChoice | TextChoice] = []
        for prompt, done in enumerate(finished):
            self.count(done, first=True)
            for j, sequence in enumerate(done.sequences):
                choices.append(self._choice(prompt * self.call.choices + j, sequence, done))
        answer = Answer(self.id, self._object, self.created, self.model, choices, self.usage)
        return _ENCODER.encode(answer)

    def count(self, done: Finished, *, first: bool) -> None:
        """Add a Finished to the usage; `first`: the first choice of its prompt."""
        if not self.call.prompt_only:
            self._completion_tokens += sum(s.generated_tokens for s in done.sequences)
        if first:
            self._prompt_tokens += done.prompt_tokens
            self._cached_tokens += done.cached_tokens

    @property
    def usage(self) -> Usage:
        prompt, completion = self._prompt_tokens, self._completion_tokens
        return Usage(prompt, completion, prompt + completion, PromptDetails(self._cached_tokens))

    def opening(self, index: int) -> bytes:
        """A chat choice's first chunk: the role."""
        return self._event([ChunkChoice(index, Message(role="assistant", content=""))])

    def chunk(self, delta: Delta) -> bytes:
        """A streamed step's chunk; empty when it adds nothing a client sees (a step inside a
        tool call's markup)."""
        logprobs = self._chat_logprobs(delta.tokens) if self.chat else None
        if self.chat and self.tools is not None:
            return self._tool_chunk(delta, logprobs)
        if self.chat:
            choice: ChunkChoice | TextChoice = ChunkChoice(
                delta.index, Message(content=delta.text), logprobs, delta.finish_reason
            )
        else:
            text_logprobs = self._text_logprobs(delta.tokens)
            choice = TextChoice(delta.index, delta.text, text_logprobs, delta.finish_reason)
        return self._event([choice])

    def _tool_chunk(self, delta: Delta, logprobs: ChatLogprobs | None) -> bytes:
        assert self.tools is not None
        parsed = self.tools.delta(delta.index, delta.text, delta.token_ids, delta.finish_reason)
        calls = parsed.tool_calls
        if parsed.content is None and not calls and not parsed.finish_reason and not logprobs:
            return b""
        content = UNSET if parsed.content is None else parsed.content
        message = Message(content=content, tool_calls=calls or UNSET)
        return self._event([ChunkChoice(delta.index, message, logprobs, parsed.finish_reason)])

    def whole_choice(self, done: Finished) -> bytes:
        """A streamed choice sent whole, in one chunk (an echo: the prompt's log-probabilities
        come with the end)."""
        [sequence] = done.sequences
        return self._event([self._choice(done.index, sequence, done)])

    def closing(self) -> bytes:
        """The usage chunk (when asked for), then [DONE]."""
        if not self.call.include_usage:
            return self._done
        usage = Answer(self.id, self._chunk, self.created, self.model, [], self.usage)
        return self._frame(_ENCODER.encode(usage)) + self._done

    def failure(self, error: GenerationError) -> bytes:
        return self._frame(error_of(error)[1]) + self._done

    def _event(self, choices: list[Any]) -> bytes:
        usage: Usage | UnsetType | None = None if self.call.include_usage else UNSET
        answer = Answer(self.id, self._chunk, self.created, self.model, choices, usage)
        return self._frame(_ENCODER.encode(answer))

    def _choice(
        self, index: int, sequence: GeneratedSequence, done: Finished
    ) -> ChatChoice | TextChoice:
        reason = sequence.finish_reason
        if self.chat:
            message = Message(role="assistant", content=sequence.text)
            if self.tools is not None:
                parsed = self.tools.message(index, sequence.text, reason)
                calls = parsed.tool_calls or UNSET
                message = Message(role="assistant", content=parsed.content, tool_calls=calls)
                reason = parsed.finish_reason
            return ChatChoice(index, message, self._chat_logprobs(sequence.tokens), reason)
        text, tokens = sequence.text, sequence.tokens
        if self.call.prompt_only:
            text, tokens = "", []
        if self.call.echo_prompts is not None:
            text = self.call.echo_prompts[index // self.call.choices] + text
            if tokens is not None and done.prefill is not None:
                tokens = done.prefill + tokens
        return TextChoice(index, text, self._text_logprobs(tokens), reason)

    def _chat_logprobs(self, tokens: list[TokenInfo] | None) -> ChatLogprobs | None:
        top = self.call.top_logprobs
        if top is None or tokens is None:
            return None
        return ChatLogprobs(
            [
                TokenLogprob(
                    t.text,
                    t.logprob,
                    list(t.text.encode()),
                    [_top(a.text, a.logprob) for a in top_tokens(t, top)],
                )
                for t in tokens
            ]
        )

    def _text_logprobs(self, tokens: list[TokenInfo] | None) -> TextLogprobs | None:
        """Offsets count from the start of this choice's text in this answer or chunk (the
        echoed prompt's included). Each position's top tokens include the chosen one, as
        OpenAI's completions and vLLM's list them (up to `logprobs` + 1)."""
        top = self.call.top_logprobs
        if top is None or tokens is None:
            return None
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t.text)
        scored = [not math.isnan(t.logprob) for t in tokens]
        return TextLogprobs(
            [t.text for t in tokens],
            [t.logprob if s else None for t, s in zip(tokens, scored, strict=True)],
            [
                {t.text: t.logprob, **{a.text: a.logprob for a in top_tokens(t, top)}}
                if s
                else None
                for t, s in zip(tokens, scored, strict=True)
            ],
            offsets,
        )


def _line(data: bytes) -> bytes:
    return data + b"\n"


def _top(text: str, logprob: float) -> TopLogprob:
    return TopLogprob(text, logprob, list(text.encode()))
