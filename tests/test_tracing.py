"""One OpenTelemetry trace per request on every protocol (issue 61): a server with tracing on
exports over OTLP/HTTP, with the real SDK, to a receiver on loopback (tests/otlp_receiver.py);
each request continues the caller's traceparent, and its spans say what the answer says."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import anthropic
import openai
import pytest
from control_client import config, control, until
from otlp_receiver import (
    ERROR,
    SERVER,
    Receiver,
    Span,
    children,
    one,
    receiving,
    traceparent,
    tracing_env,
)

from clients import (
    CHAT,
    CITY_SCHEMA,
    connect,
    events_of,
    frames_until_done,
    payload,
    wait_for,
    wait_ready,
    web,
)
from serving import (
    LoopThread,
    RunningServer,
    gateway_settings,
    loading_server,
    shared_loader,
    start_server,
)

if TYPE_CHECKING:
    from gateway.engine.vllm_engine import VllmEngine

MODEL = "SmolLM2-135M-Instruct"
KEY = "sk-trace-test-secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
ENGINE_PHASES = (
    "llm_gateway.engine.queue",
    "llm_gateway.engine.prefill",
    "llm_gateway.engine.decode",
)


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with receiving() as running:
        yield running


@pytest.fixture(scope="module")
def traced(
    loop_thread: LoopThread, engine: VllmEngine, receiver: Receiver
) -> Iterator[RunningServer]:
    settings = gateway_settings(API_KEYS=f"{KEY}:alice", **tracing_env(receiver))
    running = start_server(loop_thread, settings, shared_loader(engine))
    wait_ready(running.http)
    yield running
    running.stop()


def caller() -> tuple[dict[str, str], str, str]:
    """The headers of a caller in a trace of its own: (headers, trace id, its span id)."""
    header, trace_id, span_id = traceparent()
    return {**AUTH, "traceparent": header, "tracestate": "caller=1"}, trace_id, span_id


def server_span(spans: list[Span], parent_id: str) -> Span:
    [server] = [s for s in spans if s.kind == SERVER]
    assert server.parent_id == parent_id  # the caller's span
    assert KEY not in json.dumps([s.attributes for s in spans])  # its name only, never the key
    return server


def prompts(spans: list[Span], server: Span) -> list[Span]:
    return [s for s in children(spans, server) if s.name == "llm_gateway.generate"]


def assert_engine_path(spans: list[Span], prompt: Span) -> None:
    """The prompt's admission and the engine's phases, in order, within the prompt's span."""
    names = [s.name for s in sorted(children(spans, prompt), key=lambda s: s.start_ns)]
    assert names[0] == "llm_gateway.admission" and tuple(names[-3:]) == ENGINE_PHASES, names
    phases = [one(spans, name) for name in ENGINE_PHASES]
    assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(phases))
    assert prompt.start_ns <= phases[0].start_ns and phases[-1].end_ns <= prompt.end_ns
    assert one(spans, "llm_gateway.admission").attributes["llm_gateway.priority"] >= 0


def test_a_streamed_chat(traced: RunningServer, receiver: Receiver) -> None:
    headers, trace_id, caller_span = caller()
    oai = openai.OpenAI(base_url=traced.http + "/v1", api_key=KEY, max_retries=0)
    chunks = list(
        oai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=headers,
        )
    )
    usage = chunks[-1].usage
    assert usage is not None
    spans = receiver.server_span(trace_id)
    server = server_span(spans, caller_span)
    assert server.name == f"chat {MODEL}"
    assert server.attributes["gen_ai.operation.name"] == "chat"
    assert server.attributes["gen_ai.provider.name"] == "vllm"
    assert server.attributes["gen_ai.request.model"] == MODEL
    assert server.attributes["llm_gateway.protocol"] == "openai_chat"
    assert server.attributes["llm_gateway.api_key.name"] == "alice"
    assert server.attributes["http.request.method"] == "POST"
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert server.attributes["gen_ai.usage.output_tokens"] == usage.completion_tokens
    reasons = [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason]
    assert server.attributes["gen_ai.response.finish_reasons"] == reasons
    [prompt] = prompts(spans, server)
    assert "llm_gateway.first_token" in prompt.events
    assert prompt.attributes["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert prompt.attributes["llm_gateway.outcome"] == "finished"
    assert "llm_gateway.prompt.text" not in prompt.attributes  # content is off by default
    assert_engine_path(spans, prompt)


def test_a_failed_request_is_an_error_of_its_kind(
    traced: RunningServer, receiver: Receiver
) -> None:
    headers, trace_id, caller_span = caller()
    answer = web.post(
        traced.http + "/v1/completions",
        json={"model": MODEL, "prompt": "word " * 3000, "max_tokens": 4},
        headers=headers,
    )
    assert answer.status_code == 400
    spans = receiver.server_span(trace_id)
    server = server_span(spans, caller_span)
    assert server.name == f"text_completion {MODEL}"
    assert server.status == ERROR
    assert server.attributes["error.type"] == "context_length_exceeded"
    [prompt] = prompts(spans, server)
    assert prompt.status == ERROR and prompt.attributes["llm_gateway.outcome"] == "failed"


def test_a_constraint_check_says_whether_its_verdict_was_kept(
    traced: RunningServer, receiver: Receiver
) -> None:
    # A schema of its own (a title no other test uses): the first check compiles it.
    schema = {**CITY_SCHEMA, "title": f"traced-{traceparent()[1]}"}
    cached = []
    for _ in range(2):
        headers, trace_id, caller_span = caller()
        answer = web.post(
            traced.http + "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "A capital city, as JSON."}],
                "max_tokens": 24,
                "temperature": 0,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "city", "schema": schema},
                },
            },
            headers=headers,
        )
        assert answer.status_code == 200, answer.text
        spans = receiver.server_span(trace_id)
        [prompt] = prompts(spans, server_span(spans, caller_span))
        check = one(children(spans, prompt), "llm_gateway.constraint_check")
        cached.append(check.attributes["llm_gateway.constraint.cached"])
        assert_engine_path(spans, prompt)
    assert cached == [False, True]


def test_the_wait_for_a_loading_model(
    loop_thread: LoopThread, engine: VllmEngine, receiver: Receiver
) -> None:
    headers, trace_id, caller_span = caller()
    with (
        loading_server(loop_thread, engine, **tracing_env(receiver)) as (loading, finish_loading),
        connect(loading.ws + "/ws", headers={"traceparent": headers["traceparent"]}) as ws,
    ):
        ws.send(payload(("early", CHAT.format("Hi.")), generation_config={"max_new_tokens": 3}))
        wait_for(lambda: loading.loop.call(lambda: loading.gateway.service.active) == 1)
        finish_loading()  # the prompt waits for the engine until now
        frames_until_done(ws, {"early"})
    spans = receiver.server_span(trace_id)
    [prompt] = prompts(spans, server_span(spans, caller_span))
    names = [s.name for s in sorted(children(spans, prompt), key=lambda s: s.start_ns)]
    assert names[:2] == ["llm_gateway.model_load", "llm_gateway.admission"], names


def test_an_anthropic_message(traced: RunningServer, receiver: Receiver) -> None:
    headers, trace_id, caller_span = caller()
    client = anthropic.Anthropic(base_url=traced.http, api_key=KEY, max_retries=0)
    message = client.messages.create(
        model=MODEL,
        max_tokens=8,
        messages=[{"role": "user", "content": "Say hello."}],
        extra_body={"temperature": 0},
        extra_headers=headers,
    )
    spans = receiver.server_span(trace_id)
    server = server_span(spans, caller_span)
    assert server.name == f"chat {MODEL}"
    assert server.attributes["llm_gateway.protocol"] == "anthropic_messages"
    read = message.usage.cache_read_input_tokens or 0  # Anthropic's input_tokens exclude them
    assert server.attributes["gen_ai.usage.input_tokens"] == message.usage.input_tokens + read
    assert server.attributes["gen_ai.usage.cache_read.input_tokens"] == read
    assert server.attributes["gen_ai.usage.output_tokens"] == message.usage.output_tokens
    [prompt] = prompts(spans, server)
    assert_engine_path(spans, prompt)


def test_an_invocations_jsonlines_stream(traced: RunningServer, receiver: Receiver) -> None:
    headers, trace_id, caller_span = caller()
    params = {"max_new_tokens": 6, "ignore_eos_token": True, "details": True}
    body = {"inputs": CHAT.format("Count."), "stream": True, "parameters": params}
    with web.stream("POST", traced.http + "/invocations", json=body, headers=headers) as answer:
        assert answer.headers["content-type"] == "application/jsonlines"
        lines = [json.loads(line) for line in answer.iter_lines() if line]
    details = lines[-1]["details"]
    spans = receiver.server_span(trace_id)
    server = server_span(spans, caller_span)
    assert server.name == f"text_completion {MODEL}"
    assert server.attributes["llm_gateway.protocol"] == "lmi"
    assert server.attributes["gen_ai.usage.output_tokens"] == details["generated_tokens"] == 6
    assert server.attributes["gen_ai.response.finish_reasons"] == [details["finish_reason"]]
    [prompt] = prompts(spans, server)
    assert "llm_gateway.first_token" in prompt.events
    assert_engine_path(spans, prompt)


def test_a_ws_payload_of_two_prompts(traced: RunningServer, receiver: Receiver) -> None:
    headers, trace_id, caller_span = caller()
    with connect(traced.ws + "/ws", headers=headers) as ws:
        ws.send(
            payload(
                ("a", CHAT.format("Hello.")),
                ("b", CHAT.format("Goodbye.")),
                generation_config={"do_sample": False, "max_new_tokens": 5},
            )
        )
        frames = frames_until_done(ws, {"a", "b"})
    completes = [events_of(frames, rid)[-1] for rid in ("a", "b")]
    assert all(c["type"] == "COMPLETE" for c in completes), completes
    spans = receiver.server_span(trace_id)
    server = server_span(spans, caller_span)
    assert server.name == f"text_completion {MODEL}"
    assert server.attributes["llm_gateway.protocol"] == "ws"
    both = prompts(spans, server)
    assert sorted(p.attributes["llm_gateway.request_id"] for p in both) == ["a", "b"]
    generated = {c["request_id"]: c["new_tokens_count"] for c in completes}
    for prompt in both:
        rid = prompt.attributes["llm_gateway.request_id"]
        assert prompt.attributes["gen_ai.usage.output_tokens"] == generated[rid]
    assert server.attributes["gen_ai.usage.output_tokens"] == sum(generated.values())
    inputs = sum(p.attributes["gen_ai.usage.input_tokens"] for p in both)
    assert server.attributes["gen_ai.usage.input_tokens"] == inputs > 0
    # the payload's request_ids are a continuation key: its histories read, then each kept
    stored = sorted(s.name for s in children(spans, server) if s not in both)
    assert stored == ["llm_gateway.continuation.load", *["llm_gateway.continuation.save"] * 2]


def test_a_control_generation_paused_and_resumed(traced: RunningServer, receiver: Receiver) -> None:
    headers, trace_id, caller_span = caller()
    story = CHAT.format("Write a long story about a dragon.")
    with connect(traced.ws + "/generate", headers=headers) as ws:
        ws.send(config(story, max_tokens=60, temperature=0))
        until(ws, "token")
        until(ws, "token")
        ws.send(control("pause"))
        assert until(ws, "status")[-1]["operation"] == "paused"
        ws.send(control("resume"))
        completion = until(ws, "completion")[-1]
    usage = completion["usage"]
    spans = receiver.server_span(trace_id)
    server = server_span(spans, caller_span)
    assert server.name == f"text_completion {MODEL}"
    assert server.attributes["llm_gateway.protocol"] == "control"
    assert server.events == ["llm_gateway.control.pause", "llm_gateway.control.resume"]
    assert server.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert server.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 60
    assert server.attributes["gen_ai.response.finish_reasons"] == [completion["finish_reason"]]
    paused, resumed = sorted(prompts(spans, server), key=lambda s: s.start_ns)
    assert paused.attributes["llm_gateway.outcome"] == "interrupted"
    assert resumed.attributes["llm_gateway.outcome"] == "finished"
    assert paused.end_ns <= resumed.start_ns


def test_an_embedding_request(
    make_embedding_server: Callable[..., RunningServer], receiver: Receiver
) -> None:
    running = make_embedding_server(API_KEYS=f"{KEY}:alice", **tracing_env(receiver))
    headers, trace_id, caller_span = caller()
    answer = web.post(
        running.http + "/v1/embeddings",
        json={"model": "all-MiniLM-L6-v2", "input": ["one text", "and another"]},
        headers=headers,
    )
    assert answer.status_code == 200, answer.text
    spans = receiver.server_span(trace_id)
    server = server_span(spans, caller_span)
    assert server.name == "embeddings all-MiniLM-L6-v2"
    assert server.attributes["gen_ai.operation.name"] == "embeddings"
    tokens = answer.json()["usage"]["prompt_tokens"]
    assert server.attributes["gen_ai.usage.input_tokens"] == tokens
    embed = one(children(spans, server), "llm_gateway.embed")
    assert embed.attributes["llm_gateway.inputs"] == 2
    assert [s.name for s in children(spans, embed)] == ["llm_gateway.admission"]


@pytest.mark.parametrize(
    ("body", "key", "status", "kind"),
    [
        ({"model": "no-such-model"}, KEY, 404, "invalid_request"),  # an unknown model
        ({"model": MODEL, "temperature": "hot"}, KEY, 400, "invalid_request"),  # a bad field
        ({"model": MODEL}, "sk-not-a-key", 401, "unauthorized"),  # refused at the edge
    ],
)
def test_a_refused_request_is_one_error_span_of_its_kind(
    traced: RunningServer,
    receiver: Receiver,
    body: dict[str, object],
    key: str,
    status: int,
    kind: str,
) -> None:
    headers, trace_id, caller_span = caller()
    messages = [{"role": "user", "content": "Hi."}]
    answer = web.post(
        traced.http + "/v1/chat/completions",
        json={**body, "messages": messages, "max_tokens": 2},
        headers={**headers, "Authorization": f"Bearer {key}"},
    )
    assert answer.status_code == status, answer.text
    spans = receiver.server_span(trace_id)
    [server] = spans  # nothing was generated: the server span alone
    assert server.kind == SERVER and server.parent_id == caller_span
    assert server.status == ERROR
    assert server.attributes["error.type"] == kind
    assert server.attributes["http.response.status_code"] == status


def test_beam_search_steps_are_child_spans(traced: RunningServer, receiver: Receiver) -> None:
    headers, trace_id, caller_span = caller()
    config = {"num_beams": 2, "do_sample": False, "max_new_tokens": 4}
    answer = web.post(
        traced.http + "/api/generate-one",
        json={"request_id": trace_id, "prompt": CHAT.format("Hi."), "stream_response": False}
        | {"generation_config": config},
        headers=headers,
    )
    assert answer.status_code == 200, answer.text
    spans = receiver.server_span(trace_id)
    [prompt] = prompts(spans, server_span(spans, caller_span))
    assert prompt.attributes["llm_gateway.request.num_beams"] == 2
    steps = sorted(children(spans, prompt), key=lambda s: s.start_ns)
    steps = [s for s in steps if s.name == "llm_gateway.beam_step"]
    assert 1 <= len(steps) <= 4
    assert [s.attributes["llm_gateway.beam.step"] for s in steps] == list(range(1, len(steps) + 1))
    assert steps[0].attributes["llm_gateway.beam.sequences"] == 1  # the prompt alone
    assert all(s.attributes["llm_gateway.beam.sequences"] <= 2 for s in steps)
    assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(steps))


def test_a_background_response_ends_its_span_with_its_generation(
    traced: RunningServer, receiver: Receiver
) -> None:
    headers, trace_id, caller_span = caller()
    api = openai.OpenAI(base_url=traced.http + "/v1", api_key=KEY, max_retries=0)
    made = api.responses.create(
        model=MODEL,
        input="Write a story about a dragon.",
        max_output_tokens=24,
        temperature=0,
        background=True,
        extra_headers=headers,
    )
    assert made.status in ("queued", "in_progress")
    spans = receiver.server_span(trace_id)  # it comes once the generation is over
    done = api.responses.retrieve(made.id)
    assert done.status in ("completed", "incomplete") and done.usage is not None  # it ended
    server = server_span(spans, caller_span)
    assert server.attributes["llm_gateway.background"] is True
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["gen_ai.usage.input_tokens"] == done.usage.input_tokens
    assert server.attributes["gen_ai.usage.output_tokens"] == done.usage.output_tokens
    [prompt] = prompts(spans, server)
    assert prompt.attributes["llm_gateway.outcome"] == "finished"
    assert prompt.end_ns <= server.end_ns
