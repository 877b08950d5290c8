"""The gateway's traces as its code sees them: spans, with nothing of OpenTelemetry imported.

A `Trace` is one request's: an HTTP request's, or a WebSocket message's that starts a
generation. Its server span is made the first time something of the request asks for it (the
engine path, as a prompt comes; a refusal, `refused`, or an error status), with the request's
arrival as its start, so a request that generates nothing and is not refused (a probe) makes
no span. The engine path names it by the GenAI
conventions (`chat {model}`) and sums every prompt's usage on it; each prompt is a child span
with its own children (admission, a model's load, a constraint's compile, the engine's queue,
prefill and decode). With tracing off, no trace is ever current: what the code asks of it is a
context variable read, and `None`.

`Backend` is what gateway/observability/otel.py implements with OpenTelemetry's SDK.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from protocols.errors import GenerationError

Value = str | bool | int | float | Sequence[str]
Attributes = Mapping[str, Value]
Headers = Iterable[tuple[bytes, bytes]]
# The GenAI conventions' provider: the engine that answers (vLLM's own traces say so too).
PROVIDER = "vllm"
_CLIENT_GONE = 499  # gateway/http/streaming.py's: no answer, the client left first


class Backend(Protocol):
    """A tracer: OpenTelemetry's (otel.py), or a test's."""

    content_chars: int  # the prompt's and output's text on spans, cut there; 0: never

    def parent_of(self, headers: Headers) -> Any:
        """The caller's trace context (W3C traceparent / tracestate) in `headers`."""

    def start(
        self,
        name: str,
        parent: Any,
        *,
        server: bool = False,
        start_ns: int | None = None,
        attributes: Attributes | None = None,
    ) -> Any:
        """A span under `parent`: a context `parent_of` gave (server), else a span."""

    def fail(self, span: Any, kind: str, message: str) -> None:
        """`span`'s status: an error of the neutral `kind` (ErrorKind's value)."""

    def shutdown(self) -> None:
        """Export what is left, then stop."""


class Span:
    """One span; ending it twice is harmless."""

    __slots__ = ("_backend", "_ended", "_span")

    def __init__(self, backend: Backend, span: Any) -> None:
        self._backend = backend
        self._span = span
        self._ended = False

    def child(
        self, name: str, attributes: Attributes | None = None, start_ns: int | None = None
    ) -> Span:
        span = self._backend.start(name, self._span, start_ns=start_ns, attributes=attributes)
        return Span(self._backend, span)

    def set(self, key: str, value: Value) -> None:
        self._span.set_attribute(key, value)

    def update(self, attributes: Attributes) -> None:
        self._span.set_attributes(attributes)

    def rename(self, name: str) -> None:
        self._span.update_name(name)

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        self._span.add_event(name, attributes or {})

    @property
    def wants_content(self) -> bool:
        return self._backend.content_chars > 0

    def content(self, key: str, text: str) -> None:
        """User content (a prompt, an output): only with TRACE_CONTENT, cut at its bound."""
        chars = self._backend.content_chars
        if chars:
            self._span.set_attribute(key, text[:chars])

    def fail(self, kind: str, message: str) -> None:
        self._span.set_attribute("error.type", kind)
        self._backend.fail(self._span, kind, message)

    def end(self, end_ns: int | None = None) -> None:
        if not self._ended:
            self._ended = True
            self._span.end(end_time=end_ns)


class Trace:
    """One request's server span, made when first asked for, ended with the request."""

    __slots__ = (
        "_attributes",
        "_backend",
        "_failed",
        "_holds",
        "_name",
        "_named",
        "_over",
        "_parent",
        "_request",
        "_span",
        "_start_ns",
        "cached_tokens",
        "finish_reasons",
        "input_tokens",
        "output_tokens",
        "status_code",
    )

    def __init__(
        self,
        backend: Backend,
        parent: Any,
        name: str,
        attributes: Attributes,
        *,
        request: bool = False,
    ) -> None:
        """`request`: an HTTP request's, ended with its response (else a message's)."""
        self._backend = backend
        self._request = request
        self._parent = parent
        self._name = name
        self._named = False
        self._attributes = dict(attributes)
        self._start_ns = time.time_ns()
        self._span: Span | None = None
        self._failed = False
        self._holds = 0  # generations outliving the request (`hold`)
        self._over = False  # the request ended while one was held
        self.input_tokens = self.output_tokens = self.cached_tokens = 0
        self.finish_reasons: list[str] = []
        self.status_code: int | None = None

    @property
    def span(self) -> Span:
        if self._span is None:
            otel = self._backend.start(
                self._name,
                self._parent,
                server=True,
                start_ns=self._start_ns,
                attributes=self._attributes,
            )
            self._span = Span(self._backend, otel)
        return self._span

    def generation(
        self, operation: str, model: str, protocol: str, key_name: str, adapter: str | None
    ) -> None:
        """What the request asks of which model: the span's GenAI name and attributes (the
        first prompt's; every prompt of a request asks the same model)."""
        if self._named:
            return
        self._named = True
        span = self.span
        span.rename(f"{operation} {model}")
        attributes: dict[str, Value] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.request.model": model,
            "gen_ai.response.model": model,
        }
        if protocol:  # an embedding model's requests do not say which
            attributes["llm_gateway.protocol"] = protocol
        if key_name:
            attributes["llm_gateway.api_key.name"] = key_name
        if adapter:
            attributes["llm_gateway.adapter"] = adapter
        span.update(attributes)

    def finished(
        self, input_tokens: int, output_tokens: int, cached_tokens: int, reasons: Sequence[str]
    ) -> None:
        """A prompt ended: its usage added to the request's."""
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.cached_tokens += cached_tokens
        self.finish_reasons.extend(reasons)
        self.span.update(
            {
                "gen_ai.usage.input_tokens": self.input_tokens,
                "gen_ai.usage.output_tokens": self.output_tokens,
                "gen_ai.usage.cache_read.input_tokens": self.cached_tokens,
                "gen_ai.response.finish_reasons": list(self.finish_reasons),
            }
        )

    def fail(self, kind: str, message: str) -> None:
        self._failed = True
        self.span.fail(kind, message)

    def usage(self, input_tokens: int, output_tokens: int, reasons: Sequence[str]) -> None:
        """The request's usage as its protocol answers it, where its prompts continue one
        sequence (the control protocol's pause and resume: each prompt's tokens are the whole
        history's)."""
        cached, self.cached_tokens = self.cached_tokens, 0
        self.input_tokens = self.output_tokens = 0
        self.finish_reasons = []
        self.finished(input_tokens, output_tokens, cached, reasons)

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        self.span.event(name, attributes)

    def done(self) -> None:
        """The generation traced is over: a message's trace ends now; an HTTP request's
        with its response."""
        if not self._request:
            self.end()

    def hold(self) -> None:
        """A generation goes on past the request's answer (a background response's): the
        span ends when it is `release`d, not with the answer."""
        self._holds += 1
        self.span.set("llm_gateway.background", True)

    def release(self) -> None:
        self._holds -= 1
        if not self._holds and self._over:
            self.end()

    def end(self) -> None:
        """The span ended (made now for a refusal: an HTTP error status that generated
        nothing); a status of 400 or more without a kind is an error of its code."""
        if self._holds:
            self._over = True
            return
        code = self.status_code
        refused = code is not None and code >= 400 and code != _CLIENT_GONE
        if self._span is None and not refused:
            return
        span = self.span
        if code is not None:
            span.set("http.response.status_code", code)
            if refused and not self._failed:
                span.fail(str(code), f"HTTP {code}")
        span.end()


@dataclass(frozen=True)
class _Connection:
    """A traced WebSocket: its upgrade request's trace context, for each message's trace."""

    backend: Backend
    parent: Any
    path: str


_TRACE: ContextVar[Trace | None] = ContextVar("trace", default=None)
_CONNECTION: ContextVar[_Connection | None] = ContextVar("traced_connection", default=None)


def current_trace() -> Trace | None:
    """The request's trace; None when tracing is off (or outside a request)."""
    return _TRACE.get()


def current_span() -> Span | None:
    """The request's server span (made now if it was not yet); None when untraced."""
    trace = _TRACE.get()
    return None if trace is None else trace.span


@contextmanager
def request_trace(trace: Trace) -> Iterator[Trace]:
    """`trace` the current one while the block runs, ended after it."""
    token = _TRACE.set(trace)
    try:
        yield trace
    finally:
        trace.end()
        _TRACE.reset(token)


def connection_is_traced() -> bool:
    """Whether this WebSocket's messages are traced (tracing on)."""
    return _CONNECTION.get() is not None


def message_trace(protocol: str) -> Trace | None:
    """A new trace for a WebSocket message that starts a generation, continuing the upgrade
    request's trace context; over HTTP (the control protocol's REST form), the request's own.
    None when the connection is untraced."""
    trace = _TRACE.get()
    if trace is not None:
        return trace
    connection = _CONNECTION.get()
    if connection is None:
        return None
    attributes = {"llm_gateway.protocol": protocol, "url.path": connection.path}
    return Trace(connection.backend, connection.parent, f"WS {connection.path}", attributes)


@contextmanager
def traced_message(protocol: str) -> Iterator[None]:
    """The block is one WebSocket message's generation: its own trace, ended after it."""
    trace = message_trace(protocol)
    if trace is None:
        yield
        return
    with request_trace(trace):
        yield


def refused(error: GenerationError) -> None:
    """The request is answered with `error` (a refusal, before or instead of a generation):
    its server span, made now if it was not yet, fails with the error's neutral kind."""
    trace = _TRACE.get()
    if trace is not None:
        trace.fail(error.kind.value, error.message)


def mark(trace: Trace | None, name: str) -> None:
    """An event on `trace` (a control protocol's pause, resume, modify, reattach)."""
    if trace is not None:
        trace.event(name)


def finish(
    trace: Trace | None, usage: tuple[int, int] | None = None, reason: str | None = None
) -> None:
    """`trace`'s generation is over (`Trace.done`), its usage as its protocol answers it."""
    if trace is None:
        return
    if usage is not None:
        trace.usage(*usage, [reason] if reason else [])
    trace.done()


def enter_trace(trace: Trace | None) -> None:
    """`trace` current for the rest of the calling task (a task of its own, working for it)."""
    if trace is not None:
        _TRACE.set(trace)


@contextmanager
def with_trace(trace: Trace | None) -> Iterator[None]:
    """`trace` current while the block runs (a task working for it), not ended after it."""
    if trace is None:
        yield
        return
    token = _TRACE.set(trace)
    try:
        yield
    finally:
        _TRACE.reset(token)


@contextmanager
def connection_traced(backend: Backend, headers: Headers, path: str) -> Iterator[None]:
    """A WebSocket's block: its messages' traces continue the upgrade's trace context."""
    token = _CONNECTION.set(_Connection(backend, backend.parent_of(headers), path))
    try:
        yield
    finally:
        _CONNECTION.reset(token)


@contextmanager
def child(
    parent: Span | None, name: str, attributes: Attributes | None = None
) -> Iterator[Span | None]:
    """A child span of `parent` for the block (None, and nothing done, when untraced); an
    exception out of the block is its error."""
    if parent is None:
        yield None
        return
    span = parent.child(name, attributes)
    try:
        yield span
    except GenerationError as e:
        span.fail(e.kind.value, e.message)
        raise
    except Exception as e:
        span.fail(type(e).__name__, str(e))
        raise
    finally:
        span.end()


@dataclass(frozen=True)
class EngineTimings:
    """vLLM's timings of one request, in seconds of the engine core's monotonic clock (0:
    never reached): queued, first scheduled, first token, last token."""

    queued: float
    scheduled: float
    first_token: float
    last_token: float
    preemptions: int = 0


def engine_phases(parent: Span, timings: EngineTimings) -> None:
    """The engine's queue, prefill and decode as `parent`'s children, at the times vLLM saw."""
    offset = time.time_ns() - time.monotonic_ns()  # the core's clock is this host's

    def at(seconds: float) -> int:
        return int(seconds * 1e9) + offset

    phases = (
        ("llm_gateway.engine.queue", timings.queued, timings.scheduled),
        ("llm_gateway.engine.prefill", timings.scheduled, timings.first_token),
        ("llm_gateway.engine.decode", timings.first_token, timings.last_token),
    )
    for name, start, end in phases:
        if start > 0 and end >= start:
            attributes = {"llm_gateway.engine.preemptions": timings.preemptions}
            parent.child(name, attributes if name.endswith("decode") else None, at(start)).end(
                at(end)
            )
