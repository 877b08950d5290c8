"""Anthropic's Messages API codecs (protocols/anthropic_*.py), without an engine: every request
form decoded, every refusal naming its field in Anthropic's error shape, and every answer and
event validated by the anthropic SDK's own types in strict mode."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anthropic.types as at
import msgspec
import pydantic
import pytest

from protocols.anthropic_answers import AnthropicEncoder, encode_token_count, error_of
from protocols.anthropic_requests import decode_count_tokens, decode_messages
from protocols.errors import ErrorKind, GenerationError
from protocols.events import Delta, Finished, GeneratedSequence, History, token_array

EVENTS = pydantic.TypeAdapter(at.RawMessageStreamEvent)


def _body(**fields: Any) -> bytes:
    base: dict[str, Any] = {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
    }
    return msgspec.json.encode({**base, **fields})


def _refused(raw: bytes) -> GenerationError:
    with pytest.raises(GenerationError) as caught:
        decode_messages(raw)
    return caught.value


def test_system_messages_among_the_messages_fold_into_the_system_prompt_in_order() -> None:
    """What Claude Code sends: `system` messages inside `messages` (and to count_tokens)."""
    messages = [
        {"role": "system", "content": "You are Claude Code."},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "Be terse.", "cache_control": {}}]},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "bye"},
    ]
    call = decode_messages(_body(system="Top.", messages=messages))
    assert call.requests[0].messages == (
        {"role": "system", "content": "Top.\n\nYou are Claude Code.\n\nBe terse."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "bye"},
    )
    counted = decode_count_tokens(_body(messages=messages))
    assert counted.messages[0] == {
        "role": "system",
        "content": "You are Claude Code.\n\nBe terse.",
    }
    only_system = [{"role": "system", "content": "x"}]
    assert _refused(_body(messages=only_system)).field == "messages"
    tool_in_system = [
        {"role": "system", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": "hi"},
    ]
    assert _refused(_body(messages=tool_in_system)).field == "messages[0].content[0].type"


def test_a_conversation_with_tools_becomes_the_chat_templates_messages() -> None:
    call = decode_messages(
        _body(
            system=[{"type": "text", "text": "Be brief."}],
            messages=[
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "...", "signature": "s"},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "t1", "name": "weather", "input": {"c": "P"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"},
                        {"type": "text", "text": "And tomorrow?"},
                    ],
                },
            ],
            tools=[{"name": "weather", "input_schema": {"type": "object"}}],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            stop_sequences=["END"],
            temperature=0,
            stream=True,
        )
    )
    [request] = call.requests
    assert request.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": {"c": "P"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "Sunny"},
        {"role": "user", "content": "And tomorrow?"},
    )
    assert call.tool_use is not None
    assert (call.tool_use.choice, call.tool_use.parallel) == ("required", False)
    assert request.options.stop == ("END",) and not request.options.do_sample
    assert call.stream and request.stream and call.model == "m"


def test_a_named_tool_choice_and_the_token_count_request() -> None:
    tools = [{"name": "a", "input_schema": {}}, {"name": "b", "input_schema": {}}]
    call = decode_messages(_body(tools=tools, tool_choice={"type": "tool", "name": "b"}))
    assert call.tool_use is not None and call.tool_use.function == "b"
    counted = decode_count_tokens(
        msgspec.json.encode(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "system": "s"}
        )
    )
    assert counted.messages == (
        {"role": "system", "content": "s"},
        {"role": "user", "content": "x"},
    )


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"temperature": 1.5}, "temperature"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0].type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_use", "id": "x", "name": "f", "input": {}}],
                    }
                ]
            },
            "messages[0].content[0].type",
        ),
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search", "input_schema": {}}]},
            "tools[0].type",
        ),
        ({"tools": [{"name": "f", "type": "bash_20250124"}]}, "tools[0].type"),  # no schema
        ({"tools": [{"name": "f", "description": "no schema"}]}, "tools[0].input_schema"),
        (
            {
                "tools": [{"name": "a", "input_schema": {}}],
                "tool_choice": {"type": "tool", "name": "z"},
            },
            "tool_choice.name",
        ),
        ({"tool_choice": {"type": "any"}}, "tool_choice.type"),
    ],
)
def test_bad_input_is_refused_naming_the_field(fields: dict[str, Any], field: str) -> None:
    base = msgspec.json.decode(_body())
    for name, value in fields.items():
        if value is None:
            base.pop(name)
        else:
            base[name] = value
    error = _refused(msgspec.json.encode(base))
    assert error.field is not None and error.field.removeprefix("$.") == field
    status, body = error_of(error)
    assert status == 400
    parsed = at.ErrorResponse.model_validate(msgspec.json.decode(body), strict=True)
    assert parsed.error.type == "invalid_request_error" and field in parsed.error.message


@pytest.mark.parametrize(
    ("kind", "status", "type_"),
    [
        (ErrorKind.UNAUTHORIZED, 401, "authentication_error"),
        (ErrorKind.RATE_LIMITED, 429, "rate_limit_error"),
        (ErrorKind.ENGINE_UNAVAILABLE, 529, "overloaded_error"),
        (ErrorKind.CONTEXT_LENGTH_EXCEEDED, 400, "invalid_request_error"),
    ],
)
def test_errors_have_anthropics_status_and_type(kind: ErrorKind, status: int, type_: str) -> None:
    got, body = error_of(GenerationError(kind, "no"))
    assert got == status
    assert (
        at.ErrorResponse.model_validate(msgspec.json.decode(body), strict=True).error.type == type_
    )


def _finished(text: str, reason: str, stop: str | None = None) -> Finished:
    sequence = GeneratedSequence(text, 3, reason, stop)
    return Finished(0, History(token_array([]), ""), [sequence], 10, 0.1, cached_tokens=4)


@pytest.mark.parametrize(
    ("reason", "stop", "expected"),
    [("stop", None, "end_turn"), ("length", None, "max_tokens"), ("stop", "END", "stop_sequence")],
)
def test_a_whole_message_validates_against_the_sdk(
    reason: str, stop: str | None, expected: str
) -> None:
    call = decode_messages(_body(stop_sequences=["END"]))
    body = AnthropicEncoder(call, "served").document(_finished("Hello", reason, stop))
    message = at.Message.model_validate(msgspec.json.decode(body), strict=True)
    assert message.stop_reason == expected
    assert message.stop_sequence == (stop if expected == "stop_sequence" else None)
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == "Hello"  # type: ignore[union-attr]
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (6, 4)
    assert message.usage.output_tokens == 3 and message.model == "m"


def _events(stream: bytes) -> list[Any]:
    events: list[Any] = []
    for frame in stream.decode().split("\n\n"):
        if not frame:
            continue
        name_line, data_line = frame.split("\n")
        name, data = (
            name_line.removeprefix("event: "),
            msgspec.json.decode(data_line.removeprefix("data: ")),
        )
        assert data["type"] == name
        if name == "ping":  # the SDK reads past it: not one of its event types
            assert data == {"type": "ping"}
            events.append(SimpleNamespace(type="ping"))
            continue
        events.append(EVENTS.validate_python(data, strict=True))
    return events


def test_a_stream_is_anthropics_event_sequence() -> None:
    call = decode_messages(_body(stream=True))
    encoder = AnthropicEncoder(call, "served")
    stream = encoder.opening()
    stream += encoder.chunk(Delta(0, "Hel", [1]))
    stream += encoder.chunk(Delta(0, "", [2]))
    stream += encoder.chunk(Delta(0, "lo", [3], finish_reason="stop"))
    stream += encoder.closing(_finished("Hello", "stop"))
    events = _events(stream)
    assert [e.type for e in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == "Hello"
    assert events[-2].delta.stop_reason == "end_turn" and events[-2].usage.output_tokens == 3
    name, data = encoder.failure(GenerationError(ErrorKind.ENGINE_ERROR, "boom")).split(b"\n")[:2]
    assert name == b"event: error"
    error = at.ErrorResponse.model_validate_json(data.removeprefix(b"data: "), strict=True)
    assert (error.error.type, error.error.message) == ("api_error", "boom")


def test_a_token_count() -> None:
    assert (
        at.MessageTokensCount.model_validate(
            msgspec.json.decode(encode_token_count(7)), strict=True
        ).input_tokens
        == 7
    )


def test_structured_outputs_are_a_constraint_naming_their_field() -> None:
    """`output_config.format` (and the beta's `output_format`, not both) held as every
    route's JSON schemas are."""
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
        "output_format": {"type": "json_schema", "schema": {"type": "object"}},
    }
    with pytest.raises(GenerationError) as both:
        decode_messages(msgspec.json.encode(body))
    assert both.value.field == "output_format.schema"
    del body["output_format"]
    call = decode_messages(msgspec.json.encode(body))
    assert call.requests[0].options.json_schema == '{"type":"object"}'
    assert call.requests[0].constraint_field == "output_config.format.schema"
