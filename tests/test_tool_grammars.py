"""The grammars tool calls are held to (gateway/engine/tool_grammars.py), checked with xgrammar
on texts, and a streamed Responses answer's tool items (protocols/responses_tool_stream.py);
no engine."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
import xgrammar
from transformers import AutoTokenizer

from gateway.engine.default_model import default_model_dir
from gateway.engine.tool_grammars import MAX_PARALLEL_CALLS, auto_grammar, calls_grammar
from protocols.events import Delta
from protocols.responses_answers import EventStream, Outcome
from protocols.responses_tool_stream import ToolStream
from protocols.tool_calls import (
    FunctionDelta,
    ParsedDelta,
    ParsedMessage,
    ToolCallDelta,
)

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time"}},
]
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
JSON_CALL = '{"name":"get_weather","parameters":{"city":"Rome"}}'


@pytest.fixture(scope="module")
def compiler() -> xgrammar.GrammarCompiler:
    directory = default_model_dir()
    if not directory.is_dir():
        pytest.skip("the default model is not prepared")
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    return xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(tokenizer))


def accepts(compiler: xgrammar.GrammarCompiler, grammar: str, text: str) -> bool:
    """Whether `text` is a whole answer the grammar allows (it may end there)."""
    matcher = xgrammar.GrammarMatcher(compiler.compile_grammar(grammar))
    return bool(matcher.accept_string(text)) and matcher.is_completed()


@pytest.mark.parametrize("parallel", [True, False])
def test_hermes_auto_allows_text_or_declared_calls(
    compiler: xgrammar.GrammarCompiler, parallel: bool
) -> None:
    grammar = auto_grammar("hermes", json.dumps(TOOLS), parallel)
    assert accepts(compiler, grammar, "Rome is sunny today.")
    assert accepts(compiler, grammar, "Let me look. " + HERMES_CALL)
    assert not accepts(compiler, grammar, '<tool_call>\n{"name": "get_news", "arguments": {}}')
    assert not accepts(compiler, grammar, HERMES_CALL.replace('"city"', '"town"'))
    assert not accepts(compiler, grammar, HERMES_CALL + " and more text")
    two = HERMES_CALL + "\n" + HERMES_CALL
    assert accepts(compiler, grammar, two) is parallel
    most = "\n".join([HERMES_CALL] * MAX_PARALLEL_CALLS)
    assert accepts(compiler, grammar, most) is parallel
    assert not accepts(compiler, grammar, most + "\n" + HERMES_CALL)


def test_own_auto_allows_text_or_required_calls(compiler: xgrammar.GrammarCompiler) -> None:
    grammar = auto_grammar(None, json.dumps(TOOLS), True)
    assert accepts(compiler, grammar, "Rome is sunny today.")
    assert accepts(compiler, grammar, "")
    assert accepts(compiler, grammar, f"[{JSON_CALL}]")
    assert not accepts(compiler, grammar, "[not a call]")
    assert not accepts(compiler, grammar, '[{"name":"get_news","parameters":{}}]')


def test_required_ends_after_the_most_parallel_calls(compiler: xgrammar.GrammarCompiler) -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    def request(parallel: bool) -> Any:
        body = {"messages": [], "tools": TOOLS, "tool_choice": "required"}
        return ChatCompletionRequest.model_validate({**body, "parallel_tool_calls": parallel})

    many = ",".join([JSON_CALL] * MAX_PARALLEL_CALLS)
    assert accepts(compiler, calls_grammar(request(True)), f"[{many}]")
    assert not accepts(compiler, calls_grammar(request(True)), f"[{many},{JSON_CALL}]")
    assert not accepts(compiler, calls_grammar(request(False)), f"[{JSON_CALL},{JSON_CALL}]")


class _Steps:
    """ToolAnswers reading a call out of three steps."""

    def __init__(self) -> None:
        self.steps = [
            ParsedDelta("Let me look.", None),
            ParsedDelta(
                None,
                [ToolCallDelta(0, "call-1", "function", FunctionDelta("get_weather", '{"city"'))],
            ),
            ParsedDelta(None, [ToolCallDelta(0, function=FunctionDelta(arguments=': "Rome"}'))]),
        ]

    def message(self, index: int, text: str, finish_reason: str) -> ParsedMessage:
        raise AssertionError("not read whole")

    def delta(
        self, index: int, text: str, token_ids: list[int], finish_reason: str | None
    ) -> ParsedDelta:
        return self.steps.pop(0)


def test_a_streamed_responses_call_sends_its_arguments_as_they_come() -> None:
    stream = ToolStream(_Steps(), "msg_1")
    events = EventStream()
    sent = b"".join(stream.step(Delta(0, "x", [1]), events) for _ in range(3))
    kinds = [line[7:] for line in sent.decode().splitlines() if line.startswith("event: ")]
    assert kinds == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
    ]
    read = {
        "type": "function_call",
        "id": "fc_whole",
        "call_id": "call-whole",
        "name": "get_weather",
        "arguments": '{"city": "Rome"}',
        "status": "completed",
    }
    text = {"type": "message", "id": "msg_1", "content": []}
    history = {"role": "assistant", "content": "", "tool_calls": [{"id": "call-whole"}]}
    settled = stream.settled(Outcome([text, read], history, "completed", None))
    [message, call] = settled.output
    assert message is text and call["call_id"] == "call-1" and call["id"] != "fc_whole"
    assert call["arguments"] == '{"city": "Rome"}'
    assert settled.message["tool_calls"][0]["id"] == "call-1"
    done = stream.arguments_done(1, call, events)
    assert b"response.function_call_arguments.done" in done
    assert msgspec.json.decode(done.split(b"data: ")[1])["arguments"] == call["arguments"]
