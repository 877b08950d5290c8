"""OpenAI's API with the official `openai` client (sync and async) and `huggingface_hub`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jsonschema  # type: ignore[import-untyped]
import openai
import pytest
from huggingface_hub import InferenceClient
from openai import AsyncStream
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam

from clients import CHAT, CITY_SCHEMA, UNENDING, wait_ready, web
from serving import (
    LoopThread,
    RunningServer,
    failing_loader,
    gateway_settings,
    start_server,
)

if TYPE_CHECKING:
    from gateway.engine.vllm_engine import VllmEngine

MODEL = "SmolLM2-135M-Instruct"
QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France?"}
]


def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.http + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(server: RunningServer) -> None:
    [model] = client(server).models.list().data
    assert model.id == MODEL


def greedy_answer(server: RunningServer) -> Any:
    return client(server).chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        temperature=0,
        max_tokens=12,
    )


def test_chat_completion_answers_with_the_chat_template_and_usage(server: RunningServer) -> None:
    answer = greedy_answer(server)
    [choice] = answer.choices
    assert "Paris" in (choice.message.content or "") and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert answer.usage is not None and answer.usage.completion_tokens <= 12
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    text = "What is the capital of France?"
    parts: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": [{"type": "text", "text": text}]}
    ]
    same = client(server).chat.completions.create(
        model=MODEL,
        messages=parts,
        temperature=0,
        max_completion_tokens=12,
    )
    assert same.choices[0].message.content == choice.message.content


def test_chat_streams_chunks_then_usage_then_done(server: RunningServer) -> None:
    whole = greedy_answer(server)
    stream = client(server).chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        temperature=0,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_n_choices_and_logprobs(server: RunningServer) -> None:
    answer = client(server).chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        n=2,
        temperature=1.0,
        seed=3,
        max_tokens=6,
        logprobs=True,
        top_logprobs=2,
    )
    assert [c.index for c in answer.choices] == [0, 1]
    for choice in answer.choices:
        assert choice.logprobs is not None and choice.logprobs.content
        for token in choice.logprobs.content:
            assert len(token.top_logprobs) == 2 and token.logprob <= 0
    assert answer.usage is not None
    assert answer.usage.completion_tokens == sum(
        len(c.logprobs.content) for c in answer.choices if c.logprobs and c.logprobs.content
    )


def test_completions_whole_and_streamed(server: RunningServer) -> None:
    prompt = CHAT.format("Name a color.")
    whole = client(server).completions.create(
        model=MODEL, prompt=prompt, temperature=0, max_tokens=8, logprobs=1
    )
    [choice] = whole.choices
    assert choice.text and choice.logprobs is not None
    assert "".join(choice.logprobs.tokens or []) == choice.text
    streamed = client(server).completions.create(
        model=MODEL, prompt=prompt, temperature=0, max_tokens=8, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == choice.text
    two = client(server).completions.create(
        model=MODEL, prompt=[prompt, prompt], temperature=0, max_tokens=8
    )
    assert [c.text for c in two.choices] == [choice.text, choice.text]


def test_the_async_client_streams_concurrently(
    server: RunningServer, engine_requests: Callable[[], int], idle_engine: Callable[[], None]
) -> None:
    """Four streams that cannot end by themselves: each streams a token while the engine runs
    all four. A server taking them one at a time would hold one, and the next would wait for
    its end (2,048 tokens, then a count of one)."""

    async def first_token(api: openai.AsyncOpenAI, n: int) -> tuple[AsyncStream[Any], str]:
        stream = await api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Count to {n}."}],
            temperature=0,
            max_tokens=UNENDING,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                return stream, chunk.choices[0].delta.content
        raise AssertionError(f"stream {n} ended before its first token")

    async def main() -> tuple[list[str], int]:
        api = openai.AsyncOpenAI(base_url=server.http + "/v1", api_key="unused", max_retries=0)
        opened = await asyncio.gather(*(first_token(api, n) for n in range(3, 7)))
        running = engine_requests()  # none can have ended: every one is still streaming
        for stream, _ in opened:
            await stream.close()
        await api.close()
        return [token for _, token in opened], running

    idle_engine()  # the engine's count is this test's four alone
    tokens, running = asyncio.run(main())
    assert all(tokens) and running == 4, (tokens, running)
    idle_engine()  # closing each stream stopped its generation


def test_errors_in_openais_shape_and_status(server: RunningServer) -> None:
    api = client(server)
    with pytest.raises(openai.BadRequestError) as bad:
        api.chat.completions.create(model=MODEL, messages=QUESTION, temperature=5)
    assert bad.value.status_code == 400 and "temperature" in str(bad.value)
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="gpt-9", messages=QUESTION)
    with pytest.raises(openai.BadRequestError) as long:
        api.completions.create(model=MODEL, prompt="word " * 3000, max_tokens=4)
    assert long.value.code == "context_length_exceeded"
    assert (
        "This model's maximum context length is 2048 tokens. However, your prompt is too long"
        in long.value.message
    )
    tools: list[ChatCompletionFunctionToolParam] = [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    # tool_choice auto, the default with tools: served with no settings (tests/test_tool_auto.py)
    auto = api.chat.completions.create(model=MODEL, messages=QUESTION, tools=tools, max_tokens=8)
    assert all(c.function.name == "f" for c in auto.choices[0].message.tool_calls or [])  # type: ignore[union-attr]


def test_litellm_and_langchain_recognise_a_prompt_over_the_context(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # else fetched when imported
    import litellm
    from langchain_core.exceptions import ContextOverflowError
    from langchain_openai import ChatOpenAI
    from litellm.exceptions import ContextWindowExceededError
    from pydantic import SecretStr

    long, base = "word " * 3000, server.http + "/v1"
    with pytest.raises(ContextWindowExceededError):
        litellm.completion(
            model=f"openai/{MODEL}",
            messages=[{"role": "user", "content": long}],
            api_base=base,
            api_key="unused",
            max_tokens=4,
        )
    with pytest.raises(ContextWindowExceededError):
        litellm.text_completion(
            model=f"hosted_vllm/{MODEL}", prompt=long, api_base=base, api_key="unused", max_tokens=4
        )
    chat = ChatOpenAI(model=MODEL, base_url=base, api_key=SecretStr("unused"), max_retries=0)
    with pytest.raises(ContextOverflowError):
        chat.invoke(long)


def test_huggingface_hub_chat_completion(server: RunningServer) -> None:
    hub = InferenceClient(base_url=server.http)
    question: list[dict[str, Any]] = [dict(m) for m in QUESTION]
    answer = hub.chat_completion(question, max_tokens=12, temperature=0)
    text = answer.choices[0].message.content
    assert text and "Paris" in text
    streamed = hub.chat_completion(question, max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text


def test_json_schema_output_parses_and_validates(server: RunningServer) -> None:
    schema = CITY_SCHEMA
    answer = client(server).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Give the capital of France as JSON."}],
        temperature=0,
        max_tokens=300,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "city", "schema": schema, "strict": True},
        },
    )
    assert answer.choices[0].finish_reason == "stop", answer.choices[0].message.content
    jsonschema.validate(json.loads(answer.choices[0].message.content or ""), schema)
    anything = client(server).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": 'Answer in JSON: {"capital": ...}. France?'}],
        temperature=0,
        max_tokens=100,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(anything.choices[0].message.content or ""), dict)


def test_every_turn_of_a_conversation_reads_its_history_from_the_prefix_cache(
    server: RunningServer,
) -> None:
    # Long enough that the history spans several KV blocks (128 tokens each on vLLM's CPU
    # backend): the engine caches whole blocks only.
    rules = " ".join(f"Rule {i}: answer briefly and politely, in plain English." for i in range(40))
    history: list[ChatCompletionMessageParam] = [{"role": "system", "content": rules}]
    shares = []
    for turn in range(5):  # each turn after the first: its history cached
        history.append({"role": "user", "content": f"Turn {turn}: name a colour."})
        answer = client(server).chat.completions.create(
            model=MODEL, messages=history, temperature=0, max_tokens=6
        )
        usage = answer.usage
        assert usage is not None and usage.prompt_tokens_details is not None
        shares.append((usage.prompt_tokens_details.cached_tokens or 0) / usage.prompt_tokens)
        history.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
    assert all(share > 0.5 for share in shares[1:]), shares


def test_a_schema_the_engine_cannot_hold_output_to_is_unprocessable(
    server: RunningServer,
) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client(server).chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            max_tokens=4,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "odd", "schema": {"type": "no-such-type"}},
            },
        )
    assert caught.value.status_code == 422
    # The gateway's refusal naming the field; the reason after it is the grammar backend's.
    error: Any = caught.value.body
    assert error["param"] == "response_format.json_schema.schema", error
    assert error["message"].startswith("The engine cannot hold output to this constraint: ")
    assert error["message"].endswith(" - at `response_format.json_schema.schema`"), error
    assert greedy_answer(server).choices[0].message.content  # the server still answers


FAULT = "Fail in the engine, please."  # fails once admitted (serving.failing_loader)


def test_overload_is_429_rate_limit(
    make_server: Callable[..., RunningServer], idle_engine: Callable[[], None]
) -> None:
    tight = client(make_server(MAX_RUNNING_REQUESTS="1", MAX_WAITING_REQUESTS="0"))
    busy = tight.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=1000,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    with busy:
        next(iter(busy))  # generating: the one slot is taken
        with pytest.raises(openai.RateLimitError) as refused:
            tight.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)
        assert refused.value.status_code == 429
    idle_engine()


def test_engine_failures_are_500_or_an_error_event_then_done(
    loop_thread: LoopThread, engine: VllmEngine, idle_engine: Callable[[], None]
) -> None:
    settings = gateway_settings(MAX_RUNNING_REQUESTS="1")  # the second prompt starts later
    failing = start_server(loop_thread, settings, failing_loader(engine, FAULT))
    try:
        wait_ready(failing.http)
        with pytest.raises(openai.InternalServerError) as before:
            client(failing).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": FAULT}], stream=True
            )
        assert before.value.status_code == 500
        body = {"prompt": ["Hello", FAULT], "max_tokens": 4, "stream": True}
        streamed = web.post(failing.http + "/v1/completions", json=body)
        assert streamed.status_code == 200
        events = [e.removeprefix("data: ") for e in streamed.text.split("\n\n") if e]
        assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["type"] == "server_error"
        assert any(json.loads(e).get("choices") for e in events[:-2])  # the first prompt streamed
    finally:
        failing.stop()
    idle_engine()


def test_an_engine_that_failed_to_start_is_503(loop_thread: LoopThread) -> None:
    async def no_engine() -> VllmEngine:
        raise RuntimeError("no model here")

    broken = start_server(loop_thread, gateway_settings(), no_engine)
    try:
        with pytest.raises(openai.InternalServerError) as unavailable:
            client(broken).chat.completions.create(model=MODEL, messages=QUESTION)
        assert unavailable.value.status_code == 503
        assert "no model here" in str(unavailable.value)
    finally:
        broken.stop()
