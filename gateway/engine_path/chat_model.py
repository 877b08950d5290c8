"""`ChatModel`: one configured chat model's whole path: its engine holder, what routes may know
of it (ServedModel: tokenizer, chat template, tool parser, context length, adapters), its
generation service with its own admission, and its batch runner. Every model's service shares
the gateway's metrics, deadlines, priority classes, per-key limits and continuation store."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.config.adapters import configured_adapters
from gateway.config.models_file import ChatModelSpec
from gateway.config.priorities import PriorityClasses
from gateway.config.settings import constraint_budget
from gateway.edge.limits import Limiter
from gateway.engine.chat_template import served_chat_template
from gateway.engine.cpu_defaults import resolve_bulk_cap
from gateway.engine.engine_args import device_type
from gateway.engine.holder import EngineHolder
from gateway.engine.loader import EngineLoader
from gateway.engine.tool_calls import ToolParsing
from gateway.engine_path.admission import Admission
from gateway.engine_path.batch import BatchRunner
from gateway.engine_path.deadlines import Deadlines
from gateway.engine_path.generation import GenerationService
from gateway.engine_path.metrics import GatewayMetrics
from gateway.engine_path.sequences import SequenceBounds
from gateway.engine_path.served_model import ServedModel
from gateway.stores.continuation import HistoryStore


@dataclass
class ChatModel:
    spec: ChatModelSpec
    holder: EngineHolder
    served: ServedModel
    service: GenerationService
    batches: BatchRunner
    configured_adapters: tuple[str, ...] = ()  # ADAPTERS' names (its table's), read once
    last_used: float = field(default_factory=time.monotonic)
    memory_bytes: int = 0  # its engine's estimate, once it was loaded

    @property
    def name(self) -> str:
        return self.spec.name

    def touch(self) -> None:
        """A request named it: the least recently used idle model is unloaded first."""
        self.last_used = time.monotonic()

    @property
    def idle(self) -> bool:
        """No prompt in flight or queued, and no load under way."""
        return not self.service.active and self.holder.status != "loading"

    @property
    def resident(self) -> bool:
        """Loaded or loading: its engine holds (or is taking) memory."""
        return self.holder.status in ("ready", "loading")


@dataclass(frozen=True)
class SharedParts:
    """What every model's path shares."""

    metrics: GatewayMetrics
    deadlines: Deadlines
    classes: PriorityClasses
    store: HistoryStore
    limiter: Limiter
    on_give_up: Callable[[str], None] | None = None


def build_chat_model(
    spec: ChatModelSpec,
    load: EngineLoader,
    shared: SharedParts,
    *,
    is_default: bool,
    on_demand: bool,
) -> ChatModel:
    """`spec`'s path, its engine built by `load`: now (`on_demand` False: started here) or on
    its first request. The default model's admission and scheduler are /metrics' gauges; only
    its engine's deaths past ENGINE_MAX_RESTARTS end the gateway."""
    settings = spec.settings
    expected = 30.0 if settings.engine.enforce_eager else 120.0
    holder = EngineHolder(
        load,
        expected,
        shared.metrics.describe_engine if is_default else None,
        max_restarts=settings.engine_max_restarts,
        restart_window_seconds=settings.engine_restart_window_seconds,
        on_give_up=shared.on_give_up if is_default else None,
        unloaded=on_demand,
        name=None if is_default else spec.name,  # the default's errors say "the engine"
    )
    if not on_demand:
        holder.start()
    admission = Admission(
        settings.max_running_requests,
        settings.max_waiting_requests,
        fair=settings.admission_fairness == "caller",
        bulk_priority=settings.engine.bulk_priority,
        # Replicas each hold bulk to the cap in their own engine: one gate cannot know which
        # replica a request ahead of bulk is on, so it applies no cap of its own.
        bulk_max_running=0
        if settings.engine_replicas
        else resolve_bulk_cap(settings.engine.bulk_max_running, device_type()),
    )
    chat_template = served_chat_template(settings)
    service = GenerationService(
        holder,
        admission,
        shared.metrics,
        shared.deadlines,
        shared.classes,
        SequenceBounds.of(settings),
        chat_template,
        constraint_budget(settings),
        shared.limiter,
        watched=is_default,
        model=spec.name,
    )
    served = ServedModel(holder, settings.engine, ToolParsing.configured(settings), chat_template)
    batches = BatchRunner(service, shared.store, model=spec.name)
    adapters = tuple(configured_adapters(settings.engine))
    return ChatModel(spec, holder, served, service, batches, adapters)
