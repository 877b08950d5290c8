"""What Claude Code and Codex CLI send that other clients do not, decoded without an engine
(issue 58): Anthropic's deferred tools and `tool_reference` blocks, the Responses API's
`namespace` tools, OpenAI's built-in tools (accepted, never shown to the model), `reasoning`
items sent back, and a namespaced function's call naming its namespace."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from agent_bodies import CLAUDE_CODE, CODEX, Recorded, recorded

from protocols.anthropic_requests import decode_count_tokens, decode_messages
from protocols.errors import GenerationError
from protocols.events import Finished, GeneratedSequence, History, token_array
from protocols.responses_answers import outcome_of
from protocols.responses_requests import decode_responses
from protocols.tool_calls import CalledFunction, ParsedDelta, ParsedMessage, ToolCall

SCHEMA: dict[str, Any] = {"type": "object", "properties": {"q": {"type": "string"}}}
READ = {"name": "Read", "description": "Reads a file", "input_schema": SCHEMA}
SEARCH = {"name": "ToolSearch", "description": "Finds deferred tools", "input_schema": SCHEMA}
CRON = {"name": "CronCreate", "description": "Schedules", "input_schema": SCHEMA}
DEFERRED = {**CRON, "defer_loading": True, "cache_control": {"type": "ephemeral"}}


def _messages(**fields: Any) -> bytes:
    base: dict[str, Any] = {"model": "m", "max_tokens": 8, "messages": [_user("hi")]}
    return msgspec.json.encode({**base, **fields})


def _user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def _tool_names(raw: bytes) -> list[str]:
    tool_use = decode_messages(raw).tool_use
    return [t["function"]["name"] for t in tool_use.tools] if tool_use else []


def _refused(decode: Any, raw: bytes) -> GenerationError:
    with pytest.raises(GenerationError) as caught:
        decode(raw)
    return caught.value


def _searched(*references: str) -> list[dict[str, Any]]:
    """A turn that ran the tool search, and its result: `tool_reference` blocks."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {"q": "cron"}}
    content = [{"type": "tool_reference", "tool_name": name} for name in references]
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": content}
    return [_user("schedule it"), {"role": "assistant", "content": [call]}, _user([result])]


def test_a_deferred_tool_stays_out_of_the_prompt_until_a_tool_reference_names_it() -> None:
    tools = [READ, SEARCH, DEFERRED]
    assert _tool_names(_messages(tools=tools)) == ["Read", "ToolSearch"]
    loaded = _messages(tools=tools, messages=_searched("CronCreate"))
    assert _tool_names(loaded) == ["Read", "ToolSearch", "CronCreate"]
    [*_, result] = decode_messages(loaded).requests[0].messages or ()
    assert result == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": "Tool loaded: CronCreate",
    }
    counted = decode_count_tokens(loaded).tool_use
    assert counted is not None and len(counted.tools) == 3
    # tool_choice naming a deferred tool loads it
    named = _messages(tools=tools, tool_choice={"type": "tool", "name": "CronCreate"})
    assert _tool_names(named) == ["Read", "ToolSearch", "CronCreate"]


def test_only_deferred_tools_none_referenced_is_a_request_without_tools() -> None:
    assert decode_messages(_messages(tools=[DEFERRED])).tool_use is None
    refused = _refused(decode_messages, _messages(tools=[DEFERRED], tool_choice={"type": "any"}))
    assert refused.field == "tool_choice.type"


def test_a_tool_reference_to_a_tool_not_declared_is_refused_where_it_is() -> None:
    refused = _refused(decode_messages, _messages(tools=[SEARCH], messages=_searched("Nope")))
    assert refused.field == "messages[2].content[0].content[0].tool_name"
    assert "'Nope'" in refused.message


def test_a_tool_results_other_blocks_are_refused_naming_them() -> None:
    messages = _searched("CronCreate")
    messages[2]["content"][0]["content"] = [{"type": "image", "source": {}}]
    refused = _refused(decode_messages, _messages(tools=[SEARCH, DEFERRED], messages=messages))
    assert refused.field == "messages[2].content[0].content[0].type"
    messages[2]["content"][0]["content"] = [{"type": "tool_reference"}]
    refused = _refused(decode_messages, _messages(tools=[SEARCH, DEFERRED], messages=messages))
    assert refused.field == "messages[2].content[0].content[0].tool_name"


def _responses(**fields: Any) -> bytes:
    return msgspec.json.encode({"model": "m", "input": "hi", **fields})


def _function(name: str) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": {"type": "object"}, "strict": False}


NAMESPACE = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Sub-agents",
    "tools": [_function("spawn_agent"), _function("close_agent")],
}


def test_a_namespace_tools_functions_are_the_models_and_name_their_namespace() -> None:
    tools = [_function("exec_command"), NAMESPACE, {"type": "web_search"}]
    call = decode_responses(_responses(tools=tools), 2048)
    assert call.tool_use is not None
    names = [t["function"]["name"] for t in call.tool_use.tools]
    assert names == ["exec_command", "spawn_agent", "close_agent"]
    assert call.namespaces == {"spawn_agent": "multi_agent_v1", "close_agent": "multi_agent_v1"}
    assert call.echo["tools"] == tools  # echoed as given
    refused = _refused(
        lambda raw: decode_responses(raw, 2048),
        _responses(tools=[{**NAMESPACE, "tools": [{"type": "custom", "name": "x"}]}]),
    )
    assert refused.field == "tools[0].tools[0].type"
    twice = _responses(tools=[_function("spawn_agent"), NAMESPACE])
    assert _refused(lambda raw: decode_responses(raw, 2048), twice).field is not None


class Spawns:
    """Tool answers that read every text as one call of the namespace's `spawn_agent`."""

    def message(self, index: int, text: str, finish_reason: str) -> ParsedMessage:
        call = ToolCall(id="call_1", function=CalledFunction("spawn_agent", "{}"))
        return ParsedMessage(None, [call], "tool_calls")

    def delta(
        self, index: int, text: str, token_ids: list[int], finish_reason: str | None
    ) -> ParsedDelta:
        raise NotImplementedError


def test_a_call_of_a_namespaces_function_names_the_namespace() -> None:
    done = Finished(0, History(token_array([1]), "x"), [GeneratedSequence("x", 1, "stop")], 1, 0)
    [item] = outcome_of(done, "msg_1", Spawns(), {"spawn_agent": "multi_agent_v1"}).output
    assert (item["name"], item["namespace"]) == ("spawn_agent", "multi_agent_v1")
    [plain] = outcome_of(done, "msg_1", Spawns()).output
    assert "namespace" not in plain
    # sent back as history, the namespace is kept on the item
    sent = {"type": "function_call", "call_id": "c1", "name": "spawn_agent", "arguments": "{}"}
    back = decode_responses(_responses(input=[{**sent, "namespace": "multi_agent_v1"}]), 2048)
    assert back.items[0]["namespace"] == "multi_agent_v1"


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "web_search", "external_web_access": False},
        {"type": "web_search_preview"},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {"type": "image_generation"},
        {"type": "mcp", "server_label": "x", "server_url": "http://127.0.0.1:1"},
        {"type": "local_shell"},
        {"type": "shell"},
        {"type": "apply_patch"},
        {"type": "computer_use_preview", "display_width": 1, "display_height": 1},
    ],
    ids=lambda tool: str(tool["type"]),
)
def test_built_in_tools_are_accepted_and_never_shown_to_the_model(tool: dict[str, Any]) -> None:
    call = decode_responses(_responses(tools=[tool]), 2048)
    assert call.tool_use is None and call.request.tools is None
    assert call.echo["tools"] == [tool] and call.echo["tool_choice"] == "auto"
    with_function = decode_responses(_responses(tools=[tool, _function("f")]), 2048)
    assert with_function.tool_use is not None and len(with_function.tool_use.tools) == 1


def test_reasoning_items_sent_back_are_not_shown_to_the_model() -> None:
    given = [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"},
        {"role": "user", "content": "hi"},
    ]
    call = decode_responses(_responses(input=given), 2048)
    assert call.messages == ({"role": "user", "content": "hi"},)


@pytest.mark.parametrize("request_", recorded(CLAUDE_CODE), ids=lambda r: r.name)
def test_claude_codes_recorded_requests_decode(request_: Recorded) -> None:
    if request_.path.startswith("/v1/messages/count_tokens"):
        decode_count_tokens(request_.raw)
        return
    call = decode_messages(request_.raw)
    deferred = {t["name"] for t in request_.body.get("tools", []) if t.get("defer_loading")}
    shown = {t["function"]["name"] for t in call.tool_use.tools} if call.tool_use else set()
    assert not deferred & shown  # none of them referenced in a first turn


@pytest.mark.parametrize("request_", recorded(CODEX), ids=lambda r: r.name)
def test_codexs_recorded_requests_decode(request_: Recorded) -> None:
    call = decode_responses(request_.raw, 32768)
    assert call.tool_use is not None
    shown = {t["function"]["name"] for t in call.tool_use.tools}
    namespaced = [t for t in request_.body["tools"] if t["type"] == "namespace"]
    for namespace in namespaced:  # the default's `multi_agent_v1`
        assert {f["name"] for f in namespace["tools"]} <= shown
        assert set(call.namespaces.values()) == {namespace["name"]}
    assert bool(namespaced) == request_.name.endswith("default")
    assert "web_search" in {t["type"] for t in request_.body["tools"]}
