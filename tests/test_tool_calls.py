"""Tool calls on the chat route (docs/OPENAI.md, "Tool calls"), with the real clients:
`openai` (whole, and streamed through its `chat.completions.stream` helper), langchain-openai,
and huggingface_hub against TGI's Messages API; `required` and a named function held to the
tools' schemas with the default model, `auto` read by vLLM's hermes parser."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import openai
import pytest
from huggingface_hub import InferenceClient
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageParam,
    ChatCompletionNamedToolChoiceParam,
)

from clients import web
from protocols.errors import GenerationError
from protocols.openai_requests import decode_chat
from serving import RunningServer

MODEL = "SmolLM2-135M-Instruct"
TEMPLATE = Path(__file__).parent.parent / "deploy" / "chat-templates" / "chatml-hermes-tools.jinja"

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
FLIGHT = {
    "type": "object",
    "properties": {
        "origin": {"type": "string", "maxLength": 24},
        "destination": {"type": "string", "maxLength": 24},
        "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["origin", "destination", "passengers"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER, "book_flight": FLIGHT}
TOOLS: list[ChatCompletionFunctionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": SCHEMAS[name],
            "strict": True,  # the SDK's stream helper parses only strict tools' arguments
        },
    }
    for name, description in (
        ("get_weather", "The current weather in a city"),
        ("book_flight", "Book a flight between two cities"),
    )
]
PROMPTS = [
    "What's the weather like in Paris?",
    "Is it raining in Tokyo right now?",
    "Book me a flight from London to Rome.",
    "I need two seats from Berlin to Madrid.",
    "How cold is it in Oslo, in fahrenheit?",
    "Temperature in Cairo please.",
    "Fly three of us from Lisbon to Vienna.",
    "Should I bring an umbrella in Seattle?",
    "Get me from Dublin to Prague tomorrow.",
    "What is the forecast for Sydney?",
    "Weather check: Toronto.",
    "One ticket from Athens to Zurich.",
    "Is it sunny in Barcelona?",
    "Book flights for a family of four, Boston to Denver.",
    "How hot is Dubai today in celsius?",
    "I want to travel from Warsaw to Helsinki.",
    "Tell me the weather in Mumbai.",
    "Reserve a flight: Chicago to Miami, 2 people.",
    "Is it snowing in Montreal?",
    "Weather in Buenos Aires, fahrenheit.",
]
NAMED: ChatCompletionNamedToolChoiceParam = {
    "type": "function",
    "function": {"name": "get_weather"},
}
# `parallel_tool_calls=False` below: the default model (135M) allowed several calls tends to
# repeat its call until max_tokens (a valid array that never closes); one call, as langchain's
# structured output asks too.


def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.http + "/v1", api_key="unused", max_retries=0)


def async_client(server: RunningServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.http + "/v1", api_key="unused", max_retries=0)


def ask(prompt: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": prompt}]


def assert_valid_calls(calls: Any, named: str | None = None) -> None:
    """Every call names a tool and its arguments parse and validate against its schema."""
    assert calls, "no tool calls"
    for call in calls:
        assert call.type == "function" and call.id
        assert call.function.name in SCHEMAS and (named is None or call.function.name == named)
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.long  # twenty prompts, each call validated: make test-all
def test_required_and_named_calls_validate_on_twenty_prompts(server: RunningServer) -> None:
    async def one(api: openai.AsyncOpenAI, prompt: str, choice: Any) -> Any:
        return await api.chat.completions.create(
            model=MODEL,
            messages=ask(prompt),
            tools=TOOLS,
            tool_choice=choice,
            temperature=0,
            max_tokens=300,
            parallel_tool_calls=False,
        )

    async def every() -> list[Any]:
        async with async_client(server) as api:
            asked = [one(api, p, c) for p in PROMPTS for c in ("required", NAMED)]
            return list(await asyncio.gather(*asked))

    answers = asyncio.run(every())
    for answer, choice in zip(answers, ["required", "named"] * len(PROMPTS), strict=True):
        [only] = answer.choices
        assert only.message.content is None
        if choice == "required":
            assert only.finish_reason == "tool_calls"
            assert_valid_calls(only.message.tool_calls)
        else:  # OpenAI's: a named function's answer ends with "stop"
            assert only.finish_reason == "stop"
            assert_valid_calls(only.message.tool_calls, named="get_weather")
            assert len(only.message.tool_calls) == 1


# `make test-all` only (issue 55: `make test`'s time on the slowest CPU); a streamed call as
# OpenAI streams it stays in `make test`.
@pytest.mark.long
def test_the_sdks_stream_helper_reassembles_the_calls(server: RunningServer) -> None:
    async def one(api: openai.AsyncOpenAI, prompt: str, choice: Any) -> Any:
        async with api.chat.completions.stream(
            model=MODEL,
            messages=ask(prompt),
            tools=TOOLS,
            tool_choice=choice,
            temperature=0,
            max_tokens=300,
            parallel_tool_calls=False,
        ) as stream:
            pieces = [
                event
                async for event in stream
                if event.type == "tool_calls.function.arguments.delta"
            ]
            return await stream.get_final_completion(), pieces

    async def every() -> list[Any]:
        async with async_client(server) as api:
            asked = [one(api, p, c) for p in PROMPTS for c in ("required", NAMED)]
            return list(await asyncio.gather(*asked))

    for (final, pieces), choice in zip(
        asyncio.run(every()), ["required", "named"] * 20, strict=True
    ):
        [only] = final.choices
        calls = only.message.tool_calls
        assert_valid_calls(calls, named="get_weather" if choice == "named" else None)
        assert len(pieces) > 1  # the arguments came in pieces
        for call in calls:  # strict tools: the helper parses the arguments itself
            assert call.function.parsed_arguments == json.loads(call.function.arguments)
        assert only.finish_reason == ("tool_calls" if choice == "required" else "stop")


def test_a_streamed_call_comes_as_openai_streams_it(server: RunningServer) -> None:
    stream = client(server).chat.completions.create(
        model=MODEL,
        messages=ask(PROMPTS[0]),
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=300,
        stream=True,
        parallel_tool_calls=False,
    )
    deltas = [chunk.choices[0].delta for chunk in stream if chunk.choices]
    pieces = [call for d in deltas for call in d.tool_calls or []]
    first, rest = pieces[0], pieces[1:]
    assert first.index == 0 and first.id and first.type == "function"
    assert first.function is not None and first.function.name in SCHEMAS
    assert all(p.id is None and p.function is not None and p.function.name is None for p in rest)
    arguments = "".join(p.function.arguments or "" for p in pieces if p.function)
    jsonschema.validate(json.loads(arguments), SCHEMAS[first.function.name])
    assert not any(d.content for d in deltas)


def test_a_tool_result_then_a_final_answer(server: RunningServer) -> None:
    api = client(server)
    history: list[ChatCompletionMessageParam] = ask("What's the weather like in Paris?")
    called = api.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, tool_choice=NAMED, temperature=0, max_tokens=300
    )
    [call] = called.choices[0].message.tool_calls or []
    assert call.type == "function"
    history.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        }
    )
    history.append({"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"})
    final = api.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=40
    )
    [answer] = final.choices
    assert answer.message.content and not answer.message.tool_calls
    assert answer.finish_reason in ("stop", "length")


def test_n_choices_each_with_its_calls(server: RunningServer) -> None:
    answer = client(server).chat.completions.create(
        model=MODEL,
        messages=ask("Book me a flight from London to Rome."),
        tools=TOOLS,
        tool_choice="required",
        n=3,
        temperature=1.0,
        seed=7,
        max_tokens=300,
        parallel_tool_calls=False,
    )
    assert [c.index for c in answer.choices] == [0, 1, 2]
    for choice in answer.choices:
        assert_valid_calls(choice.message.tool_calls)
    stream = client(server).chat.completions.create(
        model=MODEL,
        messages=ask("Book me a flight from London to Rome."),
        tools=TOOLS,
        tool_choice="required",
        n=2,
        temperature=1.0,
        max_tokens=300,
        parallel_tool_calls=False,
        stream=True,
    )
    arguments: dict[int, str] = {}
    names: dict[int, str] = {}
    ends: dict[int, str | None] = {}
    for chunk in stream:
        for streamed in chunk.choices:  # each choice read on its own, its pieces in order
            for piece in streamed.delta.tool_calls or []:
                assert piece.index == 0 and piece.function is not None
                if piece.function.name:
                    names[streamed.index] = piece.function.name
                arguments[streamed.index] = arguments.get(streamed.index, "") + (
                    piece.function.arguments or ""
                )
            if streamed.finish_reason:
                ends[streamed.index] = streamed.finish_reason
    assert ends == {0: "tool_calls", 1: "tool_calls"}
    for index in (0, 1):
        jsonschema.validate(json.loads(arguments[index]), SCHEMAS[names[index]])


def test_langchain_binds_tools_and_structured_output(server: RunningServer) -> None:
    from langchain_core.messages import AIMessage
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field, SecretStr

    class City(BaseModel):
        """A city and the country it is in."""

        name: str = Field(max_length=24)
        country: str = Field(max_length=24)

    chat = ChatOpenAI(
        base_url=server.http + "/v1",
        api_key=SecretStr("unused"),
        model=MODEL,
        temperature=0,
        max_completion_tokens=300,
        max_retries=0,
    )
    weather = [dict(t) for t in TOOLS]
    bound = chat.bind_tools(weather, tool_choice="any", parallel_tool_calls=False)
    message = bound.invoke("Weather in Paris?")
    assert isinstance(message, AIMessage) and message.tool_calls
    for call in message.tool_calls:
        jsonschema.validate(call["args"], SCHEMAS[call["name"]])
    city = chat.with_structured_output(City, method="function_calling").invoke(
        "Which city is the capital of France?"
    )
    assert isinstance(city, City)


def test_huggingface_hub_tools_on_tgis_messages_api(server: RunningServer) -> None:
    hub = InferenceClient(base_url=server.http)
    tools: list[Any] = [dict(t) for t in TOOLS]  # sent as they are
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Rome?"}]
    answer = hub.chat_completion(
        messages,
        tools=tools,
        tool_choice="required",
        max_tokens=300,
        temperature=0,
        extra_body={"parallel_tool_calls": False},
    )
    calls = answer.choices[0].message.tool_calls or []
    assert calls and all(c.function.name in SCHEMAS for c in calls)
    for call in calls:  # huggingface_hub reads `arguments` as it comes: a JSON string
        jsonschema.validate(json.loads(str(call.function.arguments)), SCHEMAS[call.function.name])
    from huggingface_hub import ChatCompletionInputFunctionName, ChatCompletionInputToolChoiceClass

    named = ChatCompletionInputToolChoiceClass(
        function=ChatCompletionInputFunctionName(name="book_flight")
    )
    streamed = hub.chat_completion(
        messages, tools=tools, tool_choice=named, max_tokens=300, temperature=0, stream=True
    )
    pieces = [
        c for chunk in streamed if chunk.choices for c in chunk.choices[0].delta.tool_calls or []
    ]
    assert pieces[0].function.name == "book_flight"
    arguments = "".join(p.function.arguments or "" for p in pieces)
    jsonschema.validate(json.loads(arguments), FLIGHT)


@pytest.fixture
def hermes(make_server: Callable[..., RunningServer]) -> Iterator[RunningServer]:
    """A server with auto tool choice: vLLM's hermes parser, the hermes-style template."""
    yield make_server(
        ENABLE_AUTO_TOOL_CHOICE="true", TOOL_CALL_PARSER="hermes", CHAT_TEMPLATE=str(TEMPLATE)
    )


# The default model continues a pattern it has seen: two questions each answered with a call,
# then a third of the same kind.
def _called(number: int, city: str) -> ChatCompletionMessageParam:
    arguments = json.dumps({"city": city, "unit": "celsius"})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call-{number}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": arguments},
            }
        ],
    }


FEW_SHOT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Weather in Paris?"},
    _called(1, "Paris"),
    {"role": "user", "content": "Weather in London?"},
    _called(2, "London"),
    {"role": "user", "content": "Weather in Rome?"},
]


def test_auto_reads_the_models_own_calls_with_the_hermes_parser(hermes: RunningServer) -> None:
    api = client(hermes)
    whole = api.chat.completions.create(
        model=MODEL, messages=FEW_SHOT, tools=TOOLS, temperature=0, max_tokens=80
    )
    [choice] = whole.choices
    assert choice.finish_reason == "tool_calls", choice.message
    [call] = choice.message.tool_calls or []
    assert call.type == "function"
    assert call.function.name == "get_weather" and "Rome" in call.function.arguments
    assert not choice.message.content
    stream = api.chat.completions.create(
        model=MODEL, messages=FEW_SHOT, tools=TOOLS, temperature=0, max_tokens=80, stream=True
    )
    chunks = [c.choices[0] for c in stream if c.choices]
    pieces = [p for c in chunks for p in c.delta.tool_calls or []]
    assert pieces[0].id and pieces[0].function and pieces[0].function.name == "get_weather"
    arguments = "".join(p.function.arguments or "" for p in pieces if p.function)
    assert json.loads(arguments) == json.loads(call.function.arguments)
    assert chunks[-1].finish_reason == "tool_calls"
    assert not any(c.delta.content for c in chunks)


def test_auto_answers_plain_text_as_content(hermes: RunningServer) -> None:
    answer = client(hermes).chat.completions.create(
        model=MODEL,
        messages=ask("What is the capital of France?"),
        tools=TOOLS,
        tool_choice="auto",
        temperature=0,
        max_tokens=12,
    )
    [choice] = answer.choices
    assert "Paris" in (choice.message.content or "")
    assert not choice.message.tool_calls and choice.finish_reason in ("stop", "length")


def refusal(server: RunningServer, **body: Any) -> dict[str, Any]:
    request = {"model": MODEL, "messages": ask("Hi"), "max_tokens": 4, **body}
    answer = web.post(server.http + "/v1/chat/completions", json=request)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    return dict(error)


def test_bad_tools_and_choices_are_400_naming_the_field(server: RunningServer) -> None:
    unknown = refusal(
        server, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "fly"}}
    )
    assert unknown["param"] == "tool_choice.function.name" and "fly" in unknown["message"]
    odd = dict(WEATHER, properties={"city": {"type": "no-such-type"}})
    bad = [{"type": "function", "function": {"name": "get_weather", "parameters": odd}}]
    schema = refusal(server, tools=bad, tool_choice="required")
    assert schema["param"] == "tools[0].function.parameters"
    odd_tool = {"type": "function", "function": {"name": "odd", "parameters": odd}}
    both = [*TOOLS, odd_tool]
    named = refusal(
        server, tools=both, tool_choice={"type": "function", "function": {"name": "odd"}}
    )
    assert named["param"] == "tools[2].function.parameters"
    not_a_schema = [{"type": "function", "function": {"name": "f", "parameters": "object"}}]
    assert refusal(server, tools=not_a_schema)["param"] == "tools[0].function.parameters"
    assert refusal(server, tool_choice="required")["param"] == "tool_choice"


def codec_refusal(body: dict[str, Any]) -> GenerationError:
    with pytest.raises(GenerationError) as refused:
        decode_chat(json.dumps({"messages": ask("Hi"), **body}).encode(), 2048)
    return refused.value


def test_the_decoder_names_what_is_wrong() -> None:
    bad_name = [{"type": "function", "function": {"name": "no spaces"}}]
    assert codec_refusal({"tools": bad_name}).field == "$.tools[0].function.name"
    twice = [TOOLS[0], TOOLS[0]]
    assert codec_refusal({"tools": twice}).field == "tools[1].function.name"
    assert codec_refusal({"tools": []}).field == "$.tools"
    assert codec_refusal({"tool_choice": "sometimes", "tools": TOOLS}).field == "$.tool_choice"
    assert codec_refusal(
        {"tools": TOOLS, "tool_choice": NAMED | {"function": {"name": "x"}}}
    ).field == ("tool_choice.function.name")
    tool_without_id = [*ask("Hi"), {"role": "tool", "content": "18 degrees"}]
    refused = codec_refusal({"messages": tool_without_id})
    assert refused.field == "messages[1].tool_call_id"


def test_a_conversation_with_calls_reaches_the_template_as_transformers_expects() -> None:
    body = {"messages": FEW_SHOT, "tools": TOOLS, "tool_choice": "none"}
    call = decode_chat(json.dumps(body).encode(), 2048)
    [request] = call.requests
    assert request.tools is not None and request.tools[0]["function"]["name"] == "get_weather"
    assert request.messages is not None
    assistant = request.messages[1]
    assert assistant["content"] == ""
    assert assistant["tool_calls"][0]["function"]["arguments"] == {
        "city": "Paris",
        "unit": "celsius",
    }
    result = {"role": "tool", "tool_call_id": "call-1", "content": "18 degrees"}
    answered = decode_chat(json.dumps({"messages": [*FEW_SHOT[:2], result]}).encode(), 2048)
    [with_result] = answered.requests
    assert with_result.messages is not None
    assert with_result.messages[2] == {
        "role": "tool",
        "content": "18 degrees",
        "tool_call_id": "call-1",
    }
    assert call.tool_use is not None and call.tool_use.choice == "none"
    assert request.options.json_schema is None  # none: nothing constrained


def test_lmi_chat_schema_streams_tool_calls_as_json_lines(server: RunningServer) -> None:
    body = {
        "messages": ask("Weather in Oslo?"),
        "tools": TOOLS,
        "tool_choice": NAMED,
        "stream": True,
        "max_tokens": 300,
        "temperature": 0,
    }
    with web.stream("POST", server.http + "/invocations", json=body) as answer:
        assert answer.headers["content-type"].startswith("application/jsonlines")
        chunks = [json.loads(line) for line in answer.iter_lines() if line]
    pieces = [p for c in chunks for p in c["choices"][0]["delta"].get("tool_calls", [])]
    assert pieces[0]["function"]["name"] == "get_weather" and pieces[0]["id"]
    arguments = "".join(p["function"].get("arguments", "") for p in pieces)
    jsonschema.validate(json.loads(arguments), WEATHER)


def decode_chat_tools(choice: str) -> Any:
    body = {"model": MODEL, "messages": ask("Hi"), "tools": TOOLS, "tool_choice": choice}
    return decode_chat(json.dumps(body).encode(), 2048).tool_use


def test_lmis_names_set_the_tool_settings_and_bad_ones_stop_start_up() -> None:
    from gateway.config.settings import ConfigError
    from gateway.engine.chat_template import configured_chat_template
    from gateway.engine.tool_calls import ToolParsing
    from serving import gateway_settings

    lmi = gateway_settings(
        OPTION_ENABLE_AUTO_TOOL_CHOICE="true",
        OPTION_TOOL_CALL_PARSER="hermes",
        OPTION_CHAT_TEMPLATE=str(TEMPLATE),
    )
    assert lmi.enable_auto_tool_choice and lmi.tool_call_parser == "hermes"
    assert configured_chat_template(lmi.chat_template) == TEMPLATE.read_text()
    assert ToolParsing.configured(lmi).auto is not None
    # the default model's parser with no settings; none for a template of one's own
    assert ToolParsing.configured(gateway_settings()).parser_name == "hermes"
    assert ToolParsing.configured(gateway_settings(CHAT_TEMPLATE=str(TEMPLATE))).auto is None
    off = ToolParsing.configured(gateway_settings(OPTION_ENABLE_AUTO_TOOL_CHOICE="false"))
    with pytest.raises(GenerationError) as refused:  # before the engine is asked anything
        off.calling(decode_chat_tools("auto"), engine=None)
    assert refused.value.field == "tool_choice" and "ENABLE_AUTO_TOOL_CHOICE" in str(refused.value)
    with pytest.raises(ConfigError, match="TOOL_CALL_PARSER=nope"):
        ToolParsing.configured(
            gateway_settings(ENABLE_AUTO_TOOL_CHOICE="true", TOOL_CALL_PARSER="nope")
        )
    with pytest.raises(ConfigError, match="CHAT_TEMPLATE"):
        configured_chat_template("/no/such/template.jinja")
