"""OpenAI's Responses API with the official `openai` client and the openai-agents SDK:
whole and streamed answers, turns continued by `previous_response_id` on the prefix cache,
stored responses (retrieve, delete, input items) private to their key, and refusals naming
the field."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import openai
import pytest
from openai.types.responses import (
    FunctionToolParam,
    ResponseFunctionToolCall,
    ResponseInputText,
)
from redis_server import RedisServer, running_redis

from clients import CITY_SCHEMA, web
from protocols.events import Finished, GeneratedSequence, History, token_array
from protocols.responses_answers import input_items, outcome_of
from protocols.tool_calls import CalledFunction, ParsedDelta, ParsedMessage, ToolCall
from serving import RunningServer

MODEL = "SmolLM2-135M-Instruct"
KEY, OTHER = "sk-responses-one", "sk-responses-two"
BLOCK = 128  # tokens per KV block on vLLM's CPU backend: the cache holds whole blocks only


def client(server: RunningServer, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.http + "/v1", api_key=key, max_retries=0)


def texts(items: Any) -> list[str]:
    """The text of each message among a page of input items."""
    return [
        part.text
        for item in items.data
        if item.type == "message"
        for part in item.content
        if isinstance(part, ResponseInputText)
    ]


def test_a_response_whole(server: RunningServer) -> None:
    response = client(server).responses.create(
        model=MODEL,
        input="What is the capital of France?",
        instructions="Answer in one short sentence.",
        max_output_tokens=24,
        temperature=0,
        metadata={"topic": "geography"},
    )
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete")
    assert "Paris" in response.output_text
    assert response.metadata == {"topic": "geography"}
    assert response.instructions == "Answer in one short sentence."
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0


def test_input_tokens_count_equals_the_responses_input_tokens(server: RunningServer) -> None:
    """`responses.input_tokens.count` (what Codex asks before a turn) on the same body as the
    response: instructions, tools, and a turn continued by previous_response_id."""
    tool: FunctionToolParam = {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": CITY_SCHEMA,
        "strict": False,
    }
    first_body: dict[str, Any] = {
        "model": MODEL,
        "input": "What is the weather in Paris?",
        "instructions": "Be brief.",
        "tools": [tool],
        "tool_choice": "none",
    }
    counted = client(server).responses.input_tokens.count(**first_body)
    assert counted.object == "response.input_tokens"
    first = client(server).responses.create(**first_body, max_output_tokens=4, temperature=0)
    assert first.usage is not None and counted.input_tokens == first.usage.input_tokens
    second_body: dict[str, Any] = {
        "model": MODEL,
        "input": "And in Rome?",
        "previous_response_id": first.id,
    }
    again = client(server).responses.input_tokens.count(**second_body)
    second = client(server).responses.create(**second_body, max_output_tokens=4, temperature=0)
    assert second.usage is not None and again.input_tokens == second.usage.input_tokens
    alone = client(server).responses.input_tokens.count(model=MODEL, input="And in Rome?")
    assert again.input_tokens > alone.input_tokens  # the first turn is in its prompt
    with pytest.raises(openai.NotFoundError):
        client(server).responses.input_tokens.count(model="no-such-model", input="hi")


def test_a_response_streamed_as_the_sdks_typed_events(server: RunningServer) -> None:
    stream = client(server).responses.create(
        model=MODEL, input="Say hello.", max_output_tokens=48, temperature=0, stream=True
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1
    final = events[-1]
    assert final.type == "response.completed"
    assert final.response.output_text == "".join(deltas) != ""
    done = events[-4]
    assert done.type == "response.output_text.done" and done.text == "".join(deltas)
    assert final.response.usage is not None and final.response.usage.output_tokens > 0


def test_each_streamed_events_sse_name_is_its_type(server: RunningServer) -> None:
    """The SDK reads an event's `data` alone: its `event:` line is checked on the wire."""
    body = {"model": MODEL, "input": "Say hello.", "max_output_tokens": 4, "stream": True}
    with web.stream("POST", server.http + "/v1/responses", json=body) as answer:
        lines = [line for line in answer.iter_lines() if line]
    names, data = lines[0::2], lines[1::2]
    assert len(names) == len(data) > 4
    assert all(n.startswith("event: ") for n in names) and all(d.startswith("data: ") for d in data)
    types = [json.loads(d.removeprefix("data: "))["type"] for d in data]
    assert [n.removeprefix("event: ") for n in names] == types
    assert types[0] == "response.created" and types[-1] in (
        "response.completed",
        "response.incomplete",
    )


def test_five_turns_by_previous_response_id_come_from_the_prefix_cache(
    server: RunningServer,
) -> None:
    rules = " ".join(f"Rule {i}: answer briefly and politely, in plain English." for i in range(40))
    api = client(server)
    response = api.responses.create(
        model=MODEL, input=rules + " Name a colour.", max_output_tokens=8, temperature=0
    )
    for turn in range(1, 5):
        assert response.usage is not None
        before = response.usage.total_tokens  # the whole sequence the next turn continues
        response = api.responses.create(
            model=MODEL,
            input=f"Turn {turn}: name another colour.",
            previous_response_id=response.id,
            max_output_tokens=8,
            temperature=0,
        )
        usage = response.usage
        assert usage is not None
        assert usage.input_tokens > before  # the history, then the new message
        # every whole block of the previous sequence came from vLLM's prefix cache
        assert usage.input_tokens_details.cached_tokens >= before - BLOCK, (turn, usage)
        assert response.previous_response_id is not None


def test_a_continued_turn_remembers_what_came_before(server: RunningServer) -> None:
    api = client(server)
    first = api.responses.create(
        model=MODEL,
        input="My name is Zanzibar. Reply with OK.",
        max_output_tokens=8,
        temperature=0,
    )
    second = api.responses.create(
        model=MODEL,
        input="Repeat my name, one word.",
        previous_response_id=first.id,
        max_output_tokens=8,
        temperature=0,
    )
    assert "Zanzibar" in second.output_text


def test_retrieve_input_items_and_delete(server: RunningServer) -> None:
    api = client(server)
    made = api.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Hello."},
            {"role": "user", "content": [{"type": "input_text", "text": "Say a number."}]},
        ],
        max_output_tokens=4,
        temperature=0,
    )
    got = api.responses.retrieve(made.id)
    assert got.id == made.id and got.output_text == made.output_text
    assert got.usage == made.usage
    items = api.responses.input_items.list(made.id)
    assert texts(items) == ["Say a number.", "Hello."]  # newest first, OpenAI's default
    ascending = api.responses.input_items.list(made.id, order="asc", limit=1)
    assert texts(ascending) == ["Hello."] and ascending.has_more
    api.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError) as caught:
        api.responses.retrieve(made.id)
    assert caught.value.status_code == 404
    with pytest.raises(openai.NotFoundError):
        api.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        api.responses.input_items.list(made.id)


def test_store_false_keeps_nothing(server: RunningServer) -> None:
    api = client(server)
    made = api.responses.create(
        model=MODEL, input="Hello.", max_output_tokens=4, temperature=0, store=False
    )
    assert made.output_text
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError) as caught:
        api.responses.create(
            model=MODEL, input="Go on.", previous_response_id=made.id, max_output_tokens=4
        )
    assert caught.value.body["param"] == "previous_response_id"  # type: ignore[index]
    expected = f"Previous response with id '{made.id}' not found."
    assert caught.value.body["message"] == expected  # type: ignore[index]


def test_a_response_belongs_to_the_key_that_made_it(
    make_server: Callable[..., RunningServer],
) -> None:
    guarded = make_server(API_KEYS=f"{KEY},{OTHER}")
    mine, theirs = client(guarded, KEY), client(guarded, OTHER)
    made = mine.responses.create(
        model=MODEL, input="My password is swordfish.", max_output_tokens=4, temperature=0
    )
    with pytest.raises(openai.NotFoundError):
        theirs.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.input_items.list(made.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.create(
            model=MODEL, input="What is my password?", previous_response_id=made.id
        )
    with pytest.raises(openai.NotFoundError):
        theirs.responses.delete(made.id)
    assert mine.responses.retrieve(made.id).id == made.id  # still there for its own key
    with pytest.raises(openai.AuthenticationError) as refused:
        client(guarded, "sk-not-a-key").responses.retrieve(made.id)
    assert refused.value.body["type"] == "invalid_request_error"  # type: ignore[index]


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


def test_with_redis_a_second_gateway_continues_and_deletes_a_response(
    make_server: Callable[..., RunningServer], redis_server: RedisServer
) -> None:
    """Stored responses live in the shared store: another gateway (a restart, a replica) reads
    and continues them on its key, and another key does not find them there either."""
    keys = f"{KEY},{OTHER}"
    first = make_server(REDIS_URL=redis_server.url, API_KEYS=keys)
    second = make_server(REDIS_URL=redis_server.url, API_KEYS=keys)
    rules = " ".join(f"Rule {i}: answer briefly and politely, in plain English." for i in range(40))
    made = client(first, KEY).responses.create(
        model=MODEL, input=rules + " Name a colour.", max_output_tokens=8, temperature=0
    )
    assert made.usage is not None
    again = client(second, KEY).responses.retrieve(made.id)
    assert again.output_text == made.output_text
    with pytest.raises(openai.NotFoundError):
        client(second, OTHER).responses.retrieve(made.id)
    continued = client(second, KEY).responses.create(
        model=MODEL,
        input="Another one.",
        previous_response_id=made.id,
        max_output_tokens=8,
        temperature=0,
    )
    assert continued.usage is not None
    assert continued.usage.input_tokens_details.cached_tokens >= made.usage.total_tokens - BLOCK
    client(first, KEY).responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        client(second, KEY).responses.retrieve(made.id)


def test_text_format_json_schema_gives_json_that_validates(server: RunningServer) -> None:
    schema = CITY_SCHEMA
    response = client(server).responses.create(
        model=MODEL,
        input="Give the capital of France as JSON.",
        text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}},
        max_output_tokens=300,
        temperature=0,
    )
    assert response.status == "completed", response.output_text
    jsonschema.validate(json.loads(response.output_text), schema)
    assert response.text is not None and response.text.format is not None
    assert response.text.format.type == "json_schema"
    anything = client(server).responses.create(
        model=MODEL,
        input='Answer in JSON: {"capital": ...}. France?',
        text={"format": {"type": "json_object"}},
        max_output_tokens=100,
        temperature=0,
    )
    assert isinstance(json.loads(anything.output_text), dict)
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client(server).responses.create(
            model=MODEL,
            input="Hi",
            text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "no-such"}}},
            max_output_tokens=4,
        )
    assert caught.value.body["param"] == "text.format.schema"  # type: ignore[index]


def test_a_function_call_and_its_output_continue_the_turn(server: RunningServer) -> None:
    api = client(server)
    weather: FunctionToolParam = {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
        "strict": True,
    }
    ask: dict[str, Any] = {
        "model": MODEL,
        "input": "What is the weather in Paris?",
        "tools": [weather],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 40,
        "temperature": 0,
    }
    called = api.responses.create(**ask)
    calls = [item for item in called.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert "city" in json.loads(calls[0].arguments)
    events = list(api.responses.create(**ask, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # the output read for calls at its end: each item opened, then done
    added = [e.item for e in events if e.type == "response.output_item.added"]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in added] == [i.type for i in done] == ["function_call"]
    final = events[-1]
    assert final.type == "response.completed"
    [streamed] = final.response.output
    assert isinstance(streamed, ResponseFunctionToolCall) and streamed.name == "get_weather"
    assert isinstance(done[0], ResponseFunctionToolCall) and done[0].call_id == streamed.call_id
    assert "city" in json.loads(streamed.arguments)
    answered = api.responses.create(
        model=MODEL,
        input=[
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 25 C"}
        ],
        previous_response_id=called.id,
        max_output_tokens=16,
        temperature=0,
    )
    assert answered.output_text
    items = api.responses.input_items.list(answered.id)
    assert [item.type for item in items.data] == ["function_call_output"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "Hi", "temperature": 5}, "temperature"),
        ({}, "input"),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "http://x/y.png"}],
                    }
                ]
            },
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "Hi"}]}, "input[0].role"),
        ({"input": "Hi", "tools": [{"type": "custom", "name": "x"}]}, "tools[0].type"),
        (
            {"input": "Hi", "tools": [{"type": "web_search"}], "tool_choice": "required"},
            "tool_choice",
        ),
        ({"input": "Hi", "tool_choice": "required"}, "tool_choice"),
        ({"input": "Hi", "background": True, "store": False}, "background"),
        ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
        (
            {"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
            "text.format.schema",
        ),
        ({"input": "Hi", "metadata": {"k": 1}}, "metadata[...]"),
        ({"input": "Hi", "tools": [{"type": "function", "name": "no spaces"}]}, "tools[0].name"),
    ],
)
def test_bad_input_is_400_naming_the_field(
    server: RunningServer, body: dict[str, Any], param: str
) -> None:
    answer = web.post(server.http + "/v1/responses", json={"model": MODEL, **body})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


def test_input_items_page_after_an_item() -> None:
    items = [{"id": f"item_{i}", "type": "message"} for i in range(5)]
    page = json.loads(input_items(items, order="asc", after="item_1", limit=2))
    assert [i["id"] for i in page["data"]] == ["item_2", "item_3"]
    assert (page["first_id"], page["last_id"], page["has_more"]) == ("item_2", "item_3", True)
    newest = json.loads(input_items(items, order="desc", after=None, limit=20))
    assert [i["id"] for i in newest["data"]] == [f"item_{i}" for i in range(4, -1, -1)]
    assert not newest["has_more"]


class OneCall:
    """Tool answers that read every text as one call of `get_weather`."""

    def message(self, index: int, text: str, finish_reason: str) -> ParsedMessage:
        call = ToolCall(id="call_1", function=CalledFunction("get_weather", '{"city": "Paris"}'))
        return ParsedMessage(None, [call], "tool_calls")

    def delta(
        self, index: int, text: str, token_ids: list[int], finish_reason: str | None
    ) -> ParsedDelta:
        raise NotImplementedError


def test_a_turns_calls_reach_the_next_turns_template_as_the_chat_routes_do() -> None:
    """The stored assistant message: its calls' arguments as objects, transformers' convention
    (a template that writes `arguments | tojson` would quote a string again)."""
    done = Finished(0, History(token_array([1, 2]), "x"), [GeneratedSequence("x", 1, "stop")], 1, 0)
    outcome = outcome_of(done, "msg_1", OneCall())
    [item] = outcome.output
    assert item["type"] == "function_call" and item["arguments"] == '{"city": "Paris"}'
    assert outcome.message["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
        }
    ]


def test_an_unknown_id_is_404_in_openais_shape(server: RunningServer) -> None:
    answer = web.get(server.http + "/v1/responses/resp_nothing")
    assert answer.status_code == 404
    assert answer.json()["error"]["message"] == "Response with id 'resp_nothing' not found."


def test_an_openai_agents_agent_runs_one_turn(server: RunningServer) -> None:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)  # no traces sent to OpenAI
    api = openai.AsyncOpenAI(base_url=server.http + "/v1", api_key="unused", max_retries=0)
    agent = agents.Agent(
        name="Assistant",
        instructions="Answer in one short sentence.",
        model=agents.OpenAIResponsesModel(model=MODEL, openai_client=api),
        model_settings=agents.ModelSettings(temperature=0, max_tokens=24),
    )
    result = asyncio.run(agents.Runner.run(agent, "What is the capital of France?"))
    assert isinstance(result.final_output, str) and "Paris" in result.final_output
