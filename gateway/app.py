"""The Starlette application: one engine, every protocol's routes, a typed lifespan state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import cast

from starlette.applications import Starlette
from starlette.requests import HTTPConnection

from gateway.admission import Admission
from gateway.config import Settings
from gateway.continuation import ContinuationStore
from gateway.engine import Engine
from gateway.engine_holder import EngineHolder
from gateway.generation import GenerationService

EngineLoader = Callable[[], Awaitable[Engine]]


@dataclass(frozen=True)
class Gateway:
    """What every route needs, handed to it through the lifespan state."""

    settings: Settings
    holder: EngineHolder
    service: GenerationService


def gateway_of(connection: HTTPConnection) -> Gateway:
    return cast(Gateway, connection.state.gateway)


def gateway_of_app(app: Starlette) -> Gateway:
    """The running app's gateway, for introspection outside a request (tests, metrics)."""
    return cast(Gateway, app.state.gateway)


def default_loader(settings: Settings) -> EngineLoader:
    async def load() -> Engine:
        model = settings.engine.model
        if not model:
            from gateway.default_model import prepare_default_model

            model = str(await asyncio.to_thread(prepare_default_model))
        return await Engine.start(settings.engine, model)

    return load


def create_app(
    settings: Settings, load: EngineLoader | None = None, *, owns_engine: bool = True
) -> Starlette:
    """`load` defaults to building the configured engine; tests pass a shared one."""
    from gateway.routes import ROUTES

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Gateway]]:
        holder = EngineHolder(load or default_loader(settings))
        holder.start()
        admission = Admission(settings.max_running_requests, settings.max_waiting_requests)
        store = ContinuationStore(
            settings.continuation_max_entries, settings.continuation_idle_seconds
        )
        gateway = Gateway(settings, holder, GenerationService(holder, admission, store))
        app.state.gateway = gateway
        try:
            yield {"gateway": gateway}
        finally:
            if owns_engine:
                await holder.stop()

    return Starlette(routes=ROUTES, lifespan=lifespan)
