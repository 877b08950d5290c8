"""Tracing's set-up and its spans with no engine: OpenTelemetry's variables read from the
settings, nothing of OpenTelemetry imported without an endpoint, and the real SDK exporting
over OTLP/HTTP to a receiver on loopback (tests/otlp_receiver.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from otlp_receiver import ERROR, SERVER, children, one, receiving, traceparent, tracing_env

from gateway.config.loading import load_settings
from gateway.config.settings import ConfigError
from gateway.observability.server_spans import tracing_of
from gateway.observability.tracing import (
    EngineTimings,
    Trace,
    child,
    current_span,
    current_trace,
    engine_phases,
    request_trace,
)
from protocols.errors import ErrorKind, GenerationError


def test_without_an_endpoint_nothing_of_opentelemetry_is_imported() -> None:
    script = (
        "import sys\n"
        "from gateway.config.loading import load_settings\n"
        "from gateway.observability.server_spans import tracing_of\n"
        "import gateway.observability.tracing\n"
        "settings = load_settings({'OTEL_SERVICE_NAME': 'x'}, dotenv_path=None)\n"
        "assert tracing_of(settings) is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"},
    ],
)
def test_tracing_is_off_without_an_endpoint_or_when_disabled(env: dict[str, str]) -> None:
    assert tracing_of(load_settings(env, dotenv_path=None)) is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_TRACES_SAMPLER", "sometimes"),
        ("OTEL_TRACES_SAMPLER_ARG", "2"),
        ("OTEL_BSP_SCHEDULE_DELAY", "soon"),
    ],
)
def test_a_bad_variable_is_named(name: str, value: str) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", name: value}
    if name == "OTEL_TRACES_SAMPLER_ARG":
        env["OTEL_TRACES_SAMPLER"] = "traceidratio"
    with pytest.raises(ConfigError) as caught:
        tracing_of(load_settings(env, dotenv_path=None))
    assert str(caught.value).startswith(f"{name}: ")


def test_grpc_is_the_other_protocol() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
    }
    backend = tracing_of(load_settings(env, dotenv_path=None))
    assert backend is not None
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    assert isinstance(backend.exporter, OTLPSpanExporter)
    backend.shutdown()


def test_a_trace_continues_the_callers_and_its_children_follow() -> None:
    header, trace_id, caller_span = traceparent()
    with receiving() as receiver:
        settings = load_settings(
            {**tracing_env(receiver), "OTEL_SERVICE_NAME": "gw-test"}, dotenv_path=None
        )
        backend = tracing_of(settings)
        assert backend is not None
        parent = backend.parent_of([(b"traceparent", header.encode()), (b"other", b"x")])
        untouched = Trace(backend, parent, "GET", {"url.path": "/health"}, request=True)
        with request_trace(untouched):
            pass  # nothing asked for its span: none is made
        trace = Trace(backend, parent, "POST", {"url.path": "/v1/x"}, request=True)
        with request_trace(trace):
            assert current_trace() is trace
            trace.generation("chat", "m", "openai", "alice", None)
            prompt = trace.span.child("llm_gateway.generate")
            prompt.content("llm_gateway.prompt.text", "secret prompt")  # off: not set
            with pytest.raises(GenerationError), child(prompt, "llm_gateway.admission"):
                raise GenerationError(ErrorKind.RATE_LIMITED, "too many")
            now = time.monotonic()
            engine_phases(prompt, EngineTimings(now - 0.3, now - 0.2, now - 0.1, now, 1))
            prompt.end()
            trace.finished(7, 3, 2, ["length"])
            trace.status_code = 200
        assert current_trace() is None and current_span() is None
        spans = receiver.server_span(trace_id, "chat m")
        backend.shutdown()
    server = one(spans, "chat m")
    assert server.kind == SERVER and server.parent_id == caller_span
    assert server.resource["service.name"] == "gw-test"
    assert server.attributes == {
        "url.path": "/v1/x",
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": "m",
        "gen_ai.response.model": "m",
        "llm_gateway.protocol": "openai",
        "llm_gateway.api_key.name": "alice",
        "gen_ai.usage.input_tokens": 7,
        "gen_ai.usage.output_tokens": 3,
        "gen_ai.usage.cache_read.input_tokens": 2,
        "gen_ai.response.finish_reasons": ["length"],
        "http.response.status_code": 200,
    }
    prompt_span = one(children(spans, server), "llm_gateway.generate")
    assert "llm_gateway.prompt.text" not in prompt_span.attributes
    names = [s.name for s in children(spans, prompt_span)]
    assert names == [
        "llm_gateway.admission",
        "llm_gateway.engine.queue",
        "llm_gateway.engine.prefill",
        "llm_gateway.engine.decode",
    ]
    admission = one(spans, "llm_gateway.admission")
    assert admission.status == ERROR and admission.attributes["error.type"] == "rate_limited"
    queue, prefill, decode = (
        one(spans, f"llm_gateway.engine.{n}") for n in ("queue", "prefill", "decode")
    )
    assert queue.end_ns == prefill.start_ns and prefill.end_ns == decode.start_ns
    assert abs(decode.end_ns - decode.start_ns - 100_000_000) < 1000  # vLLM's times, as given
    assert decode.attributes["llm_gateway.engine.preemptions"] == 1


def test_content_is_bounded_when_asked_for() -> None:
    header, trace_id, _ = traceparent()
    with receiving() as receiver:
        env = {**tracing_env(receiver), "TRACE_CONTENT": "true", "TRACE_CONTENT_MAX_CHARS": "5"}
        backend = tracing_of(load_settings(env, dotenv_path=None))
        assert backend is not None
        parent = backend.parent_of([(b"traceparent", header.encode())])
        with request_trace(Trace(backend, parent, "POST", {})) as trace:
            trace.span.content("llm_gateway.prompt.text", "a long prompt")
        spans = receiver.server_span(trace_id)
        backend.shutdown()
    assert spans[0].attributes["llm_gateway.prompt.text"] == "a lon"
