"""OpenTelemetry's SDK behind the gateway's `Backend` (gateway/observability/tracing.py):
imported only when an OTLP endpoint is configured (`tracing_of`).

Each app has a tracer provider of its own, never the global one: two apps in one process (the
tests') trace apart. OpenTelemetry's standard variables are read from the settings (the
environment and `.env`): the endpoint (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as given, else
OTEL_EXPORTER_OTLP_ENDPOINT with /v1/traces for HTTP), the protocol (http/protobuf, the default,
or grpc), headers, insecure (gRPC), OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER and its argument,
and the batch processor's OTEL_BSP_*; the exporter reads its other variables (timeouts,
compression, certificates) from the environment itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_OFF,
    DEFAULT_ON,
    ParentBasedTraceIdRatio,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.re import parse_env_headers

from gateway.config.settings import ConfigError
from gateway.observability.tracing import Attributes, Headers

PROTOCOLS = ("http/protobuf", "grpc")
_SAMPLERS: Mapping[str, Sampler] = {
    "always_on": ALWAYS_ON,
    "always_off": ALWAYS_OFF,
    "parentbased_always_on": DEFAULT_ON,
    "parentbased_always_off": DEFAULT_OFF,
}
_TRACE_HEADERS = frozenset({b"traceparent", b"tracestate"})


class OtelBackend:
    """The app's tracer, exporting over OTLP in batches."""

    def __init__(
        self,
        provider: TracerProvider,
        content_chars: int,
        version: str = "",
        exporter: SpanExporter | None = None,
    ) -> None:
        self.provider = provider
        self.exporter = exporter  # OTLP's, HTTP or gRPC (None: a test's processor instead)
        self.content_chars = content_chars
        self._tracer = provider.get_tracer("llm_gateway", version)
        self._propagator = TraceContextTextMapPropagator()

    def parent_of(self, headers: Headers) -> Context:
        carrier = {
            k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k in _TRACE_HEADERS
        }
        return self._propagator.extract(carrier) if carrier else Context()

    def start(
        self,
        name: str,
        parent: Any,
        *,
        server: bool = False,
        start_ns: int | None = None,
        attributes: Attributes | None = None,
    ) -> trace.Span:
        context = parent if server else trace.set_span_in_context(parent)
        return self._tracer.start_span(
            name,
            context,
            SpanKind.SERVER if server else SpanKind.INTERNAL,
            attributes,
            start_time=start_ns,
        )

    def fail(self, span: Any, kind: str, message: str) -> None:
        span.set_status(Status(StatusCode.ERROR, f"{kind}: {message}"))

    def shutdown(self) -> None:
        self.provider.shutdown()


def otel_backend(
    otel: Mapping[str, str],
    content_chars: int = 0,
    version: str = "",
    processor: SpanProcessor | None = None,
) -> OtelBackend:
    """The tracer `otel` (OpenTelemetry's variables) describes; `processor` in place of the
    OTLP exporter's (a test's)."""
    name = otel.get("OTEL_SERVICE_NAME") or "llm-gateway"
    resource = Resource.create({"service.name": name, "service.version": version})
    provider = TracerProvider(resource=resource, sampler=_sampler(otel))
    if processor is not None:
        provider.add_span_processor(processor)
        return OtelBackend(provider, content_chars, version)
    exporter = _exporter(otel)
    provider.add_span_processor(_batches(otel, exporter))
    return OtelBackend(provider, content_chars, version, exporter)


def _sampler(otel: Mapping[str, str]) -> Sampler:
    name = otel.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    if name in _SAMPLERS:
        return _SAMPLERS[name]
    if name in ("traceidratio", "parentbased_traceidratio"):
        raw = otel.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
        try:
            ratio = float(raw)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG: {raw!r} is no ratio from 0 to 1")
        return (
            TraceIdRatioBased(ratio) if name == "traceidratio" else ParentBasedTraceIdRatio(ratio)
        )
    known = ", ".join([*_SAMPLERS, "traceidratio", "parentbased_traceidratio"])
    raise ConfigError(f"OTEL_TRACES_SAMPLER: {name!r} is none of {known}")


def _protocol(otel: Mapping[str, str]) -> str:
    protocol = (
        otel.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or otel.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    if protocol not in PROTOCOLS:
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is none of {PROTOCOLS}")
    return protocol


def _exporter(otel: Mapping[str, str]) -> SpanExporter:
    protocol = _protocol(otel)
    raw = otel.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or otel.get("OTEL_EXPORTER_OTLP_HEADERS")
    headers = dict(parse_env_headers(raw, liberal=True)) if raw else None
    endpoint = otel.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    base = otel.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        flag = otel.get("OTEL_EXPORTER_OTLP_TRACES_INSECURE") or otel.get(
            "OTEL_EXPORTER_OTLP_INSECURE"
        )
        insecure = None if flag is None else flag.strip().lower() == "true"
        return GrpcExporter(endpoint=endpoint or base, insecure=insecure, headers=headers)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(endpoint=endpoint or base.rstrip("/") + "/v1/traces", headers=headers)


def _batches(otel: Mapping[str, str], exporter: SpanExporter) -> BatchSpanProcessor:
    def number(name: str) -> int | None:
        raw = otel.get(name)
        if raw is None:
            return None
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{name}: {raw!r} is no whole number") from None

    return BatchSpanProcessor(
        exporter,
        max_queue_size=number("OTEL_BSP_MAX_QUEUE_SIZE"),
        schedule_delay_millis=number("OTEL_BSP_SCHEDULE_DELAY"),
        max_export_batch_size=number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),
        export_timeout_millis=number("OTEL_BSP_EXPORT_TIMEOUT"),
    )
