"""Anthropic's Messages API with the `anthropic` SDK, unchanged, on the session's engine:
`messages.create`, `messages.stream` (text and a tool call), a two-turn tool-use loop,
`count_tokens`, and its exception classes for an over-long prompt, an unknown model, a block
this server does not read and a wrong key. Every answer and event is also validated against
the SDK's own types in strict mode."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

import anthropic
import anthropic.types as at
import msgspec
import pydantic
import pytest

from clients import web
from serving import RunningServer

WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    },
}
QUESTION: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
EVENTS = pydantic.TypeAdapter(at.RawMessageStreamEvent)
MODEL = "SmolLM2-135M-Instruct"  # the served model's name: Anthropic's API requires `model`


def client(server: RunningServer, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.http, api_key=key, max_retries=0)


def test_create_answers_a_message_with_usage(server: RunningServer) -> None:
    message = client(server).messages.create(
        model=MODEL,
        max_tokens=12,
        system="You are terse.",
        messages=[{"role": "user", "content": "Say hello."}],
        extra_body={"temperature": 0},  # this SDK release no longer has the argument
    )
    assert message.role == "assistant" and message.type == "message"
    [block] = message.content
    assert block.type == "text" and block.text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert 0 < message.usage.output_tokens <= 12
    counted = client(server).messages.count_tokens(
        model=MODEL, system="You are terse.", messages=[{"role": "user", "content": "Say hello."}]
    )
    prompt = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    assert counted.input_tokens == prompt


def test_a_stop_sequence_is_named(server: RunningServer) -> None:
    message = client(server).messages.create(
        model=MODEL,
        max_tokens=64,
        messages=[{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
        stop_sequences=["5"],
        extra_body={"temperature": 0},
    )
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "5")
    assert "5" not in message.content[0].text  # type: ignore[union-attr]


def test_stream_delivers_the_same_text_as_its_final_message(server: RunningServer) -> None:
    with client(server).messages.stream(
        model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "Say hello."}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens > 0
    assert final.usage.input_tokens > 0


def _raw_events(server: RunningServer, body: dict[str, Any]) -> list[Any]:
    """The stream's events, each validated by the SDK's types in strict mode."""
    response = web.post(server.http + "/v1/messages", json={**body, "stream": True})
    assert response.status_code == 200
    events = []
    for frame in response.text.split("\n\n"):
        if not frame.strip():
            continue
        name, data = (line.split(": ", 1)[1] for line in frame.split("\n"))
        if name == "ping":
            continue
        event = EVENTS.validate_python(json.loads(data), strict=True)
        assert event.type == name
        events.append(event)
    return events


def test_a_forced_tool_call_streams_its_input_as_json_deltas(server: RunningServer) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 60,
        "messages": QUESTION,
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
    }
    events = _raw_events(server, body)
    starts = [e for e in events if e.type == "content_block_start"]
    assert [s.content_block.type for s in starts] == ["tool_use"]
    assert starts[0].content_block.name == "get_weather"
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta")
    assert isinstance(json.loads(partial)["city"], str)
    assert events[-2].type == "message_delta" and events[-2].delta.stop_reason == "tool_use"
    assert events[-1].type == "message_stop"
    with client(server).messages.stream(**body) as stream:
        final = stream.get_final_message()
    [call] = [b for b in final.content if b.type == "tool_use"]
    assert call.name == "get_weather" and isinstance(call.input["city"], str)


def test_a_two_turn_tool_use_loop(server: RunningServer) -> None:
    sdk = client(server)
    first = sdk.messages.create(
        model=MODEL,
        max_tokens=60,
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice={"type": "any"},
    )
    assert first.stop_reason == "tool_use"
    # `any` allows parallel calls (no `disable_parallel_tool_use`): each is answered.
    calls = [b for b in first.content if b.type == "tool_use"]
    assert calls and all(call.name == "get_weather" for call in calls)
    at.Message.model_validate(first.model_dump(), strict=True)
    second = sdk.messages.create(
        model=MODEL,
        max_tokens=24,
        messages=[
            *QUESTION,
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 C"}
                    for call in calls
                ],
            },
        ],
        tools=[WEATHER],
        tool_choice={"type": "none"},
    )
    assert second.content and second.content[0].type == "text"
    assert second.stop_reason in ("end_turn", "max_tokens")


@pytest.mark.parametrize(
    ("change", "error", "field"),
    [
        (
            {"messages": [{"role": "user", "content": "word " * 5000}]},
            anthropic.BadRequestError,
            "prompt is too long",
        ),
        ({"model": "claude-nope"}, anthropic.NotFoundError, "claude-nope"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "url", "url": "http://example.invalid/a.png"},
                            }
                        ],
                    }
                ]
            },
            anthropic.BadRequestError,
            "messages[0].content[0].type",
        ),
        ({"temperature": 3.0}, anthropic.BadRequestError, "temperature"),
    ],
)
def test_bad_requests_raise_the_sdks_exceptions(
    server: RunningServer, change: dict[str, Any], error: type[Exception], field: str
) -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 4, "messages": QUESTION, **change}
    extra = {"temperature": body.pop("temperature")} if "temperature" in body else None
    with pytest.raises(error) as raised:
        client(server).messages.create(**body, extra_body=extra)
    body.update(extra or {})
    assert field in str(raised.value)
    answer = web.post(server.http + "/v1/messages", json=body)
    parsed = at.ErrorResponse.model_validate(msgspec.json.decode(answer.content), strict=True)
    assert parsed.type == "error" and field in parsed.error.message


def test_a_wrong_key_raises_authentication_error(
    make_server: Callable[..., RunningServer],
) -> None:
    keyed = make_server(API_KEYS="right-key")
    with pytest.raises(anthropic.AuthenticationError):
        client(keyed, "wrong-key").messages.create(model=MODEL, max_tokens=4, messages=QUESTION)
    message = client(keyed, "right-key").messages.create(
        model=MODEL, max_tokens=4, messages=QUESTION
    )
    assert message.usage.output_tokens > 0


def test_models_list_and_retrieve_in_the_sdks_types(server: RunningServer) -> None:
    """`/v1/models` in one shape both families' SDKs validate: Anthropic's `ModelInfo` and
    its page (`has_more`, `first_id`, `last_id`) here, OpenAI's in tests/test_sdk_strict.py."""
    page = client(server).models.list()
    assert [m.id for m in page.data][:1] == [MODEL] and not page.has_more
    assert page.first_id == MODEL and page.last_id == page.data[-1].id
    raw = web.get(server.http + "/v1/models", headers={"anthropic-version": "2023-06-01"})
    for entry in raw.json()["data"]:
        info = at.ModelInfo.model_validate_json(json.dumps(entry), strict=True)
        assert info.type == "model" and info.display_name and info.lifecycle == "active"
    one = client(server).models.retrieve(MODEL)
    assert one.id == MODEL and one.max_input_tokens is not None and one.max_input_tokens > 0


class City(pydantic.BaseModel):
    name: str
    country: Literal["France", "Italy", "Spain"]


CITY_QUESTION = "Name one city in France, as JSON."


def test_structured_outputs_parse_into_the_callers_type(server: RunningServer) -> None:
    """`messages.parse(output_format=...)`: the SDK sends `output_config.format`, the engine
    holds the text to the schema, and the SDK parses it."""
    parsed = client(server).messages.parse(
        model=MODEL,
        max_tokens=200,
        messages=[{"role": "user", "content": CITY_QUESTION}],
        output_format=City,
        extra_body={"temperature": 0},
    )
    assert isinstance(parsed.parsed_output, City), parsed.content
    assert parsed.stop_reason == "end_turn"
    whole = client(server).messages.create(
        model=MODEL,
        max_tokens=200,
        messages=[{"role": "user", "content": CITY_QUESTION}],
        output_config={"format": {"type": "json_schema", "schema": City.model_json_schema()}},
        extra_body={"temperature": 0},
    )
    [block] = whole.content
    assert block.type == "text"
    assert City.model_validate_json(block.text) == parsed.parsed_output


def test_langchain_anthropics_json_schema_structured_output(server: RunningServer) -> None:
    from langchain_anthropic import ChatAnthropic
    from pydantic import SecretStr

    chat = ChatAnthropic(  # type: ignore[call-arg]
        model=MODEL,
        base_url=server.http,
        api_key=SecretStr("unused"),
        max_tokens=200,
        temperature=0,
    )
    city = chat.with_structured_output(City, method="json_schema").invoke(CITY_QUESTION)
    assert isinstance(city, City) and city.name
