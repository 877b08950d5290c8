"""The engine while it loads: the server accepts connections before the engine is ready."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from gateway.cpu_defaults import cpu_flags, reported_flags
from gateway.engine import Engine
from protocols.errors import ErrorKind, GenerationError

log = logging.getLogger(__name__)


class EngineHolder:
    """Starts the engine in the background; requests made meanwhile wait for it."""

    def __init__(
        self,
        load: Callable[[], Awaitable[Engine]],
        expected_seconds: float = 30.0,
        describe: Callable[[str, str, list[str]], None] | None = None,
    ) -> None:
        """`describe(dtype, reason, cpu_flags)` is told about the engine once it is ready."""
        self._load = load
        self._describe = describe
        self.expected_seconds = expected_seconds
        self._started = time.monotonic()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.engine: Engine | None = None
        self.error: str | None = None
        self.status = "loading"

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.engine.healthy

    def describe(self) -> tuple[str, str | None]:
        """(status, error) for health checks: loading, ready or failed."""
        if self.engine is not None and not self.engine.healthy:
            return "failed", "the engine stopped running"
        return self.status, self.error

    def loading_progress(self) -> tuple[float, float]:
        """(percent, eta_seconds): an estimate from the time loading usually takes."""
        elapsed = time.monotonic() - self._started
        percent = min(99.0, 100.0 * elapsed / self.expected_seconds)
        return round(percent, 1), round(max(1.0, self.expected_seconds - elapsed), 1)

    def start(self) -> None:
        self._started = time.monotonic()
        self._task = asyncio.create_task(self._run(), name="engine-load")

    async def _run(self) -> None:
        try:
            self.engine = engine = await self._load()
            self.status = "ready"
            if self._describe is not None:
                self._describe(engine.dtype, engine.dtype_reason, reported_flags(cpu_flags()))
        except Exception as e:  # surfaced through /health and to every waiting request
            log.exception("the engine failed to start")
            self.error = f"{type(e).__name__}: {e}"
            self.status = "failed"
        finally:
            self._ready.set()

    async def wait(self) -> Engine:
        await self._ready.wait()
        if self.engine is None:
            raise GenerationError(
                ErrorKind.ENGINE_UNAVAILABLE, f"The engine failed to start: {self.error}"
            )
        return self.engine

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.engine is not None:
            self.engine.shutdown()
