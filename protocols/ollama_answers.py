"""Ollama's `/api/chat` and `/api/generate` answers (no I/O): a whole answer, or a stream of
NDJSON chunks (`application/x-ndjson`, one JSON object a line), as the `ollama` clients parse
them (`ChatResponse`, `GenerateResponse`).

Each chunk carries `model`, `created_at` and its piece (`message` for a chat, `response` for a
generate); the last has `done: true`, `done_reason` (`stop`, `length`; `load` and `unload` for a
request with no prompt), and the figures: `total_duration` (from the request's arrival),
`load_duration` (before the engine took the prompt: the model's load, the queue),
`prompt_eval_duration` (the engine's prefill, to its first token), `eval_duration` (the rest),
all in nanoseconds, `prompt_eval_count` (the prompt's tokens, the prefix cache's included) and
`eval_count` (the tokens generated); a generate's last chunk also hands back `context`, the
sequence's token ids, to continue from. Tool calls come whole (a call's arguments an object),
in a chunk of their own before the last. An error is `{"error": "..."}`, at Ollama's status
before the stream began and as the stream's last line after.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal, assert_never

import msgspec
from msgspec import UNSET, UnsetType

from protocols.errors import ErrorKind, GenerationError, named
from protocols.events import Delta, Finished
from protocols.tool_calls import ToolAnswers, ToolCallDelta, read_step

NDJSON = "application/x-ndjson"
_ENCODER = msgspec.json.Encoder()
_NS = 1_000_000_000
Kind = Literal["chat", "generate"]


class OllamaError(msgspec.Struct):
    error: str


def status_of(kind: ErrorKind) -> int:
    """Ollama's status per error kind: 400 a bad request, 500 a failure (its own); 401, 429 and
    503 as every route answers them."""
    match kind:
        case (
            ErrorKind.INVALID_REQUEST | ErrorKind.UNPROCESSABLE | ErrorKind.CONTEXT_LENGTH_EXCEEDED
        ):
            return 400
        case ErrorKind.UNAUTHORIZED:
            return 401
        case ErrorKind.DUPLICATE_REQUEST_ID:
            return 409
        case ErrorKind.RATE_LIMITED:
            return 429
        case ErrorKind.ENGINE_ERROR:
            return 500
        case ErrorKind.ENGINE_UNAVAILABLE:
            return 503
        case _:
            assert_never(kind)


def encode_error(message: str) -> bytes:
    return _ENCODER.encode(OllamaError(message))


def error_of(error: GenerationError) -> tuple[int, bytes]:
    """The status and `{"error": ...}` body of `error`, its field named."""
    return status_of(error.kind), encode_error(named(error))


def not_found(model: str) -> bytes:
    """Ollama's 404 for a model it does not have, in its words."""
    return encode_error(f'model "{model}" not found: this server does not download models')


def now() -> str:
    """Ollama's `created_at`: RFC 3339 in UTC."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class OllamaAnswerFunction(msgspec.Struct):
    name: str
    arguments: dict[str, Any]


class OllamaAnswerCall(msgspec.Struct):
    function: OllamaAnswerFunction


class OllamaAnswerMessage(msgspec.Struct, omit_defaults=True):
    role: Literal["assistant"]
    content: str
    tool_calls: list[OllamaAnswerCall] | UnsetType = UNSET


class OllamaChunk(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A chat's chunk (`message`) or a generate's (`response`); the figures on the last."""

    model: str
    created_at: str
    message: OllamaAnswerMessage | UnsetType = UNSET
    response: str | UnsetType = UNSET
    done: bool
    done_reason: str | UnsetType = UNSET
    context: list[int] | UnsetType = UNSET
    total_duration: int | UnsetType = UNSET
    load_duration: int | UnsetType = UNSET
    prompt_eval_count: int | UnsetType = UNSET
    prompt_eval_duration: int | UnsetType = UNSET
    eval_count: int | UnsetType = UNSET
    eval_duration: int | UnsetType = UNSET


def _line(chunk: OllamaChunk) -> bytes:
    return _ENCODER.encode(chunk) + b"\n"


def residency_answer(kind: Kind, model: str, reason: Literal["load", "unload"]) -> bytes:
    """The answer to a request with no prompt: the model loaded (or unloaded)."""
    chunk = OllamaChunk(model=model, created_at=now(), done=True, done_reason=reason)
    if kind == "chat":
        chunk.message = OllamaAnswerMessage("assistant", "")
    else:
        chunk.response = ""
    return _ENCODER.encode(chunk)


class OllamaEncoder:
    """One chat's or generate's answer, whole or streamed; `tools` reads a chat's answer for
    tool calls, when it has tools. `clock` (seconds) times the answer from its creation: the
    route makes it as the request arrives."""

    def __init__(
        self,
        kind: Kind,
        model: str,
        tools: ToolAnswers | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.kind = kind
        self.model = model
        self.tools = tools
        self._clock = clock
        self._arrived = clock()
        self._first: float | None = None  # the first token's arrival
        self._calls: dict[int, list[str]] = {}  # a streamed call's name, then its arguments

    def saw(self, delta: Delta) -> None:
        """A Delta arrived (streamed or collected): the first ends the prompt's evaluation."""
        if self._first is None and delta.token_ids:
            self._first = self._clock()

    # A whole answer

    def document(self, done: Finished) -> bytes:
        [sequence] = done.sequences
        text, calls = sequence.text, list[OllamaAnswerCall]()
        if self.tools is not None and self.kind == "chat":
            parsed = self.tools.message(0, sequence.text, sequence.finish_reason)
            text = parsed.content or ""
            calls = [_call(c.function.name, c.function.arguments) for c in parsed.tool_calls]
        chunk = self._piece(text, calls)
        return _ENCODER.encode(self._ended(chunk, done))

    # A stream

    def opening(self) -> bytes:
        return b""

    def chunk(self, delta: Delta) -> bytes:
        self.saw(delta)
        if self.kind == "generate":
            return _line(self._piece(delta.text, [])) if delta.text else b""
        text, pieces = read_step(self.tools, delta)
        for piece in pieces:
            self._add(piece)
        return _line(self._piece(text, [])) if text else b""

    def closing(self, done: Finished) -> bytes:
        out = b""
        if self._calls:
            calls = [_call(name, "".join(parts)) for name, *parts in self._calls.values()]
            out = _line(self._piece("", calls))
        return out + _line(self._ended(self._piece("", []), done))

    def failure(self, error: GenerationError) -> bytes:
        """A failure after the stream began: Ollama's error line, which its clients raise."""
        return encode_error(named(error)) + b"\n"

    def _add(self, piece: ToolCallDelta) -> None:
        function = None if isinstance(piece.function, UnsetType) else piece.function
        parts = self._calls.setdefault(piece.index, [""])
        if function is None:
            return
        if isinstance(function.name, str) and function.name:
            parts[0] = function.name
        if isinstance(function.arguments, str):
            parts.append(function.arguments)

    def _piece(self, text: str, calls: list[OllamaAnswerCall]) -> OllamaChunk:
        chunk = OllamaChunk(model=self.model, created_at=now(), done=False)
        if self.kind == "chat":
            chunk.message = OllamaAnswerMessage("assistant", text, calls or UNSET)
        else:
            chunk.response = text
        return chunk

    def _ended(self, chunk: OllamaChunk, done: Finished) -> OllamaChunk:
        [sequence] = done.sequences
        end = self._clock()
        engine_start = max(self._arrived, end - done.execution_time)
        first = self._first if self._first is not None else end
        first = min(max(first, engine_start), end)
        chunk.done = True
        chunk.done_reason = "length" if sequence.finish_reason == "length" else "stop"
        chunk.total_duration = _ns(end - self._arrived)
        chunk.load_duration = _ns(engine_start - self._arrived)
        chunk.prompt_eval_count = done.prompt_tokens
        chunk.prompt_eval_duration = _ns(first - engine_start)
        chunk.eval_count = sequence.generated_tokens
        chunk.eval_duration = _ns(end - first)
        if self.kind == "generate":
            chunk.context = done.history.token_ids.tolist()
        return chunk


def _ns(seconds: float) -> int:
    return max(0, round(seconds * _NS))


def _call(name: str, arguments: str) -> OllamaAnswerCall:
    """A call with its arguments an object (arguments that are not one: an empty object)."""
    try:
        decoded = msgspec.json.decode(arguments or "{}")
    except msgspec.DecodeError:
        decoded = {}
    return OllamaAnswerCall(
        OllamaAnswerFunction(name, decoded if isinstance(decoded, dict) else {})
    )
