"""The Starlette application: one engine, every protocol's routes, a typed lifespan state."""

from __future__ import annotations

import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware

from gateway.config.priorities import PriorityClasses
from gateway.config.settings import (
    ConfigError,
    Settings,
    constraint_budget,
    embedding_model_name,
    models_to_load,
)
from gateway.drain import Drain, DrainMiddleware
from gateway.edge.api_keys import KeyRing
from gateway.edge.auth import ApiKeyMiddleware, open_paths_of
from gateway.edge.body_limit import BodyLimitMiddleware
from gateway.edge.feedback_limits import FeedbackLimits
from gateway.edge.limits import Limits
from gateway.edge.origins import OriginMiddleware, parse_origins
from gateway.edge.refusals import unrouted
from gateway.engine.chat_template import served_chat_template
from gateway.engine.cpu_defaults import resolve_bulk_cap
from gateway.engine.engine_args import device_type
from gateway.engine.holder import EngineHolder
from gateway.engine.loader import EngineLoader, local_loader
from gateway.engine.pooling_engine import PoolingLoader, pooling_loader
from gateway.engine.tool_calls import ToolParsing
from gateway.engine_path.admission import Admission
from gateway.engine_path.background import Background
from gateway.engine_path.batch import BatchRunner
from gateway.engine_path.deadlines import Deadlines
from gateway.engine_path.generation import GenerationService
from gateway.engine_path.metrics import GatewayMetrics
from gateway.engine_path.model_registry import (
    EMBEDDING_START_SECONDS,
    ModelRefused,
    ModelRegistry,
)
from gateway.engine_path.reattach import Detached
from gateway.engine_path.sequences import SequenceBounds
from gateway.engine_path.served_model import ServedModel
from gateway.http.admin import ADMIN_PATHS
from gateway.routes import ROUTES
from gateway.state import Gateway
from gateway.stores.configured import open_event_log, open_store
from gateway.stores.feedback import FeedbackStore, feedback_path
from protocols.names import Protocol


def default_loader(settings: Settings) -> EngineLoader:
    if settings.engine_replicas:  # the engine on Ray actors (docs/SCALE-OUT.md)
        from gateway.engine.replicas import replica_loader

        return replica_loader(settings)
    return local_loader(settings)


def create_app(
    settings: Settings,
    load: EngineLoader | None = None,
    *,
    owns_engine: bool = True,
    on_give_up: Callable[[str], None] | None = None,
    load_embedding: PoolingLoader | None = None,
) -> Starlette:
    """`load` defaults to building the configured engine; tests pass a shared one, and
    `load_embedding` for the embedding model's (else EMBEDDING_MODEL's, when set).
    `on_give_up(reason)`: an engine died more often than ENGINE_MAX_RESTARTS allows."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Gateway]]:
        # Start-up as measured on 2 cores (docs/BENCHMARKS.md): the status messages' estimate.
        expected = 30.0 if settings.engine.enforce_eager else 120.0
        metrics = GatewayMetrics()
        holder = EngineHolder(
            load or default_loader(settings),
            expected,
            metrics.describe_engine,
            max_restarts=settings.engine_max_restarts,
            restart_window_seconds=settings.engine_restart_window_seconds,
            on_give_up=on_give_up,
        )
        metrics.engine_restarts.set_function(lambda: holder.restarts)
        holder.start()
        admission = Admission(
            settings.max_running_requests,
            settings.max_waiting_requests,
            fair=settings.admission_fairness == "caller",
            bulk_priority=settings.engine.bulk_priority,
            # Replicas each hold bulk to the cap in their own engine: one gate cannot know
            # which replica a request ahead of bulk is on, so it applies no cap of its own.
            bulk_max_running=0
            if settings.engine_replicas
            else resolve_bulk_cap(settings.engine.bulk_max_running, device_type()),
        )
        store = open_store(settings)
        metrics.engine_requests.set_function(
            lambda: holder.engine.unfinished_requests() if holder.engine is not None else 0
        )
        bounds = SequenceBounds.of(settings)
        service = GenerationService(
            holder,
            admission,
            metrics,
            deadlines,
            classes,
            bounds,
            chat_template,
            constraint_budget(settings),
        )
        feedback = FeedbackStore(feedback_path(settings), settings.feedback_max_db_bytes)
        feedback_limits = FeedbackLimits(
            settings.feedback_max_text_bytes, settings.feedback_per_minute
        )
        batches = BatchRunner(service, store)
        detached = Detached(settings.reattach_seconds, settings.max_running_requests)
        drain.on_draining(detached.stop_all)
        background = Background(open_event_log(settings, store))
        drain.on_drained(background.settled)  # their terminal events kept before the exit
        served = ServedModel(holder, settings.engine, tool_parsing, chat_template)
        models = ModelRegistry(served, settings, admission, service.limiter, metrics)
        if load_embedding is not None or settings.embedding_model:
            embedding_holder = EngineHolder(
                load_embedding or pooling_loader(settings),
                EMBEDDING_START_SECONDS,
                max_restarts=settings.engine_max_restarts,
                restart_window_seconds=settings.engine_restart_window_seconds,
                on_give_up=on_give_up,
            )
            embedding_holder.start()
            models.add_at_startup(embedding_holder, embedding_model_name(settings))
        for name, url in models_to_load(settings):
            try:
                await models.register(name, url, synchronous=False, at_startup=True)
            except ModelRefused as e:
                raise ConfigError(f"LOAD_MODELS: {e.message}") from e
        gateway = Gateway(
            settings,
            served,
            service,
            batches,
            feedback,
            feedback_limits,
            drain,
            detached,
            background,
            models,
        )
        app.state.gateway = gateway
        try:
            yield {"gateway": gateway}
        finally:
            await detached.stop_all()  # an exit without the drain (SIGINT) stops them too
            await background.close()
            await store.close()
            await models.stop(handed_in_too=owns_engine)
            if owns_engine:
                await holder.stop()

    deadlines = Deadlines(settings.request_timeout_seconds)
    chat_template = served_chat_template(settings)
    tool_parsing = ToolParsing.configured(settings)
    classes = PriorityClasses(
        {Protocol(name): n for name, n in settings.priority_classes.items()},
        enabled=settings.engine.scheduling_policy == "priority",
    )
    drain = Drain(deadlines, settings.drain_seconds)
    limits = Limits(
        settings.limit_concurrent_requests,
        settings.limit_requests_per_minute,
        settings.limit_tokens_per_minute,
    )
    ring = KeyRing(settings.api_keys, settings.api_keys_file, limits)
    if settings.api_keys_file and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, lambda _signum, _frame: ring.reload())
    open_paths = open_paths_of(settings.auth_open_paths, metrics_public=settings.metrics_public)
    open_paths |= ADMIN_PATHS  # their own key check: ADMIN_API_KEYS (gateway/http/admin.py)
    middleware = [  # the first is the outermost
        Middleware(OriginMiddleware, allowed=parse_origins(settings.allowed_origins)),
        Middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes),
        Middleware(ApiKeyMiddleware, ring=ring, open_paths=open_paths, limits=limits),
        Middleware(DrainMiddleware, drain=drain),
    ]
    return Starlette(
        routes=ROUTES,
        lifespan=lifespan,
        middleware=middleware,
        exception_handlers={404: unrouted, 405: unrouted},
    )
