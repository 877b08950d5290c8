"""The Starlette application: the chat models' engines, every protocol's routes, a typed
lifespan state."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware

from gateway.config.models_file import configured_models, registered_spec
from gateway.config.priorities import PriorityClasses
from gateway.config.settings import (
    ConfigError,
    Settings,
    embedding_model_name,
    models_to_load,
)
from gateway.drain import Drain, DrainMiddleware
from gateway.edge.api_keys import KeyRing
from gateway.edge.auth import ApiKeyMiddleware, open_paths_of
from gateway.edge.body_limit import BodyLimitMiddleware
from gateway.edge.feedback_limits import FeedbackLimits
from gateway.edge.limits import Limiter, Limits
from gateway.edge.origins import OriginMiddleware, parse_origins
from gateway.edge.refusals import unrouted
from gateway.engine.holder import EngineHolder
from gateway.engine.loader import EngineLoader, local_loader
from gateway.engine.pooling_engine import PoolingLoader, pooling_loader
from gateway.engine_path.background import Background
from gateway.engine_path.chat_model import ChatModel, SharedParts, build_chat_model
from gateway.engine_path.chat_models import ChatModels
from gateway.engine_path.deadlines import Deadlines
from gateway.engine_path.metrics import GatewayMetrics
from gateway.engine_path.model_registry import (
    EMBEDDING_START_SECONDS,
    ModelRefused,
    ModelRegistry,
)
from gateway.engine_path.reattach import Detached
from gateway.engine_path.residency import Residency
from gateway.http.admin import ADMIN_PATHS
from gateway.observability.server_spans import TracingMiddleware, tracing_of
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
        metrics = GatewayMetrics()
        store = open_store(settings)
        shared = SharedParts(metrics, deadlines, classes, store, Limiter(), on_give_up)
        configured = configured_models(settings)
        chat_models = []
        for spec in configured.models:
            is_default = spec.name == configured.default
            loader = load if is_default and load is not None else default_loader(spec.settings)
            chat_models.append(
                build_chat_model(
                    spec, loader, shared, is_default=is_default, on_demand=not is_default
                )
            )
        default = next(m for m in chat_models if m.name == configured.default)
        holder = default.holder
        metrics.engine_restarts.set_function(lambda: holder.restarts)
        metrics.engine_requests.set_function(
            lambda: holder.engine.unfinished_requests() if holder.engine is not None else 0
        )
        registry: list[ModelRegistry] = []  # the residency counts the embedding engines' memory
        residency = Residency(chat_models, settings, metrics, lambda: registry[0].embedding_bytes())
        chats = ChatModels(chat_models, configured.default, residency)
        feedback = FeedbackStore(feedback_path(settings), settings.feedback_max_db_bytes)
        feedback_limits = FeedbackLimits(
            settings.feedback_max_text_bytes, settings.feedback_per_minute
        )
        detached = Detached(settings.reattach_seconds, settings.max_running_requests)
        drain.on_draining(detached.stop_all)
        background = Background(open_event_log(settings, store))
        drain.on_drained(background.settled)  # their terminal events kept before the exit

        def registered(name: str, source: str) -> ChatModel:
            spec = registered_spec(name, source, settings)
            loader = default_loader(spec.settings)
            return build_chat_model(spec, loader, shared, is_default=False, on_demand=True)

        models = ModelRegistry(
            chats, settings, default.service.admission, shared.limiter, metrics, registered
        )
        registry.append(models)
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
            chats,
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
            await residency.stop()
            await models.stop(handed_in_too=owns_engine)
            for chat in chats:
                if owns_engine or chat is not default:
                    await chat.holder.stop()
            if tracing is not None:
                await asyncio.to_thread(tracing.shutdown)  # the last spans exported

    deadlines = Deadlines(settings.request_timeout_seconds)
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
    # OTEL_EXPORTER_OTLP_ENDPOINT: each request's trace (docs/OBSERVABILITY.md), this app's own
    tracing = tracing_of(settings)
    traced = [Middleware(TracingMiddleware, backend=tracing)] if tracing is not None else []
    middleware = [  # the first is the outermost
        *traced,
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
