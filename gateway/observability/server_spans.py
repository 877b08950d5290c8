"""The middleware that gives each request its trace (gateway/observability/tracing.py): an
HTTP request's, whose server span ends when its last byte is written, and a WebSocket's trace
context, which each message that starts a generation continues. Installed only when tracing
is on (`tracing_of`): with it off, a request meets nothing of it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config.settings import ConfigError, Settings
from gateway.config.version import version
from gateway.observability.tracing import Backend, Trace, connection_traced, request_trace

if TYPE_CHECKING:  # OpenTelemetry's SDK: imported only when tracing is on
    from gateway.observability.otel import OtelBackend


class TracingMiddleware:
    def __init__(self, app: ASGIApp, backend: Backend) -> None:
        self.app = app
        self.backend = backend

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "websocket":
            with connection_traced(self.backend, scope["headers"], scope["path"]):
                await self.app(scope, receive, send)
            return
        if kind != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        path = scope["path"]
        attributes = {"http.request.method": method, "url.path": path}
        parent = self.backend.parent_of(scope["headers"])
        trace = Trace(self.backend, parent, method, attributes, request=True)

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                trace.status_code = message["status"]
            await send(message)

        with request_trace(trace):
            try:
                await self.app(scope, receive, sending)
            except BaseException:
                if trace.status_code is None:
                    trace.status_code = 500
                raise


def tracing_of(settings: Settings) -> OtelBackend | None:
    """The tracer the settings ask for: None without an OTLP endpoint (OpenTelemetry is then
    never imported), or with OTEL_SDK_DISABLED or OTEL_TRACES_EXPORTER=none."""
    otel = settings.otel
    endpoint = otel.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or otel.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    disabled = otel.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    if not endpoint or disabled or otel.get("OTEL_TRACES_EXPORTER", "").lower() == "none":
        return None
    try:
        from gateway.observability.otel import otel_backend
    except ImportError as e:
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_ENDPOINT: tracing needs OpenTelemetry's SDK and OTLP exporters "
            f"(pip install 'llm-gateway[otel]'): {e}"
        ) from e
    chars = settings.trace_content_max_chars if settings.trace_content else 0
    return otel_backend(otel, chars, version())
