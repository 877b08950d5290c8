"""Cohere's chat with the `cohere` SDK (`ClientV2`), unchanged, on the session's engine: `chat`
and `chat_stream` with text, a tool call the model must make (`tool_choice="REQUIRED"`), a
two-turn loop with the tool's result, and its exception classes for a bad field, an over-long
prompt, an unknown model and a wrong key. Every answer and event is also validated against the
SDK's own types in strict mode."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import cohere
import msgspec
import pydantic
import pytest
from cohere.v2.types import V2ChatResponse, V2ChatStreamResponse

from clients import web
from serving import RunningServer

MODEL = "SmolLM2-135M-Instruct"  # the served model's name: Cohere's API requires `model`
EVENTS = pydantic.TypeAdapter(V2ChatStreamResponse)
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
        },
    },
}
QUESTION: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
HELLO: Any = [{"role": "user", "content": "Say hello."}]


def client(server: RunningServer, key: str = "unused") -> cohere.ClientV2:
    return cohere.ClientV2(key, base_url=server.http, max_retries=0, timeout=120)


def _raw_events(server: RunningServer, body: dict[str, Any]) -> list[Any]:
    """The stream's events, each validated by the SDK's union in strict mode; `[DONE]` last."""
    response = web.post(server.http + "/v2/chat", json={**body, "stream": True})
    assert response.status_code == 200
    frames = [f for f in response.text.split("\n\n") if f.strip()]
    assert frames[-1] == "data: [DONE]"
    events = []
    for frame in frames[:-1]:
        name, data = frame.split("\n")
        event = EVENTS.validate_python(json.loads(data.removeprefix("data: ")), strict=True)
        assert name == f"event: {event.type}"
        events.append(event)
    return events


def test_chat_answers_text_with_usage(server: RunningServer) -> None:
    answer = client(server).chat(model=MODEL, messages=HELLO, max_tokens=12, temperature=0)
    assert answer.finish_reason in ("COMPLETE", "MAX_TOKENS")
    assert answer.message.role == "assistant" and answer.message.content
    [block] = answer.message.content
    assert block.type == "text" and block.text
    assert answer.usage is not None and answer.usage.tokens is not None
    assert answer.usage.tokens.input_tokens and 0 < (answer.usage.tokens.output_tokens or 0) <= 12
    raw = web.post(
        server.http + "/v2/chat",
        json={"model": MODEL, "messages": HELLO, "max_tokens": 12, "temperature": 0},
    )
    whole = V2ChatResponse.model_validate(msgspec.json.decode(raw.content), strict=True)
    assert whole.message.content == answer.message.content


def test_chat_stream_delivers_the_whole_answers_text(server: RunningServer) -> None:
    body: Any = {"model": MODEL, "messages": HELLO, "max_tokens": 12, "temperature": 0}
    whole = client(server).chat(**body)
    events: list[Any] = list(client(server).chat_stream(**body))
    assert [e.type for e in events[:2]] == ["message-start", "content-start"]
    assert [e.type for e in events[-2:]] == ["content-end", "message-end"]
    text = "".join(e.delta.message.content.text for e in events if e.type == "content-delta")
    assert whole.message.content is not None
    assert text == whole.message.content[0].text  # type: ignore[union-attr]
    end = events[-1].delta
    assert end.finish_reason == whole.finish_reason and end.usage.tokens.output_tokens > 0
    raw = _raw_events(server, body)
    assert [e.type for e in raw] == [e.type for e in events]


@pytest.mark.long  # Cohere's tool calls in make test: the two-turn loop
def test_a_required_tool_call_whole_and_streamed(server: RunningServer) -> None:
    body: Any = {
        "model": MODEL,
        "messages": QUESTION,
        "tools": [WEATHER],
        "tool_choice": "REQUIRED",
        "max_tokens": 60,
    }
    # Cohere's API has no switch for parallel calls: the model may make several (at most
    # MAX_PARALLEL_CALLS), each a whole call of a declared tool.
    answer = client(server).chat(**body)
    assert answer.finish_reason == "TOOL_CALL"
    calls = answer.message.tool_calls or []
    assert calls
    for call in calls:
        assert call.function is not None and call.function.name == "get_weather"
        assert isinstance(json.loads(call.function.arguments or "")["city"], str)
    events: list[Any] = list(client(server).chat_stream(**body))
    starts = [e for e in events if e.type == "tool-call-start"]
    assert starts
    assert {s.delta.message.tool_calls.function.name for s in starts} == {"get_weather"}
    arguments: dict[int, str] = {}
    for e in events:
        if e.type == "tool-call-delta":
            piece = e.delta.message.tool_calls.function.arguments
            arguments[e.index] = arguments.get(e.index, "") + piece
    assert sorted(arguments) == sorted(s.index for s in starts)
    for streamed in arguments.values():
        assert isinstance(json.loads(streamed)["city"], str)
    assert [e.type for e in events[-2:]] == ["tool-call-end", "message-end"]
    assert events[-1].delta.finish_reason == "TOOL_CALL"
    raw = _raw_events(server, body)
    assert "tool-call-start" in [e.type for e in raw]


def test_a_two_turn_tool_loop(server: RunningServer) -> None:
    sdk = client(server)
    first = sdk.chat(
        model=MODEL, messages=QUESTION, tools=[WEATHER], tool_choice="REQUIRED", max_tokens=60
    )
    calls = first.message.tool_calls or []
    assert calls
    messages: Any = [
        *QUESTION,
        {"role": "assistant", "tool_calls": calls, "tool_plan": first.message.tool_plan},
        *(
            {
                "role": "tool",
                "tool_call_id": call.id,
                "content": [{"type": "document", "document": {"data": {"weather": "Sunny, 24 C"}}}],
            }
            for call in calls
        ),
    ]
    second = sdk.chat(
        model=MODEL,
        messages=messages,
        tools=[WEATHER],
        tool_choice="NONE",
        max_tokens=24,
    )
    assert second.message.tool_calls is None and second.message.content
    assert second.message.content[0].type == "text"
    assert second.finish_reason in ("COMPLETE", "MAX_TOKENS")


@pytest.mark.parametrize(
    ("change", "error", "field"),
    [
        ({"p": 1.5}, cohere.BadRequestError, "p"),
        ({"messages": [{"role": "user", "content": "word " * 5000}]}, cohere.BadRequestError, ""),
        ({"model": "command-r"}, cohere.NotFoundError, "command-r"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
            cohere.BadRequestError,
            "messages[0].content[0].type",
        ),
    ],
)
def test_bad_requests_raise_the_sdks_errors(
    server: RunningServer, change: dict[str, Any], error: type[Exception], field: str
) -> None:
    body: dict[str, Any] = {"model": MODEL, "messages": HELLO, "max_tokens": 4, **change}
    with pytest.raises(error) as raised:
        client(server).chat(**body)
    assert field in str(raised.value)
    with pytest.raises(error):
        list(client(server).chat_stream(**body))
    answer = web.post(server.http + "/v2/chat", json=body)
    parsed = msgspec.json.decode(answer.content)
    assert set(parsed) == {"id", "message"} and field in parsed["message"]


def test_a_wrong_key_raises_unauthorized(make_server: Callable[..., RunningServer]) -> None:
    keyed = make_server(API_KEYS="right-key")
    with pytest.raises(cohere.UnauthorizedError):
        client(keyed, "wrong-key").chat(model=MODEL, messages=HELLO, max_tokens=4)
    answer = client(keyed, "right-key").chat(model=MODEL, messages=HELLO, max_tokens=4)
    assert answer.usage is not None and answer.usage.tokens is not None
    assert (answer.usage.tokens.output_tokens or 0) > 0
