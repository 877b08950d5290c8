"""What the gateway reports of its requests as they run: traces (tracing.py, the code's side,
with no OpenTelemetry; otel.py, OpenTelemetry's SDK, imported only when an OTLP endpoint is set;
server_spans.py, the middleware that starts a request's trace).

Below the engine, the stores and the edge, which report to it; it imports only the settings
and protocols/.
"""
