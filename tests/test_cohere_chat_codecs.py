"""Cohere's chat codecs (protocols/cohere_chat*.py), without an engine: every message form
decoded to the chat template's, every refusal naming its field in Cohere's error shape, and
every answer and event validated by the cohere SDK's own types in strict mode."""

from __future__ import annotations

from typing import Any

import msgspec
import pydantic
import pytest
from cohere.v2.types import V2ChatResponse, V2ChatStreamResponse

from protocols.cohere import error_of
from protocols.cohere_chat import decode_chat
from protocols.cohere_chat_answers import CohereChatEncoder
from protocols.errors import ErrorKind, GenerationError
from protocols.events import Delta, Finished, GeneratedSequence, History, token_array
from protocols.tool_calls import (
    CalledFunction,
    FunctionDelta,
    ParsedDelta,
    ParsedMessage,
    ToolCall,
    ToolCallDelta,
)

EVENTS = pydantic.TypeAdapter(V2ChatStreamResponse)
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _body(**fields: Any) -> bytes:
    base: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return msgspec.json.encode({**base, **fields})


def test_a_conversation_with_tools_becomes_the_chat_templates_messages() -> None:
    call = decode_chat(
        _body(
            messages=[
                {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "tool_plan": "I will look it up.",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {
                    "role": "tool",
                    "tool_call_id": "c1",
                    "content": [
                        {"type": "text", "text": "Sunny"},
                        {"type": "document", "document": {"data": {"temp": 24}, "id": "d"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "..."},
                        {"type": "text", "text": "Sunny, 24."},
                    ],
                },
            ],
            tools=[WEATHER],
            tool_choice="REQUIRED",
            strict_tools=True,
            safety_mode="OFF",
            stop_sequences=["END"],
            temperature=0,
            p=0.5,
            k=5,
            seed=7,
            frequency_penalty=0.5,
            presence_penalty=0.25,
            max_tokens=12,
            priority=3,
            stream=True,
        ),
        100,
    )
    [request] = call.requests
    assert request.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "I will look it up.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "content": 'Sunny\n{"temp":24}', "tool_call_id": "c1"},
        {"role": "assistant", "content": "Sunny, 24."},
    )
    assert call.tool_use is not None and call.tool_use.choice == "required"
    assert request.tools is not None and request.tools[0]["function"]["name"] == "weather"
    options = request.options
    assert (options.stop, options.do_sample, options.top_p, options.top_k) == (
        ("END",),
        False,
        0.5,
        5,
    )
    assert (options.seed, options.frequency_penalty, options.presence_penalty) == (7, 0.5, 0.25)
    assert options.max_new_tokens == 12 and request.priority == 3
    assert call.stream and request.stream and call.model == "m"


def test_defaults_are_cohere_s_and_a_json_object_is_held_to_its_schema() -> None:
    [request] = decode_chat(_body(), 100).requests
    options = request.options
    assert (options.temperature, options.top_p, options.top_k) == (0.3, 0.75, -1)
    assert options.max_new_tokens == 100 and options.json_schema is None
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_object", "json_schema": schema}
    [held] = decode_chat(_body(response_format=fmt), 100).requests
    assert held.options.json_schema is not None
    assert msgspec.json.decode(held.options.json_schema) == schema
    assert held.constraint_field == "response_format.json_schema"
    [free] = decode_chat(_body(response_format={"type": "json_object"}), 100).requests
    assert free.options.json_schema == '{"type": "object"}'
    none = decode_chat(_body(tools=[WEATHER], tool_choice="NONE"), 100)
    auto = decode_chat(_body(tools=[WEATHER]), 100)
    assert none.tool_use is not None and none.tool_use.choice == "none"
    assert auto.tool_use is not None and auto.tool_use.choice == "auto"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"model": None}, "model"),
        ({"messages": []}, "messages"),
        ({"p": 1.0}, "p"),
        ({"k": 501}, "k"),
        ({"frequency_penalty": 1.5}, "frequency_penalty"),
        ({"stop_sequences": ["a"] * 6}, "stop_sequences"),
        ({"tool_choice": "AUTO"}, "tool_choice"),
        ({"tool_choice": "REQUIRED"}, "tool_choice"),
        ({"documents": ["Paris is sunny."]}, "documents"),
        ({"logprobs": True}, "logprobs"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "x"}}],
                    }
                ]
            },
            "messages[0].content[0].type",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "assistant"}]}, "messages[0]"),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "c"}]}]},
            "messages[0].tool_calls",
        ),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ],
)
def test_bad_input_is_refused_naming_the_field(fields: dict[str, Any], field: str) -> None:
    base = msgspec.json.decode(_body())
    for name, value in fields.items():
        if value is None:
            base.pop(name)
        else:
            base[name] = value
    with pytest.raises(GenerationError) as caught:
        decode_chat(msgspec.json.encode(base), 100)
    error = caught.value
    assert error.field is not None and error.field.removeprefix("$.") == field
    status, body = error_of(error)
    assert status == 400
    parsed = msgspec.json.decode(body)
    assert set(parsed) == {"id", "message"} and field in parsed["message"]


def _finished(text: str, reason: str, stop: str | None = None) -> Finished:
    sequence = GeneratedSequence(text, 3, reason, stop)
    return Finished(0, History(token_array([]), ""), [sequence], 10, 0.1, cached_tokens=4)


@pytest.mark.parametrize(
    ("reason", "stop", "expected"),
    [("stop", None, "COMPLETE"), ("length", None, "MAX_TOKENS"), ("stop", "END", "STOP_SEQUENCE")],
)
def test_a_whole_answer_validates_against_the_sdk(
    reason: str, stop: str | None, expected: str
) -> None:
    call = decode_chat(_body(stop_sequences=["END"]), 100)
    body = CohereChatEncoder(call).document(_finished("Hello", reason, stop))
    answer = V2ChatResponse.model_validate(msgspec.json.decode(body), strict=True)
    assert answer.finish_reason == expected
    assert answer.message.role == "assistant" and answer.message.tool_calls is None
    assert answer.message.content is not None
    assert [(c.type, c.text) for c in answer.message.content] == [("text", "Hello")]  # type: ignore[union-attr]
    assert answer.usage is not None and answer.usage.tokens is not None
    assert answer.usage.billed_units is not None
    assert (answer.usage.tokens.input_tokens, answer.usage.tokens.output_tokens) == (10, 3)
    assert answer.usage.billed_units.output_tokens == 3 and answer.usage.cached_tokens == 4


class _Calls:
    """A ToolAnswers that reads `Checking.` then a call of `weather`, as a parser would."""

    def message(self, index: int, text: str, finish_reason: str) -> ParsedMessage:
        call = ToolCall(id="c1", function=CalledFunction("weather", '{"city": "Paris"}'))
        return ParsedMessage("Checking.", [call], "tool_calls")

    def delta(
        self, index: int, text: str, token_ids: list[int], finish_reason: str | None
    ) -> ParsedDelta:
        match text:
            case "Checking.":
                return ParsedDelta(content=text)
            case "<call>":
                named = FunctionDelta(name="weather")
                return ParsedDelta(tool_calls=[ToolCallDelta(0, "c1", "function", named)])
            case _:
                piece = ToolCallDelta(0, function=FunctionDelta(arguments=text))
                return ParsedDelta(tool_calls=[piece], finish_reason=finish_reason)


def test_a_whole_answer_with_a_call_has_its_plan() -> None:
    call = decode_chat(_body(tools=[WEATHER]), 100)
    body = CohereChatEncoder(call, _Calls()).document(_finished("...", "stop"))
    answer = V2ChatResponse.model_validate(msgspec.json.decode(body), strict=True)
    assert answer.finish_reason == "TOOL_CALL" and answer.message.content is None
    assert answer.message.tool_plan == "Checking."
    [made] = answer.message.tool_calls or []
    assert made.id == "c1" and made.type == "function" and made.function is not None
    assert (made.function.name, made.function.arguments) == ("weather", '{"city": "Paris"}')


def _events(stream: bytes) -> list[Any]:
    """Each frame's event, validated by the SDK's union in strict mode; `[DONE]` last."""
    frames = [f for f in stream.decode().split("\n\n") if f]
    assert frames[-1] == "data: [DONE]"
    events = []
    for frame in frames[:-1]:
        name, data = frame.split("\n")
        event = EVENTS.validate_python(
            msgspec.json.decode(data.removeprefix("data: ")), strict=True
        )
        assert name == f"event: {event.type}"
        events.append(event)
    return events


def test_a_stream_is_cohere_s_event_sequence() -> None:
    call = decode_chat(_body(stream=True), 100)
    encoder = CohereChatEncoder(call)
    stream = encoder.opening()
    stream += encoder.chunk(Delta(0, "Hel", [1]))
    stream += encoder.chunk(Delta(0, "", [2]))
    stream += encoder.chunk(Delta(0, "lo", [3], finish_reason="stop"))
    stream += encoder.closing(_finished("Hello", "stop"))
    events = _events(stream)
    assert [e.type for e in events] == [
        "message-start",
        "content-start",
        "content-delta",
        "content-delta",
        "content-end",
        "message-end",
    ]
    assert events[0].id == events[-1].id == encoder.id
    assert events[0].delta.message.role == "assistant"
    assert events[1].delta.message.content.type == "text"
    assert "".join(e.delta.message.content.text for e in events[2:4]) == "Hello"
    end = events[-1].delta
    assert end.finish_reason == "COMPLETE" and end.usage.tokens.output_tokens == 3


def test_a_streamed_call_and_a_failure() -> None:
    call = decode_chat(_body(stream=True, tools=[WEATHER]), 100)
    encoder = CohereChatEncoder(call, _Calls())
    stream = encoder.opening()
    for text in ("Checking.", "<call>", '{"city": ', '"Paris"}'):
        stream += encoder.chunk(Delta(0, text, [1]))
    stream += encoder.closing(_finished("", "stop"))
    events = _events(stream)
    assert [e.type for e in events] == [
        "message-start",
        "content-start",
        "content-delta",
        "content-end",
        "tool-call-start",
        "tool-call-delta",
        "tool-call-delta",
        "tool-call-end",
        "message-end",
    ]
    started = events[4].delta.message.tool_calls
    assert (events[4].index, started.id, started.function.name) == (0, "c1", "weather")
    arguments = "".join(e.delta.message.tool_calls.function.arguments for e in events[5:7])
    assert msgspec.json.decode(arguments) == {"city": "Paris"}
    assert events[-1].delta.finish_reason == "TOOL_CALL"
    failing = CohereChatEncoder(call)
    failed = failing.opening() + failing.chunk(Delta(0, "Hi", [1]))
    failed += failing.failure(GenerationError(ErrorKind.ENGINE_ERROR, "boom"))
    ended = _events(failed)
    assert [e.type for e in ended][-2:] == ["content-end", "message-end"]
    assert (ended[-1].delta.finish_reason, ended[-1].delta.error) == ("ERROR", "boom")
