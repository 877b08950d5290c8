"""OpenAI's Responses API answers (no I/O): the response object, its output items (an assistant
message of `output_text`, `function_call` items), the typed server-sent events of a stream
(`response.created` ... `response.completed`, each with its `sequence_number`), the
`input_items` list, and the 404 of an unknown id.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from protocols.errors import ErrorKind, GenerationError
from protocols.events import Finished
from protocols.openai_answers import ErrorBody, ErrorDetail
from protocols.sse import sse_event
from protocols.tool_calls import ToolAnswers, history_fields

_ENCODER = msgspec.json.Encoder()
Status = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
SHUTDOWN = "server_shutdown"  # incomplete_details.reason of a background response a drain ended


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class InputTokensDetails(msgspec.Struct):
    cached_tokens: int  # read from vLLM's prefix cache
    cache_write_tokens: int = 0  # the openai SDK requires it; a prefix cache bills no writes


class OutputTokensDetails(msgspec.Struct):
    reasoning_tokens: int = 0


class ResponseUsage(msgspec.Struct):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


def usage_of(done: Finished) -> ResponseUsage:
    output = sum(s.generated_tokens for s in done.sequences)
    return ResponseUsage(
        done.prompt_tokens,
        InputTokensDetails(done.cached_tokens),
        output,
        OutputTokensDetails(),
        done.prompt_tokens + output,
    )


ErrorCode = Literal["server_error", "rate_limit_exceeded", "invalid_prompt"]


class ResponseError(msgspec.Struct):
    code: ErrorCode
    message: str


class IncompleteDetails(msgspec.Struct):
    reason: str


class ResponseObject(msgspec.Struct, kw_only=True):
    """The response as `POST` answers it, `GET` returns it and the stream's events carry it;
    `echo` (protocols/responses_requests.py) fills the request's own fields."""

    id: str
    object: str = "response"
    created_at: int
    status: Status
    model: str
    output: list[dict[str, Any]]
    usage: ResponseUsage | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] = {}
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    store: bool = True
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] = {}
    tool_choice: Any = "none"
    tools: list[Any] = []
    truncation: str = "disabled"
    background: bool = False
    user: str | None = None


def opened(response_id: str, model: str, echo: dict[str, Any]) -> ResponseObject:
    """The response before any output: in progress."""
    return ResponseObject(
        id=response_id,
        created_at=int(time.time()),
        status="in_progress",
        model=model,
        output=[],
        **echo,
    )


def message_item(item_id: str, text: str, status: Status) -> dict[str, Any]:
    content = [text_part(text)] if status != "in_progress" else []
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class Outcome(msgspec.Struct, frozen=True):
    """What one response said: its output items, and the same as the assistant message a chat
    template receives in the next turn's conversation."""

    output: list[dict[str, Any]]
    message: dict[str, Any]
    status: Status
    incomplete: IncompleteDetails | None


def outcome_of(
    done: Finished,
    message_id: str,
    tools: ToolAnswers | None,
    namespaces: Mapping[str, str] | None = None,
) -> Outcome:
    """The output of a Finished: its text (outside tool calls) as a message, and its calls
    (a `namespace` tool's function's naming its namespace)."""
    [sequence] = done.sequences[:1]
    text, reason = sequence.text, sequence.finish_reason
    status: Status = "incomplete" if reason == "length" else "completed"
    incomplete = IncompleteDetails("max_output_tokens") if reason == "length" else None
    calls: list[dict[str, Any]] = []
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tools is not None:
        parsed = tools.message(0, text, reason)
        text = parsed.content or ""
        # its calls as the chat template reads them (arguments as objects), as the chat
        # route's history and this API's `function_call` input items give them
        message = {
            "role": "assistant",
            "content": text,
            **history_fields("assistant", parsed.tool_calls, None, 0),
        }
        calls = [
            {
                "id": new_id("fc"),
                "type": "function_call",
                "call_id": c.id,
                "name": c.function.name,
                "arguments": c.function.arguments,
                "status": "completed",
                **namespace_of(c.function.name, namespaces),
            }
            for c in parsed.tool_calls
        ]
    output = [message_item(message_id, text, status)] if text or not calls else []
    return Outcome(output + calls, message, status, incomplete)


def namespace_of(name: str, namespaces: Mapping[str, str] | None) -> dict[str, str]:
    """A call's `namespace` field, where its function is a `namespace` tool's."""
    namespace = (namespaces or {}).get(name)
    return {"namespace": namespace} if namespace is not None else {}


def finished(response: ResponseObject, done: Finished, outcome: Outcome) -> ResponseObject:
    return msgspec.structs.replace(
        response,
        status=outcome.status,
        output=outcome.output,
        usage=usage_of(done),
        incomplete_details=outcome.incomplete,
    )


def failed(response: ResponseObject, error: GenerationError) -> ResponseObject:
    code = _ERROR_CODES.get(error.kind, "server_error")
    return msgspec.structs.replace(
        response, status="failed", error=ResponseError(code, error.message)
    )


# A failed response's `error.code`: one of the codes the openai SDK's `ResponseError` lists.
_ERROR_CODES: dict[ErrorKind, ErrorCode] = {
    ErrorKind.RATE_LIMITED: "rate_limit_exceeded",
    ErrorKind.INVALID_REQUEST: "invalid_prompt",
    ErrorKind.UNPROCESSABLE: "invalid_prompt",
    ErrorKind.CONTEXT_LENGTH_EXCEEDED: "invalid_prompt",
}


def cancelled(response: ResponseObject) -> ResponseObject:
    return msgspec.structs.replace(response, status="cancelled")


def interrupted(response: ResponseObject, reason: str) -> ResponseObject:
    """Ended before its end (the gateway shut down): incomplete, with the reason."""
    return msgspec.structs.replace(
        response, status="incomplete", incomplete_details=IncompleteDetails(reason)
    )


class StatusOf(msgspec.Struct):
    """What a stored response's JSON says of its state."""

    status: Status
    background: bool = False


_STATUS = msgspec.json.Decoder(StatusOf)


def status_of(document: bytes) -> StatusOf:
    return _STATUS.decode(document)


def document(response: ResponseObject) -> bytes:
    return _ENCODER.encode(response)


class ResponseEvent(msgspec.Struct):
    """What every event of a stream has (its other fields depend on its `type`); its SSE
    `event:` line names the type too."""

    type: str
    sequence_number: int


class InputTokenCount(msgspec.Struct, kw_only=True):
    """`POST /v1/responses/input_tokens`' answer."""

    input_tokens: int
    object: str = "response.input_tokens"


class DeletedResponse(msgspec.Struct):
    id: str
    object: str = "response.deleted"
    deleted: bool = True


class EventStream:
    """One response's server-sent events, numbered from 0 in the order they are made;
    `ended` once its terminal event is made."""

    def __init__(self) -> None:
        self.sequence_number = 0
        self.ended = False

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return sse_event(_ENCODER.encode(data), kind)

    def opening(self, response: ResponseObject) -> bytes:
        return self.event("response.created", response=response) + self.event(
            "response.in_progress", response=response
        )

    def queued(self, response: ResponseObject) -> bytes:
        """A background response's first events: made, and waiting for the engine."""
        return self.event("response.created", response=response) + self.event(
            "response.queued", response=response
        )

    def text_opening(self, item_id: str, output_index: int) -> bytes:
        item = message_item(item_id, "", "in_progress")
        added = self.event("response.output_item.added", output_index=output_index, item=item)
        return added + self.event(
            "response.content_part.added",
            item_id=item_id,
            output_index=output_index,
            content_index=0,
            part=text_part(""),
        )

    def text_delta(self, item_id: str, output_index: int, delta: str) -> bytes:
        return self.event(
            "response.output_text.delta",
            item_id=item_id,
            output_index=output_index,
            content_index=0,
            delta=delta,
            logprobs=[],
        )

    def item_done(self, output_index: int, item: dict[str, Any]) -> bytes:
        """A finished item: a message's text and part first, then the item."""
        events = b""
        if item["type"] == "message":
            part = item["content"][0]
            common = {"item_id": item["id"], "output_index": output_index, "content_index": 0}
            events += self.event(
                "response.output_text.done", **common, text=part["text"], logprobs=[]
            )
            events += self.event("response.content_part.done", **common, part=part)
        return events + self.event(
            "response.output_item.done", output_index=output_index, item=item
        )

    def completed(self, response: ResponseObject) -> bytes:
        """The terminal event of a response that ended: named after its status."""
        self.ended = True
        return self.event(_TERMINAL[response.status], response=response)

    def failed(self, response: ResponseObject) -> bytes:
        self.ended = True
        return self.event("response.failed", response=response)


_TERMINAL = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
    # The SDK's stream types have no event of its own: a response that ended before its end
    # without an error is incomplete (as one the gateway's shutdown cut), its status says why.
    "cancelled": "response.incomplete",
}


def terminal_event(response: ResponseObject, sequence_number: int) -> bytes:
    """The terminal event numbered `sequence_number`, made outside the response's stream."""
    events = EventStream()
    events.sequence_number = sequence_number
    return events.completed(response)


class InputItems(msgspec.Struct):
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool
    object: str = "list"


def input_items(items: list[dict[str, Any]], *, order: str, after: str | None, limit: int) -> bytes:
    """A page of a response's input items (OpenAI's default order: newest first)."""
    ordered = list(reversed(items)) if order == "desc" else list(items)
    if after is not None:
        ids = [item["id"] for item in ordered]
        ordered = ordered[ids.index(after) + 1 :] if after in ids else []
    page = ordered[:limit]
    first = page[0]["id"] if page else None
    last = page[-1]["id"] if page else None
    return _ENCODER.encode(InputItems(page, first, last, len(ordered) > limit))


def not_found(response_id: str, param: str | None = None) -> bytes:
    """OpenAI's 404 for an id it does not know (or that another key made); `param`
    `previous_response_id` when a request's continues it."""
    whose = "Previous response" if param == "previous_response_id" else "Response"
    message = f"{whose} with id '{response_id}' not found."
    return _ENCODER.encode(ErrorBody(ErrorDetail(message, "invalid_request_error", param, None)))


def deleted(response_id: str) -> bytes:
    return _ENCODER.encode(DeletedResponse(response_id))
