"""`tool_choice: auto` with no settings, held to a grammar (docs/OPENAI.md, "Tool calls"): the
default model's hermes-style calls, the gateway's own JSON format for a model without a tool
parser (TGI's `tool_prompt` with it), the bound on parallel calls, a call cut by max_tokens,
the Responses API's streamed arguments and Anthropic's Messages route. Every call in every
answer is checked: a valid call of a declared tool."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import jsonschema  # type: ignore[import-untyped]
import openai
import pytest
from huggingface_hub import InferenceClient
from openai.types.chat import ChatCompletionFunctionToolParam

from serving import RunningServer

MODEL = "SmolLM2-135M-Instruct"
TEMPLATE = Path(__file__).parent.parent / "deploy" / "chat-templates" / "chatml-hermes-tools.jinja"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}},
    "required": ["city"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "EST"]}},
    "required": ["zone"],
}
SCHEMAS: dict[str, dict[str, Any]] = {"get_weather": WEATHER, "get_time": TIME}
TOOLS: list[ChatCompletionFunctionToolParam] = [
    {"type": "function", "function": {"name": name, "description": text, "parameters": schema}}
    for (name, schema), text in zip(
        SCHEMAS.items(), ["The weather in a city", "The time in a time zone"], strict=True
    )
]
PROMPTS = [
    "What's the weather in Paris?",
    "What time is it in UTC?",
    "Weather in Tokyo please.",
    "What is the capital of France?",
    "Tell me a joke.",
    "Is it raining in London?",
    "What's the time in CET?",
    "How are you today?",
    "Weather report for Rome.",
    "Say hello.",
]


Conversation = list[dict[str, Any]]


def hermes_shot(number: int, city: str) -> dict[str, Any]:
    """An assistant turn that called, as the default model's template renders it."""
    arguments = json.dumps({"city": city})
    call = {"name": "get_weather", "arguments": arguments}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": f"call-{number}", "type": "function", "function": call}],
    }


def json_shot(number: int, city: str) -> dict[str, Any]:
    """An assistant turn that called, in the gateway's own format (a model without a parser)."""
    calls = [{"name": "get_weather", "parameters": {"city": city}}]
    return {"role": "assistant", "content": json.dumps(calls, separators=(",", ":"))}


def conversations(shot: Callable[[int, str], dict[str, Any]]) -> list[Conversation]:
    """Each prompt alone, and the default model continuing a pattern of calls it has seen."""
    alone = [[{"role": "user", "content": prompt}] for prompt in PROMPTS]
    seen: list[Any] = [
        [
            {"role": "user", "content": "Weather in Paris?"},
            shot(1, "Paris"),
            {"role": "user", "content": "Weather in London?"},
            shot(2, "London"),
            {"role": "user", "content": f"Weather in {city}?"},
        ]
        for city in ("Rome", "Oslo", "Lima")
    ]
    return [*alone, *seen]


def client(server: RunningServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.http + "/v1", api_key="unused", max_retries=0)


def assert_valid(name: str, arguments: str) -> None:
    assert name in SCHEMAS, name
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def run_auto(server: RunningServer, asked: list[Conversation]) -> tuple[int, int]:
    """Every conversation whole and streamed, with no tool_choice: (answers with calls,
    answers)."""

    async def whole(api: openai.AsyncOpenAI, messages: Any) -> list[tuple[str, str]]:
        answer = await api.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=TOOLS,
            temperature=0,
            max_tokens=80,
        )
        [choice] = answer.choices
        calls = choice.message.tool_calls or []
        assert not calls or choice.finish_reason == "tool_calls"
        return [(c.function.name, c.function.arguments) for c in calls]  # type: ignore[union-attr]

    async def streamed(api: openai.AsyncOpenAI, messages: Any) -> list[tuple[str, str]]:
        stream = await api.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=TOOLS,
            temperature=0,
            max_tokens=80,
            stream=True,
        )
        calls: dict[int, list[str]] = {}
        async for chunk in stream:
            for piece in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                name, *arguments = calls.setdefault(piece.index, [""])
                function = piece.function
                if function is not None:
                    calls[piece.index] = [
                        name or function.name or "",
                        *arguments,
                        function.arguments or "",
                    ]
        return [(name, "".join(arguments)) for name, *arguments in calls.values()]

    async def every() -> list[list[tuple[str, str]]]:
        async with client(server) as api:
            answers = [one(api, c) for c in asked for one in (whole, streamed)]
            return list(await asyncio.gather(*answers))

    answers = asyncio.run(every())
    for calls in answers:
        for name, arguments in calls:
            assert_valid(name, arguments)
    return sum(1 for calls in answers if calls), len(answers)


def test_auto_with_no_settings_answers_or_calls_a_declared_tool(server: RunningServer) -> None:
    called, total = run_auto(server, conversations(hermes_shot))
    assert 0 < called < total, (called, total)  # the default model both calls and answers


@pytest.mark.long  # many conversations; `auto` with no settings in make test: the tests above
def test_auto_in_the_gateways_own_format_without_a_parser(
    make_server: Callable[..., RunningServer],
) -> None:
    own = make_server(CHAT_TEMPLATE=str(TEMPLATE))  # a template of one's own: no parser known
    called, total = run_auto(own, conversations(json_shot))
    assert 0 < called < total, (called, total)
    hub = InferenceClient(base_url=own.http)
    answer = hub.chat_completion(
        [{"role": "user", "content": "Weather in Rome?"}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_prompt="Call a tool: answer with a JSON array of calls.",
        max_tokens=80,
        temperature=0,
    )
    for call in answer.choices[0].message.tool_calls or []:
        arguments = call.function.arguments
        assert_valid(
            call.function.name, json.dumps(arguments) if isinstance(arguments, dict) else arguments
        )


def test_required_with_parallel_calls_ends(server: RunningServer) -> None:
    async def every() -> list[Any]:
        async with client(server) as api:
            asked = [
                api.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": prompt}],
                    tools=TOOLS,
                    tool_choice="required",
                    temperature=0,
                    max_tokens=800,
                )
                for prompt in PROMPTS
            ]
            return list(await asyncio.gather(*asked))

    for answer in asyncio.run(every()):
        [choice] = answer.choices
        assert choice.finish_reason == "tool_calls", choice
        calls = choice.message.tool_calls or []
        assert 1 <= len(calls) <= 8
        for call in calls:
            assert_valid(call.function.name, call.function.arguments)


def test_a_call_cut_by_max_tokens_comes_as_far_as_it_got(server: RunningServer) -> None:
    api = openai.OpenAI(base_url=server.http + "/v1", api_key="unused", max_retries=0)
    ask: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "temperature": 0,
        "max_tokens": 5,
    }
    whole = api.chat.completions.create(**ask)
    [choice] = whole.choices
    assert choice.finish_reason == "length"
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    pieces = [
        p
        for chunk in api.chat.completions.create(**ask, stream=True)
        for p in (chunk.choices[0].delta.tool_calls or [] if chunk.choices else [])
    ]
    streamed = "".join(p.function.arguments or "" for p in pieces if p.function)
    assert streamed == call.function.arguments
    assert '{"city":"Paris"}'.startswith(streamed)


def test_streamed_responses_send_the_arguments_as_they_come(server: RunningServer) -> None:
    api = openai.OpenAI(base_url=server.http + "/v1", api_key="unused", max_retries=0)
    events = list(
        api.responses.create(
            model=MODEL,
            input="What is the weather in Paris?",
            tools=[
                {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True}
            ],
            tool_choice="required",
            max_output_tokens=60,
            temperature=0,
            stream=True,
        )
    )
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert "".join(d.delta for d in deltas) == done.arguments
    final = events[-1]
    assert final.type == "response.completed"
    [call] = final.response.output
    assert call.type == "function_call" and call.arguments == done.arguments
    assert call.id == deltas[0].item_id
    assert_valid(call.name, call.arguments)


def test_anthropics_messages_get_a_tool_use_with_no_settings(server: RunningServer) -> None:
    api = anthropic.Anthropic(base_url=server.http, api_key="unused", max_retries=0)
    tools: list[Any] = [
        {"name": n, "description": "a tool", "input_schema": s} for n, s in SCHEMAS.items()
    ]

    def used(number: int, city: str) -> dict[str, Any]:
        use = {"type": "tool_use", "id": f"t{number}", "name": "get_weather"}
        return {"role": "assistant", "content": [{**use, "input": {"city": city}}]}

    seen: list[Any] = [
        {"role": "user", "content": "Weather in Paris?"},
        used(1, "Paris"),
        {"role": "user", "content": "Weather in London?"},
        used(2, "London"),
    ]
    answers = [
        api.messages.create(
            model=MODEL,
            max_tokens=80,
            extra_body={"temperature": 0},
            tools=tools,
            messages=[*seen, {"role": "user", "content": prompt}],
        )
        for prompt in ("Weather in Rome?", "Weather in Oslo?", "Tell me a joke.")
    ]
    uses = [b for answer in answers for b in answer.content if b.type == "tool_use"]
    assert uses  # the default model calls on some of them
    for answer in answers:
        if any(b.type == "tool_use" for b in answer.content):
            assert answer.stop_reason == "tool_use"
    for block in uses:
        assert_valid(block.name, json.dumps(block.input))
