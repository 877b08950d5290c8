"""Every answer, event and error body of the OpenAI and Anthropic routes, read as sent and
validated by the SDKs' own pydantic types in strict mode (openai 3.57, anthropic 2.14): chat
completions and each chunk (logprobs, several choices, tool calls, usage), completions and
their chunks, models, Responses objects and every streamed Responses event (text, a function
call, a cut by `max_output_tokens`, a background response queued then cancelled), each event
read by the SDK's own union (its class must be the one its `type` names), and the error
bodies; the unknown paths of each family answer its JSON error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic.types as at
import pydantic
import pytest
from openai.types import Completion, ErrorObject, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import (
    Response,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseItem,
    ResponseStreamEvent,
)

from clients import web
from protocols.errors import ErrorKind, GenerationError
from protocols.responses_answers import EventStream, failed, opened
from protocols.responses_requests import decode_responses
from serving import RunningServer

MODEL = "SmolLM2-135M-Instruct"
HI: Any = [{"role": "user", "content": "Hi"}]
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
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}
STORY = "Write a long, detailed story about a dragon who learns to bake bread in a village."


def _strict(kind: Any, data: Any) -> Any:
    return pydantic.TypeAdapter(kind).validate_python(data, strict=True)


def _frames(text: str) -> Iterator[tuple[str | None, str]]:
    """Each server-sent event's name (None without one) and data."""
    for frame in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in frame.split("\n") if ": " in line)
        if "data" in fields:
            yield fields.get("event"), fields["data"]


def _openai_error(response: Any, status: int) -> ErrorObject:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error: ErrorObject = _strict(ErrorObject, body["error"])
    return error


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"logprobs": True, "top_logprobs": 2},
        {"n": 2, "temperature": 1, "stop": ["."]},
        {"tools": [WEATHER], "tool_choice": NAMED, "max_tokens": 40},
        {"tools": [WEATHER], "tool_choice": "required", "max_tokens": 40},
    ],
    ids=["plain", "logprobs", "n", "named-tool", "required-tool"],
)
def test_chat_completions_and_chunks(server: RunningServer, fields: dict[str, Any]) -> None:
    url = server.http + "/v1/chat/completions"
    body = {"messages": HI, "max_tokens": 6, "temperature": 0, **fields}
    whole = _strict(ChatCompletion, web.post(url, json=body).json())
    if "tools" in fields:
        assert whole.choices[0].message.tool_calls
    streamed = web.post(
        url, json={**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    frames = [data for _, data in _frames(streamed.text)]
    assert frames[-1] == "[DONE]"
    chunks = [_strict(ChatCompletionChunk, json.loads(data)) for data in frames[:-1]]
    assert chunks[-1].usage is not None and chunks[-1].choices == []


@pytest.mark.parametrize(
    "fields",
    [{}, {"logprobs": 2}, {"echo": True, "logprobs": 1}, {"n": 2, "temperature": 1}],
    ids=["plain", "logprobs", "echo", "n"],
)
def test_completions_and_chunks(server: RunningServer, fields: dict[str, Any]) -> None:
    url = server.http + "/v1/completions"
    body = {"prompt": "Hi", "max_tokens": 4, "temperature": 0, **fields}
    _strict(Completion, _as_typed(web.post(url, json=body).json(), streamed=False))
    streamed = web.post(
        url, json={**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    frames = [data for _, data in _frames(streamed.text)]
    assert frames[-1] == "[DONE]"
    for data in frames[:-1]:
        _strict(Completion, _as_typed(json.loads(data), streamed=True))  # as the SDK reads them


def _as_typed(completion: dict[str, Any], *, streamed: bool) -> dict[str, Any]:
    """A completion (or chunk) with the nulls OpenAI's own API sends where the SDK's types have
    none filled in, each checked to be only where OpenAI sends it: `finish_reason` before a
    choice's last chunk (the SDK reads chunks unvalidated), and an echoed prompt's first
    token, which has no log-probability."""
    for choice in completion["choices"]:
        if choice["finish_reason"] is None:
            assert streamed
            choice["finish_reason"] = "stop"
        logprobs = choice["logprobs"]
        if logprobs is not None and logprobs["token_logprobs"][:1] == [None]:
            assert logprobs["text_offset"][0] == 0 and logprobs["top_logprobs"][0] is None
            logprobs["token_logprobs"][0] = 0.0
            logprobs["top_logprobs"][0] = {}
        if logprobs is not None:
            assert None not in logprobs["token_logprobs"] + logprobs["top_logprobs"]
    return completion


def test_models_and_errors(server: RunningServer) -> None:
    listed = web.get(server.http + "/v1/models").json()
    assert listed["object"] == "list"
    [model] = [_strict(Model, entry) for entry in listed["data"]][:1]
    _strict(Model, web.get(server.http + f"/v1/models/{model.id}").json())
    missing = _openai_error(web.get(server.http + "/v1/models/nope"), 404)
    assert missing.code == "model_not_found"
    chat = server.http + "/v1/chat/completions"
    bad = _openai_error(web.post(chat, json={"messages": HI, "temperature": 9}), 400)
    assert bad.param is not None and "temperature" in bad.param
    _openai_error(web.post(chat, content=b"{not json"), 400)
    _openai_error(
        web.post(server.http + "/v1/responses", json={"input": "Hi", "temperature": 9}), 400
    )
    _openai_error(web.get(server.http + "/v1/responses/resp_nope"), 404)
    _openai_error(web.post(server.http + "/v1/no-such-route", json={}), 404)
    _openai_error(web.get(chat), 405)


def _response_events(text: str) -> list[Any]:
    """Each event read by the SDK's union, strictly: the class its `type` names, numbered in
    order, its SSE name its type."""
    events = []
    for name, data in _frames(text):
        event = _strict(ResponseStreamEvent, json.loads(data))
        assert name == event.type == json.loads(data)["type"]
        events.append(event)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


@pytest.mark.parametrize(
    ("fields", "last"),
    [
        ({"max_output_tokens": 40}, ("response.completed", "response.incomplete")),
        ({"max_output_tokens": 16, "input": STORY}, ("response.incomplete",)),
        (
            {
                "tools": [{"type": "function", **WEATHER["function"]}],
                "tool_choice": {"type": "function", "name": "get_weather"},
                "max_output_tokens": 40,
            },
            ("response.completed",),
        ),
    ],
    ids=["text", "incomplete", "function-call"],
)
def test_responses_and_their_events(
    server: RunningServer, fields: dict[str, Any], last: tuple[str, ...]
) -> None:
    url = server.http + "/v1/responses"
    body = {"input": "Hi", "max_output_tokens": 6, "temperature": 0, **fields}
    whole = _strict(Response, web.post(url, json=body).json())
    _strict(Response, web.get(f"{url}/{whole.id}").json())
    items = web.get(f"{url}/{whole.id}/input_items").json()
    for item in items["data"]:
        _strict(ResponseItem, item)
    events = _response_events(web.post(url, json={**body, "stream": True}).text)
    assert events[-1].type in last
    _strict(Response, events[-1].response.model_dump())
    if "tools" in fields:
        assert isinstance(events[-1].response.output[0], ResponseFunctionToolCall)


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_a_failed_response_s_event(kind: ErrorKind) -> None:
    """`response.failed` (a failure after the stream began), its error's code one the SDK
    lists, whatever the failure."""
    call = decode_responses(b'{"input": "Hi"}', 100)
    response = failed(opened("resp_1", MODEL, call.echo), GenerationError(kind, "no"))
    [(name, data)] = list(_frames(EventStream().failed(response).decode()))
    event = _strict(ResponseStreamEvent, json.loads(data))
    assert name == event.type == "response.failed" and event.response.status == "failed"
    assert event.response.error is not None and event.response.error.message == "no"


def test_a_background_response_queued_then_cancelled(server: RunningServer) -> None:
    url = server.http + "/v1/responses"
    body = {"input": STORY, "max_output_tokens": 1500, "temperature": 0, "background": True}
    made = _strict(Response, web.post(url, json=body).json())
    assert made.status in ("queued", "in_progress")
    seen: list[str] = []
    with web.stream("GET", f"{url}/{made.id}", params={"stream": "true"}) as stream:
        lines = stream.iter_lines()
        for line in lines:
            seen.append(line)
            if line.startswith("data: ") and '"response.output_text.delta"' in line:
                break
        cancelled = _strict(Response, web.post(f"{url}/{made.id}/cancel").json())
        assert cancelled.status == "cancelled"
        seen.extend(lines)
    events = _response_events("\n".join(seen))
    assert "response.queued" in [e.type for e in events]
    final = events[-1]
    assert isinstance(final, ResponseIncompleteEvent) and final.response.status == "cancelled"
    _strict(Response, web.get(f"{url}/{made.id}").json())


def test_anthropic_answers_counts_and_errors(server: RunningServer) -> None:
    url = server.http + "/v1/messages"
    body: Any = {
        "model": MODEL,
        "max_tokens": 60,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [
            {
                "name": "get_weather",
                "input_schema": WEATHER["function"]["parameters"],
            }
        ],
        "tool_choice": {"type": "any"},
    }
    message = _strict(at.Message, web.post(url, json=body).json())
    # Parallel calls are allowed (no `disable_parallel_tool_use`): one tool_use block or more.
    assert message.content and {b.type for b in message.content} == {"tool_use"}
    counted = web.post(url + "/count_tokens", json={k: body[k] for k in ("model", "messages")})
    assert _strict(at.MessageTokensCount, counted.json()).input_tokens > 0
    events = [
        (name, _strict(at.RawMessageStreamEvent, json.loads(data)))
        for name, data in _frames(web.post(url, json={**body, "stream": True}).text)
        if name != "ping"
    ]
    assert all(name == event.type for name, event in events)
    for refused, status in [
        (web.post(url, json={**body, "max_tokens": 0}), 400),
        (web.post(url, json={**body, "model": "claude-nope"}), 404),
        (web.get(url), 405),
        (web.post(url + "/batches", json={}), 404),
    ]:
        assert refused.status_code == status
        _strict(at.ErrorResponse, refused.json())


def test_an_unknown_cohere_path_is_cohere_s_error(server: RunningServer) -> None:
    answer = web.post(server.http + "/v2/no-such-route", json={})
    assert answer.status_code == 404
    body = answer.json()
    assert set(body) == {"id", "message"} and "/v2/no-such-route" in body["message"]
