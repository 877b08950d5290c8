"""Prometheus metrics, one registry per app, served at GET /metrics.

The generation service hands each engine request a `StreamMeter` for its protocol.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge, Histogram, Info
from prometheus_client import Counter as PromCounter

from gateway.config.priorities import MAX_PRIORITY
from gateway.engine_path.input_window import Entry
from gateway.observability.tracing import Span

if TYPE_CHECKING:
    from gateway.engine.scheduler_view import SchedulerView
    from gateway.engine_path.admission import Admission

BASE = "base"  # the `adapter` label of the base model's requests
# Inputs ahead in an embedding engine: its window holds two batches (128 inputs by default)
_AHEAD_BUCKETS = (0, 16, 32, 64, 96, 128, 256, 512, 1024, 2048)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)


class StreamMeter:
    """Times one engine request: first output, each next output, and the end; `outcome` is
    "cancelled" until the request finishes ("ok") or fails (its error kind)."""

    __slots__ = (
        "_adapter",
        "_first",
        "_itl",
        "_last",
        "_metrics",
        "_model",
        "_priority",
        "_protocol",
        "_start",
        "_tokens",
        "outcome",
        "span",
    )

    def __init__(
        self,
        metrics: GatewayMetrics,
        protocol: str,
        priority: int = 0,
        adapter: str = BASE,
        model: str | None = None,
    ) -> None:
        self._metrics = metrics
        self._model = model
        self._protocol = protocol
        self._adapter = adapter
        self._priority = str(priority)
        self._start = self._last = time.perf_counter()
        self._first = True
        self._tokens = 0
        self._itl = metrics.inter_token.labels(protocol)
        self.outcome = "cancelled"
        self.span: Span | None = None  # the prompt's, when traced

    def started(self, prompt_tokens: int) -> None:
        """The engine request was submitted: `ended` must follow."""
        self._start = self._last = time.perf_counter()
        self._metrics.active_streams.inc()
        self._metrics.prompt_tokens.labels(self._protocol).inc(prompt_tokens)

    def step(self, new_tokens: int, cached_tokens: int, finished: bool) -> None:
        now = time.perf_counter()
        if finished:
            self.outcome = "ok"
        if self._first:
            self._first = False
            self._metrics.ttft.labels(self._protocol).observe(now - self._start)
            self._metrics.ttft_by_class.labels(self._priority).observe(now - self._start)
            self._metrics.cached_prompt_tokens.labels(self._protocol).inc(cached_tokens)
        else:
            self._itl.observe(now - self._last)
        self._last = now
        self._tokens += new_tokens

    def ended(self) -> None:
        metrics = self._metrics
        metrics.active_streams.dec()
        metrics.requests.labels(self._protocol, self.outcome).inc()
        if self.outcome != "ok":  # closing an unfinished engine stream aborts its request
            metrics.engine_aborts.labels(self._protocol).inc()
        metrics.e2e.labels(self._protocol).observe(time.perf_counter() - self._start)
        metrics.generated_tokens.labels(self._protocol).inc(self._tokens)
        metrics.adapter_requests.labels(self._adapter, self.outcome).inc()
        metrics.adapter_generated_tokens.labels(self._adapter).inc(self._tokens)
        if self._model is not None:
            metrics.model_requests.labels(self._model, "generate", self.outcome).inc()


class ModelMeter:
    """Counts one model's requests beside the chat model's (an embedding model's, by its
    name): each ended with its outcome, the inputs and tokens it embedded, its time."""

    __slots__ = ("_ahead", "_inputs", "_metrics", "_model", "_seconds", "_task", "_tokens")

    def __init__(self, metrics: GatewayMetrics, model: str, task: str) -> None:
        self._metrics, self._model, self._task = metrics, model, task
        self._inputs = metrics.model_inputs.labels(model)
        self._tokens = metrics.model_tokens.labels(model)
        self._seconds = metrics.model_seconds.labels(model)
        self._ahead = metrics.model_inputs_ahead.labels(model)

    def entered(self, entry: Entry) -> None:
        """An input went into the engine with `entry.ahead` inputs before it."""
        self._ahead.observe(entry.ahead)

    def ended(self, outcome: str, inputs: int, tokens: int, seconds: float) -> None:
        self._metrics.model_requests.labels(self._model, self._task, outcome).inc()
        self._inputs.inc(inputs)
        self._tokens.inc(tokens)
        self._seconds.observe(seconds)


class PromptEnding:
    """A prompt counted in; `end(kind)` counts it out, once, however many times it is told."""

    __slots__ = ("_ended", "_metrics", "_protocol")

    def __init__(self, metrics: GatewayMetrics, protocol: str) -> None:
        self._metrics = metrics
        self._protocol = protocol
        self._ended = False
        metrics.prompts_accepted.labels(protocol).inc()

    def end(self, kind: str) -> None:
        if not self._ended:
            self._ended = True
            self._metrics.terminal_events.labels(self._protocol, kind).inc()


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        counter, gauge = partial(PromCounter, registry=r), partial(Gauge, registry=r)
        histogram = partial(Histogram, labelnames=["protocol"], registry=r)
        by_protocol = partial(PromCounter, labelnames=["protocol"], registry=r)
        self.requests = counter(
            "gateway_requests",
            "Engine requests by protocol and outcome (ok, cancelled: the "
            "client stopped listening, or an error kind)",
            ["protocol", "outcome"],
        )
        self.ttft = histogram(
            "gateway_time_to_first_token_seconds", "Time to first token", buckets=_LATENCY_BUCKETS
        )
        self.ttft_by_class = Histogram(
            "gateway_class_time_to_first_token_seconds",
            "Time to first token by priority class (docs/PRIORITIES.md)",
            ["priority"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "gateway_class_queue_seconds",
            "Time waiting for admission, by priority class",
            ["priority"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inter_token = histogram(
            "gateway_inter_token_seconds", "Time between outputs", buckets=_TOKEN_BUCKETS
        )
        self.e2e = histogram(
            "gateway_request_seconds", "End-to-end engine request time", buckets=_LATENCY_BUCKETS
        )
        self.prompt_tokens = by_protocol(
            "gateway_prompt_tokens", "Prompt tokens sent to the engine"
        )
        self.cached_prompt_tokens = by_protocol(
            "gateway_prompt_tokens_cached", "Prompt tokens served from the prefix cache"
        )
        self.generated_tokens = by_protocol("gateway_generated_tokens", "Tokens generated")
        self.adapter_requests = counter(
            "gateway_adapter_requests",
            "Engine requests by LoRA adapter (`base`: none) and outcome (docs/ADAPTERS.md)",
            ["adapter", "outcome"],
        )
        self.adapter_generated_tokens = counter(
            "gateway_adapter_generated_tokens",
            "Tokens generated by LoRA adapter (`base`: none)",
            ["adapter"],
        )
        self.model_requests = counter(
            "gateway_model_requests",
            "Requests by model, task (generate, embed) and outcome (ok, cancelled or an error "
            "kind); by protocol: gateway_requests and gateway_adapter_requests",
            ["model", "task", "outcome"],
        )
        self.model_inputs = counter(
            "gateway_model_inputs", "Texts embedded or scored, by model", ["model"]
        )
        self.model_tokens = counter("gateway_model_tokens", "Tokens embedded, by model", ["model"])
        self.model_seconds = Histogram(
            "gateway_model_request_seconds",
            "A model's time per request, its wait for admission included, by model",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.model_inputs_ahead = Histogram(
            "gateway_model_inputs_ahead",
            "Inputs already in the engine as an embedding input goes in (computed before it), "
            "by model",
            ["model"],
            buckets=_AHEAD_BUCKETS,
            registry=r,
        )
        self.active_streams = gauge("gateway_active_streams", "Engine requests in progress")
        self.connections = gauge(
            "gateway_websocket_connections", "Open WebSocket connections", ["protocol"]
        )
        self.not_reading_closes = by_protocol(
            "gateway_not_reading_closes",
            "Connections whose client did not read: more than MAX_QUEUED_BYTES_PER_CONNECTION "
            "waited for it, so its generations ended (a WebSocket closed with 1008)",
        )
        self.continuation = counter(
            "gateway_continuation",
            "Prompts whose request_id key was known (hit) or not (miss)",
            ["result"],
        )
        self.prompts_accepted = by_protocol(
            "gateway_prompts_accepted", "Prompts handed to the generation service"
        )
        self.terminal_events = counter(
            "gateway_terminal_events",
            "How each accepted prompt ended: finished, an error kind (the terminal error event "
            "its protocol sent), or client_gone (its client left before the end)",
            ["protocol", "kind"],
        )
        self.engine_aborts = by_protocol(
            "gateway_engine_aborts", "Engine requests aborted before they finished"
        )
        self.engine_requests = gauge(
            "gateway_engine_requests", "Requests the engine holds, as the engine counts them"
        )
        self.engine_preemptions = gauge(
            "gateway_engine_preemptions",
            "Requests the engine preempted since it started (each recomputed later): for room "
            "in the KV cache (the bulk cap's paused requests among them when it is 90% full)",
        )
        self.engine_running = gauge(
            "gateway_engine_running", "The engine's running batch, as its scheduler last said"
        )
        self.engine_waiting = gauge(
            "gateway_engine_waiting",
            "Requests waiting inside the engine (new, preempted, or bulk held back or paused by "
            "BULK_MAX_RUNNING), as its scheduler last said",
        )
        self.engine_restarts = gauge(
            "gateway_engine_restarts", "Times the engine died and was rebuilt in this process"
        )
        self.queue_depth = gauge("gateway_queue_depth", "Requests waiting for admission")
        self.queue_depth_by_class = gauge(
            "gateway_class_queue_depth",
            "Requests waiting for admission, by priority class",
            ["priority"],
        )
        self.running_by_class = gauge(
            "gateway_class_running_requests", "Requests admitted, by priority class", ["priority"]
        )
        self.running = gauge("gateway_running_requests", "Requests admitted to the engine")
        self.engine = Info(
            "gateway_engine",
            "The engine's dtype, why it was chosen, and the CPU's flags",
            registry=r,
        )

    def meter(
        self,
        protocol: str,
        priority: int = 0,
        adapter: str | None = None,
        model: str | None = None,
    ) -> StreamMeter:
        return StreamMeter(self, protocol, priority, adapter or BASE, model)

    def model_meter(self, model: str, task: str) -> ModelMeter:
        return ModelMeter(self, model, task)

    def prompt_accepted(self, protocol: str) -> PromptEnding:
        return PromptEnding(self, protocol)

    def describe_engine(self, dtype: str, reason: str, cpu_flags: list[str]) -> None:
        self.engine.info({"dtype": dtype, "dtype_reason": reason, "cpu_flags": " ".join(cpu_flags)})

    def watch_admission(self, admission: Admission) -> None:
        self.queue_depth.set_function(lambda: admission.waiting)
        self.running.set_function(lambda: admission.running)
        for priority in range(MAX_PRIORITY + 1):
            label = str(priority)
            self.queue_depth_by_class.labels(label).set_function(
                partial(_count, admission.waiting_by_class, priority)
            )
            self.running_by_class.labels(label).set_function(
                partial(_count, admission.running_by_class, priority)
            )

    def watch_scheduler(self, current: Callable[[], SchedulerView | None]) -> None:
        """The engine's own scheduler figures, from whichever engine is current."""
        for gauge, field in (
            (self.engine_preemptions, "preemptions"),
            (self.engine_running, "running"),
            (self.engine_waiting, "waiting"),
        ):
            gauge.set_function(partial(_scheduler_figure, current, field))


def _scheduler_figure(current: Callable[[], SchedulerView | None], field: str) -> float:
    view = current()
    return float(getattr(view, field)) if view is not None else 0.0


def _count(counts: Callable[[], Counter[int]], key: int) -> float:
    return counts()[key]
