"""Ollama's codecs (protocols/ollama_*.py), without an engine: requests decoded to the neutral
vocabulary (options, format, tools, context, the load-only requests), every refusal naming its
field in Ollama's `{"error"}` shape, and every answer validated by the `ollama` client's own
response types."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from ollama import (
    ChatResponse,
    EmbedResponse,
    GenerateResponse,
    ListResponse,
    ProcessResponse,
    ShowResponse,
)

from protocols import ollama_models
from protocols.embedding import Embeddings
from protocols.errors import ErrorKind, GenerationError
from protocols.events import Delta, Finished, GeneratedSequence, History, token_array
from protocols.ollama_answers import OllamaEncoder, error_of, residency_answer
from protocols.ollama_requests import decode_chat, decode_generate, keep_alive_seconds
from protocols.tool_calls import (
    CalledFunction,
    FunctionDelta,
    ParsedDelta,
    ParsedMessage,
    ToolCall,
    ToolCallDelta,
)

CONTEXT = 2048
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _chat(**fields: Any) -> bytes:
    base: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return msgspec.json.encode({**base, **fields})


def _generate(**fields: Any) -> bytes:
    return msgspec.json.encode({"model": "m", "prompt": "hi", **fields})


def _refused(raw: bytes, field: str, *, generate: bool = False) -> GenerationError:
    with pytest.raises(GenerationError) as caught:
        (decode_generate if generate else decode_chat)(raw, CONTEXT)
    assert caught.value.field == field, caught.value
    status, body = error_of(caught.value)
    assert status == 400 and set(json.loads(body)) == {"error"}
    return caught.value


def test_a_chat_streams_by_default_with_ollamas_sampling_defaults() -> None:
    decoded = decode_chat(_chat(model="smol:latest"), CONTEXT)
    assert decoded.model == "smol" and decoded.call.stream and not decoded.load_only
    [request] = decoded.call.requests
    assert request.messages == ({"role": "user", "content": "hi"},)
    options = request.options
    assert (options.temperature, options.top_k, options.top_p) == (0.8, 40, 0.9)
    assert options.repetition_penalty == 1.1 and options.max_new_tokens == CONTEXT


def test_options_map_onto_the_sampling_options() -> None:
    given = {
        "num_predict": 12,
        "temperature": 0,
        "top_p": 0.5,
        "top_k": 0,
        "min_p": 0.1,
        "typical_p": 0.7,
        "repeat_penalty": 1.3,
        "presence_penalty": 0.2,
        "frequency_penalty": 0.4,
        "seed": 7,
        "stop": ["\n\n"],
        "num_ctx": 1024,
        "num_gpu": 99,  # nothing for vLLM to do with it: accepted
    }
    [request] = decode_chat(_chat(options=given, stream=False), CONTEXT).call.requests
    options = request.options
    assert options.max_new_tokens == 12 and not options.do_sample
    assert (options.top_p, options.top_k, options.min_p, options.typical_p) == (0.5, -1, 0.1, 0.7)
    assert (options.repetition_penalty, options.presence_penalty) == (1.3, 0.2)
    assert (options.frequency_penalty, options.seed, options.stop) == (0.4, 7, ("\n\n",))
    assert request.stream  # the engine streams, so the answer times its prompt apart


def test_num_ctx_past_the_models_context_is_refused() -> None:
    error = _refused(_chat(options={"num_ctx": CONTEXT + 1}), "options.num_ctx")
    assert str(CONTEXT) in error.message


def test_format_json_and_a_schema_are_constraints_named_format() -> None:
    [request] = decode_chat(_chat(format="json"), CONTEXT).call.requests
    assert request.options.json_schema == '{"type": "object"}'
    assert request.constraint_field == "format"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    [request] = decode_chat(_chat(format=schema), CONTEXT).call.requests
    assert request.options.json_schema is not None
    assert json.loads(request.options.json_schema) == schema
    _refused(_chat(format="yaml"), "format")


def test_tools_and_an_earlier_call_become_the_chat_templates() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "Sunny", "tool_name": "weather"},
    ]
    decoded = decode_chat(_chat(messages=messages, tools=[WEATHER]), CONTEXT)
    assert decoded.call.tool_use is not None and decoded.call.tool_use.choice == "auto"
    [request] = decoded.call.requests
    assert request.tools is not None and request.tools[0]["function"]["name"] == "weather"
    assert request.messages is not None
    call = request.messages[1]["tool_calls"][0]
    assert call["function"] == {"name": "weather", "arguments": {"city": "Paris"}}
    assert request.messages[2]["role"] == "tool" and request.messages[2]["name"] == "weather"


def test_images_think_and_logprobs_are_refused_naming_the_field() -> None:
    image = [{"role": "user", "content": "What is this?", "images": ["aGk="]}]
    assert "images" in _refused(_chat(messages=image), "messages[0].images").message
    _refused(_chat(think=True), "think")
    _refused(_chat(think="high"), "think")
    decode_chat(_chat(think=False), CONTEXT)  # not thinking is what it does
    _refused(_chat(logprobs=True), "logprobs")
    _refused(_generate(images=["aGk="]), "images", generate=True)
    _refused(_generate(suffix="end"), "suffix", generate=True)
    _refused(_generate(template="{{ .Prompt }}"), "template", generate=True)


def test_a_body_not_json_and_a_bad_option_are_refused() -> None:
    with pytest.raises(GenerationError) as caught:
        decode_chat(b"{not json", CONTEXT)
    assert error_of(caught.value)[0] == 400
    _refused(_chat(options={"temperature": "hot"}), "$.options.temperature")


def test_no_messages_or_no_prompt_only_loads() -> None:
    assert decode_chat(_chat(messages=[]), CONTEXT).load_only
    assert decode_chat(msgspec.json.encode({"model": "m"}), CONTEXT).load_only
    unload = decode_generate(msgspec.json.encode({"model": "m", "keep_alive": 0}), CONTEXT)
    assert unload.ollama.load_only and unload.ollama.keep_alive == 0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(300, 300.0), ("5m", 300.0), ("1h30m", 5400.0), ("90s", 90.0), (-1, -1.0), ("-1m", -1.0)],
)
def test_keep_alive_is_ollamas_duration(value: float | str, seconds: float) -> None:
    assert keep_alive_seconds(value) == seconds


def test_a_keep_alive_not_a_duration_is_refused() -> None:
    _refused(_chat(keep_alive="soon"), "keep_alive")


def test_generate_renders_its_system_and_prompt_or_sends_it_raw() -> None:
    decoded = decode_generate(_generate(system="Be brief."), CONTEXT)
    [request] = decoded.ollama.call.requests
    assert request.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    )
    raw = decode_generate(_generate(raw=True, system="ignored"), CONTEXT)
    [request] = raw.ollama.call.requests
    assert request.messages is None and request.prompt == "hi" and raw.system is None
    continued = decode_generate(_generate(context=[1, 2, 3]), CONTEXT)
    assert continued.context == [1, 2, 3] and continued.text == "hi"


def _finished(text: str, reason: str = "stop", ids: tuple[int, ...] = (5, 6, 7)) -> Finished:
    history = History(token_array([1, 2, *ids]), "ab" + text)
    sequence = GeneratedSequence(text, len(ids), reason)
    return Finished(0, history, [sequence], prompt_tokens=2, execution_time=0.5)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_whole_generate_carries_its_context_and_its_durations() -> None:
    clock = _Clock()
    encoder = OllamaEncoder("generate", "smol", clock=clock)
    clock.now = 100.75  # 0.25 s before the engine took the prompt
    encoder.saw(Delta(0, "x", [5]))
    clock.now = 101.0
    answer = GenerateResponse.model_validate_json(encoder.document(_finished("xyz")))
    assert answer.response == "xyz" and answer.done and answer.done_reason == "stop"
    assert answer.context == [1, 2, 5, 6, 7]
    assert (answer.prompt_eval_count, answer.eval_count) == (2, 3)
    assert answer.total_duration == 1_000_000_000
    assert answer.load_duration == 500_000_000
    assert answer.prompt_eval_duration == 250_000_000
    assert answer.eval_duration == 250_000_000


def test_a_streamed_chat_is_ndjson_lines_the_last_done() -> None:
    encoder = OllamaEncoder("chat", "smol")
    body = (
        encoder.opening() + encoder.chunk(Delta(0, "Hel", [1])) + encoder.chunk(Delta(0, "lo", [2]))
    )
    body += encoder.closing(_finished("Hello", "length"))
    lines = [ChatResponse.model_validate_json(line) for line in body.splitlines()]
    assert "".join(line.message.content or "" for line in lines) == "Hello"
    assert [line.done for line in lines] == [False, False, True]
    assert lines[-1].done_reason == "length" and lines[-1].eval_count == 3


class _Tools:
    def message(self, index: int, text: str, finish_reason: str) -> ParsedMessage:
        call = ToolCall(id="c1", function=CalledFunction("weather", '{"city": "Paris"}'))
        return ParsedMessage(None, [call], "tool_calls")

    def delta(
        self, index: int, text: str, token_ids: list[int], finish_reason: str | None
    ) -> ParsedDelta:
        if text == "<call>":
            piece = ToolCallDelta(0, id="c1", type="function", function=FunctionDelta("weather"))
            return ParsedDelta(tool_calls=[piece])
        if text == "args":
            piece = ToolCallDelta(0, function=FunctionDelta(arguments='{"city": "Paris"}'))
            return ParsedDelta(tool_calls=[piece])
        return ParsedDelta(content=text)


def test_tool_calls_come_whole_with_their_arguments_an_object() -> None:
    whole = OllamaEncoder("chat", "smol", _Tools()).document(_finished("<call>"))
    message = ChatResponse.model_validate_json(whole).message
    assert message.tool_calls is not None
    assert message.tool_calls[0].function.name == "weather"
    assert message.tool_calls[0].function.arguments == {"city": "Paris"}
    encoder = OllamaEncoder("chat", "smol", _Tools())
    body = encoder.chunk(Delta(0, "<call>", [1])) + encoder.chunk(Delta(0, "args", [2]))
    body += encoder.closing(_finished("<call>args"))
    lines = [ChatResponse.model_validate_json(line) for line in body.splitlines()]
    [calls] = [line.message.tool_calls for line in lines if line.message.tool_calls]
    assert calls[0].function.arguments == {"city": "Paris"} and lines[-1].done


def test_an_error_is_ollamas_shape_before_and_after_the_stream_began() -> None:
    error = GenerationError(ErrorKind.ENGINE_UNAVAILABLE, "busy")
    status, body = error_of(error)
    assert status == 503 and json.loads(body) == {"error": "busy"}
    line = OllamaEncoder("chat", "smol").failure(error)
    assert line.endswith(b"\n") and json.loads(line) == {"error": "busy"}


def test_the_load_and_unload_answers() -> None:
    loaded = ChatResponse.model_validate_json(residency_answer("chat", "smol", "load"))
    assert loaded.done and loaded.done_reason == "load" and loaded.message.content == ""
    unloaded = GenerateResponse.model_validate_json(residency_answer("generate", "s", "unload"))
    assert unloaded.done_reason == "unload" and unloaded.response == ""


def test_the_model_listings_are_the_clients_types() -> None:
    details = ollama_models.details(dtype="float32")
    listed = ollama_models.OllamaListed("smol", "smol", "2025-01-01T00:00:00Z", 1, "d", details)
    tags = ListResponse.model_validate_json(
        ollama_models.encode(ollama_models.OllamaTags([listed]))
    )
    assert tags.models[0].model == "smol"
    running = ollama_models.OllamaRunning(
        "smol", "smol", 1, "d", details, "2318-01-01T00:00:00Z", 0, 2048
    )
    ps = ProcessResponse.model_validate_json(
        ollama_models.encode(ollama_models.OllamaPs([running]))
    )
    assert ps.models[0].context_length == 2048
    shown = ollama_models.OllamaShown(
        modelfile="",
        parameters="num_ctx 2048",
        template="",
        details=details,
        model_info={"general.context_length": 2048},
        capabilities=["completion", "tools"],
        modified_at="2025-01-01T00:00:00Z",
    )
    show = ShowResponse.model_validate_json(ollama_models.encode(shown))
    assert show.capabilities == ["completion", "tools"] and show.modelinfo is not None


def test_embed_takes_a_string_or_strings_and_truncates_unless_told() -> None:
    one = ollama_models.decode_embed(
        msgspec.json.encode({"model": "e:latest", "input": "hi"}), dimensions_supported=False
    )
    assert one.model == "e" and [i.text for i in one.inputs] == ["hi"] and one.truncate
    many = ollama_models.decode_embed(
        msgspec.json.encode({"model": "e", "input": ["a", "b"], "truncate": False}),
        dimensions_supported=False,
    )
    assert [i.field for i in many.inputs] == ["input[0]", "input[1]"] and not many.truncate
    with pytest.raises(GenerationError) as caught:
        ollama_models.decode_embed(
            msgspec.json.encode({"model": "e", "input": "a", "dimensions": 8}),
            dimensions_supported=False,
        )
    assert caught.value.field == "dimensions"
    answer = ollama_models.encode_embedded("e", Embeddings([[0.5, 0.25]], 3), 0.01)
    assert EmbedResponse.model_validate_json(answer).embeddings == [[0.5, 0.25]]


def test_pull_and_the_others_are_refused_saying_why() -> None:
    assert "downloaded" in ollama_models.unserved("pull")
    assert "MODELS_FILE" in ollama_models.unserved("create")
