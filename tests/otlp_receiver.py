"""An OTLP/HTTP traces receiver on loopback, for the tracing tests: it decodes each
ExportTraceServiceRequest with opentelemetry-proto and keeps its spans, readable by trace."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

SERVER = 2  # Span.SpanKind.SPAN_KIND_SERVER
ERROR = 2  # Status.StatusCode.STATUS_CODE_ERROR


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[str]
    status: int
    status_message: str
    resource: dict[str, Any] = field(default_factory=dict)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


class Receiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver._received(self.path, body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _received(self, path: str, body: bytes) -> None:
        assert path == "/v1/traces", path
        request = ExportTraceServiceRequest.FromString(body)
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    spans.append(
                        Span(
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.name,
                            s.kind,
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                            {a.key: _value(a.value) for a in s.attributes},
                            [e.name for e in s.events],
                            s.status.code,
                            s.status.message,
                            resource,
                        )
                    )
        with self._changed:
            self.spans.extend(spans)
            self.requests += 1
            self._changed.notify_all()

    def trace(self, trace_id: str) -> list[Span]:
        with self._changed:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, condition: Callable[[], bool]) -> None:
        """Until `condition` holds of what came, however long that takes."""
        with self._changed:
            self._changed.wait_for(condition)

    def server_span(self, trace_id: str, name: str | None = None) -> list[Span]:
        """The trace's spans once its server span (named `name`, if given) came."""

        def came() -> bool:
            return any(
                s.kind == SERVER and (name is None or s.name == name)
                for s in self.spans
                if s.trace_id == trace_id
            )

        self.wait_for(came)
        return self.trace(trace_id)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def receiving() -> Iterator[Receiver]:
    receiver = Receiver()
    receiver._thread.start()
    try:
        yield receiver
    finally:
        receiver.stop()


def traceparent() -> tuple[str, str, str]:
    """A caller's W3C traceparent header: (header, trace id, its span id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def tracing_env(receiver: Receiver) -> dict[str, str]:
    """A gateway's settings exporting to `receiver` at once (every 10 ms)."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "10"}


def children(spans: list[Span], parent: Span) -> list[Span]:
    return [s for s in spans if s.parent_id == parent.span_id]


def one(spans: list[Span], name: str) -> Span:
    [found] = [s for s in spans if s.name == name]
    return found
