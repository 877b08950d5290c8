"""`llm-gateway bench tracing`'s parts that need no engine: its OTLP receiver takes what the
real SDK's exporter sends, and the cost per request is the frontend CPU per token the traced
gateway spends beyond the untraced one's, times the tokens a request makes (a whole run
starts two gateways: docs/BENCHMARKS.md has its figures)."""

from __future__ import annotations

import pytest

pytest.importorskip("aiohttp", reason="the bench extra is not installed")


def test_the_receiver_takes_an_otlp_export() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from gateway_bench.tracing_bench import receiver

    with receiver() as (url, exported):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(url + "/v1/traces")))
        provider.get_tracer("bench-test").start_span("one").end()  # exported as it ends
        provider.shutdown()
    assert exported.requests == 1 and exported.bytes > 0


def test_the_cost_per_request_is_the_cpu_beyond_the_untraced_gateways() -> None:
    from gateway_bench.tracing_bench import OFF, ON, SCENARIO, Cost, costs
    from gateway_bench.variants import Row

    rows = [
        Row(1, OFF, 50.0, 64, 0, None, 0.2),
        Row(1, ON, 49.0, 64, 0, 0.98, 0.25),
        Row(8, OFF, 200.0, 512, 0, None, None),  # the CPU not measured: no cost
        Row(8, ON, 198.0, 512, 0, 0.99, 0.3),
    ]
    assert costs(rows, 64) == [Cost(1, 3.2), Cost(8, None)]
    assert SCENARIO.parse(["--quick"]).concurrency == [1, 2]
