"""Agent frameworks against the gateway with no settings (`make run`'s defaults), each exactly
as it calls an OpenAI-compatible server (docs/OPENAI.md, "Tool calls"): langchain's
`create_agent` with a tool and no `tool_choice`, openai-agents with a function tool over two
turns, pydantic-ai with a tool and an `output_type`, instructor in its TOOLS and JSON_SCHEMA
modes. Each completes its run, and every call the model made (all of them, read back from the
run's history) is a valid call of a declared tool: the grammar holds it, whatever the model."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import openai
import pydantic
import pytest

from serving import RunningServer

# Each library's import and agent loop take 15-30 s: make test-all (CI) runs them.
pytestmark = pytest.mark.long

MODEL = "SmolLM2-135M-Instruct"
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
QUESTION = "What is the weather in Paris?"


def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"18 degrees and sunny in {city}"


def assert_weather_call(name: str, arguments: Any) -> None:
    assert name == "get_weather", name
    jsonschema.validate(json.loads(arguments) if isinstance(arguments, str) else arguments, CITY)


def test_langchain_create_agent_with_a_tool_and_no_tool_choice(server: RunningServer) -> None:
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(
        model=MODEL,
        base_url=server.http + "/v1",
        api_key="unused",  # type: ignore[arg-type]
        temperature=0,
        max_tokens=120,  # type: ignore[call-arg]
        max_retries=0,
    )
    agent = create_agent(model, tools=[get_weather])
    result = agent.invoke({"messages": [{"role": "user", "content": QUESTION}]})
    messages = result["messages"]
    answers = [m for m in messages if isinstance(m, AIMessage)]
    for answer in answers:
        for call in answer.tool_calls:
            assert_weather_call(call["name"], call["args"])
    assert not answers[-1].tool_calls  # the run ended with an answer


def test_openai_agents_with_a_function_tool_over_two_turns(server: RunningServer) -> None:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)  # no traces sent to OpenAI
    api = openai.AsyncOpenAI(base_url=server.http + "/v1", api_key="unused", max_retries=0)
    agent = agents.Agent(
        name="Assistant",
        instructions="Answer in one short sentence; use the tool for the weather.",
        tools=[agents.function_tool(get_weather)],
        model=agents.OpenAIResponsesModel(model=MODEL, openai_client=api),
        model_settings=agents.ModelSettings(temperature=0, max_tokens=120),
    )

    async def two_turns() -> list[Any]:
        first = await agents.Runner.run(agent, QUESTION)
        follow = [*first.to_input_list(), {"role": "user", "content": "And in Rome?"}]
        second = await agents.Runner.run(agent, follow)
        return [first, second]

    for result in asyncio.run(two_turns()):
        assert isinstance(result.final_output, str)
        for item in result.new_items:
            if isinstance(item, agents.ToolCallItem):
                assert_weather_call(item.raw_item.name, item.raw_item.arguments)


class Forecast(pydantic.BaseModel):
    city: str
    summary: str


def test_pydantic_ai_with_a_tool_and_an_output_type(server: RunningServer) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, ToolCallPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=server.http + "/v1", api_key="unused")
    agent = Agent(
        OpenAIChatModel(MODEL, provider=provider),
        output_type=Forecast,
        tools=[get_weather],
        model_settings={"temperature": 0, "max_tokens": 200},
    )
    result = agent.run_sync(QUESTION)
    assert isinstance(result.output, Forecast)
    schemas = {"get_weather": CITY, "final_result": Forecast.model_json_schema()}
    for message in result.all_messages():
        if isinstance(message, ModelResponse):
            for part in message.parts:
                if isinstance(part, ToolCallPart):
                    assert part.tool_name in schemas
                    jsonschema.validate(part.args_as_dict(), schemas[part.tool_name])


class User(pydantic.BaseModel):
    name: str
    age: int


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_modes(server: RunningServer, mode: str) -> None:
    import instructor

    api = openai.OpenAI(base_url=server.http + "/v1", api_key="unused", max_retries=0)
    structured = instructor.from_openai(api, mode=instructor.Mode[mode])
    user = structured.chat.completions.create(
        model=MODEL,
        response_model=User,
        messages=[{"role": "user", "content": "John Doe is 30 years old."}],
        temperature=0,
        max_tokens=120,
        max_retries=0,
    )
    assert isinstance(user, User)
