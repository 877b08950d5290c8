"""How an engine is built: `EngineLoader` (any `Engine`), and the one for an engine in this
process (a `VllmEngine`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import msgspec

from gateway.config.settings import Settings, served_model_name
from gateway.engine.contract import Engine
from gateway.engine.vllm_engine import VllmEngine

EngineLoader = Callable[[], Awaitable[Engine]]


def local_loader(settings: Settings) -> Callable[[], Awaitable[VllmEngine]]:
    """The engine in this process: the configured model, or the default one prepared once."""

    async def load() -> VllmEngine:
        model = settings.engine.model
        if not model:
            from gateway.engine.default_model import prepare_default_model

            model = str(await asyncio.to_thread(prepare_default_model))
        named = msgspec.structs.replace(
            settings.engine, served_model_name=served_model_name(settings.engine)
        )
        return await VllmEngine.start(named, model)

    return load
