"""The engine while it loads, and while it is rebuilt after it died.

The server accepts connections before the engine is ready. When the engine dies (its
engine-core process exits, or vLLM declares it dead), the holder goes back to loading: /health
answers 503, new requests wait for the engine as they do at start-up, and the same loader
builds a new one. More than `max_restarts` deaths within `restart_window_seconds` and it gives
up: `gave_up` is set and `on_give_up` is called, for the process to exit non-zero.

`wait(through_rebuilds=False)` answers at once while a dead engine is rebuilt (an embedding
model's requests: its family's 503, not a wait as long as a rebuild). `stop()` returns once the
engine is gone: a build still running is cancelled, and a loader that cannot stop its build
(the engines' are built in threads) shuts the engine down as soon as it is built.

A model loaded on demand (gateway/engine_path/residency.py) is `unload`ed when idle: its status
is `unloaded` until `start()` builds it again, and `wait()` asks `demand` for it meanwhile.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol

from typing_extensions import TypeVar

from gateway.engine.contract import Engine
from gateway.engine.cpu_defaults import cpu_flags, reported_flags
from gateway.engine.heap import return_freed_memory
from protocols.errors import ErrorKind, GenerationError

log = logging.getLogger(__name__)


class HeldEngine(Protocol):
    """What the holder needs of an engine: the chat model's (an `Engine`) or an embedding
    model's (PoolingEngine)."""

    dtype: str
    dtype_reason: str

    @property
    def healthy(self) -> bool: ...

    def on_death(self, callback: Callable[[str], None]) -> None: ...

    def death_reason(self) -> str: ...

    def shutdown(self) -> None: ...


E = TypeVar("E", bound=HeldEngine, default=Engine)

_frozen = [False]  # whether the process' first engine froze what the process held


class EngineHolder(Generic[E]):
    """Starts the engine in the background and rebuilds it when it dies; requests made
    meanwhile wait for it."""

    def __init__(
        self,
        load: Callable[[], Awaitable[E]],
        expected_seconds: float = 30.0,
        describe: Callable[[str, str, list[str]], None] | None = None,
        *,
        max_restarts: int = 3,
        restart_window_seconds: float = 600.0,
        on_give_up: Callable[[str], None] | None = None,
        unloaded: bool = False,
        name: str | None = None,
    ) -> None:
        """`describe(dtype, reason, cpu_flags)` is told about each engine once it is ready;
        `on_give_up(reason)` once the engine died more than `max_restarts` times within
        `restart_window_seconds`, or could not be rebuilt. `unloaded`: built on demand, by the
        first `start()`. `name`: the model its errors name (None: "the engine")."""
        self._load = load
        self._describe = describe
        self.expected_seconds = expected_seconds
        self.max_restarts = max_restarts
        self.restart_window_seconds = restart_window_seconds
        self.on_give_up = on_give_up
        self._started = time.monotonic()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._deaths: deque[float] = deque()
        self._stopping = False
        # The last engine built; while it is rebuilt, the dead one (its tokenizer and limits
        # still answer /info and the like).
        self.engine: E | None = None
        self.error: str | None = None
        self._subject = f"The model `{name}`" if name else "The engine"
        self.status = "unloaded" if unloaded else "loading"
        if unloaded:
            self._ready.set()  # a waiter asks `demand` for it
        self.restarts = 0
        self.gave_up = asyncio.Event()
        # Asked by `wait()` for an unloaded engine: loads it (start()) or raises why not.
        self.demand: Callable[[], Awaitable[None]] | None = None

    @property
    def ready(self) -> bool:
        return self.status == "ready" and self.engine is not None and self.engine.healthy

    def describe(self) -> tuple[str, str | None]:
        """(status, error) for health checks: loading (also while rebuilding), ready or failed."""
        self._check()
        return self.status, self.error

    def loading_progress(self) -> tuple[float, float]:
        """(percent, eta_seconds): an estimate from the time loading usually takes."""
        elapsed = time.monotonic() - self._started
        percent = min(99.0, 100.0 * elapsed / self.expected_seconds)
        return round(percent, 1), round(max(1.0, self.expected_seconds - elapsed), 1)

    def start(self) -> None:
        self._started = time.monotonic()
        self._stopping = False
        self.status, self.error = "loading", None
        self._ready.clear()
        self._task = asyncio.create_task(self._build(), name="engine-load")

    async def unload(self) -> None:
        """Shut the engine down until the next `start()`; a build in progress is stopped.
        Whoever waits meanwhile asks `demand` for it again."""
        await self.stop()
        self.engine = None
        self.status, self.error = "unloaded", None
        self._ready.set()  # waiters wake, find it unloaded and ask for it
        # The engine's own cycles (its ZMQ context and threads among them) are collected now:
        # only what was built after the process' first engine is walked (see _build), a few
        # milliseconds where unfreezing and collecting everything stopped the event loop for
        # 0.8-1.2 s (measured, docs/MODELS.md).
        gc.collect()
        await asyncio.to_thread(return_freed_memory)

    @property
    def unloaded(self) -> bool:
        return self.status == "unloaded"

    async def _build(self) -> None:
        try:
            engine = await self._load()
        except Exception as e:  # surfaced through /health and to every waiting request
            if self._stopping:
                return  # stopped meanwhile: nobody waits for it
            reason = f"{type(e).__name__}: {e}"
            if self.restarts:
                log.exception("the engine could not be rebuilt")
                self._give_up(f"the engine could not be rebuilt: {reason}")
            else:
                log.exception("the engine failed to start")
                self.error = reason
                self.status = "failed"
                self._ready.set()
            return
        if self._stopping:  # stopped while a loader that cannot be cancelled built it
            engine.shutdown()
            return
        self.engine = engine
        self.status = "ready"
        self.error = None
        # What the process holds once its first engine is built (vLLM, torch, the tokenizer,
        # the app) lives as long as it does: out of the cyclic collector's reach, whose full
        # passes would otherwise walk all of it while tokens stream (issue 47: up to a third
        # of a step's CPU per token). An engine built later (a model loaded on demand, a
        # rebuild) is not frozen: its garbage stays collectable once it is unloaded, and a
        # pass over it alone takes about a millisecond (measured).
        gc.collect()
        if not _frozen[0]:
            gc.freeze()
            _frozen[0] = True
        self._ready.set()
        if self.restarts:
            log.warning("the engine is serving again (restart %d)", self.restarts)
        if self._describe is not None:
            self._describe(engine.dtype, engine.dtype_reason, reported_flags(cpu_flags()))
        engine.on_death(lambda reason: self._died(engine, reason))

    def _check(self) -> None:
        """An engine found dead before its death was reported is handled the same way."""
        engine = self.engine
        if self.status == "ready" and engine is not None and not engine.healthy:
            self._died(engine, engine.death_reason())

    def _died(self, engine: E, reason: str) -> None:
        if engine is not self.engine or self.status != "ready" or self._stopping:
            return  # an engine already replaced, or shut down on purpose
        now = time.monotonic()
        self._deaths.append(now)
        while self._deaths[0] < now - self.restart_window_seconds:
            self._deaths.popleft()
        self._ready.clear()
        if len(self._deaths) > self.max_restarts:
            self._give_up(
                f"{len(self._deaths)} engine deaths within {self.restart_window_seconds:g} s, "
                f"more than ENGINE_MAX_RESTARTS={self.max_restarts} allows; the last: {reason}"
            )
            return
        self.restarts += 1
        log.error("the engine died (%s); building a new one (restart %d)", reason, self.restarts)
        self.status = "loading"
        self.error = f"the engine died ({reason}); restarting it"
        self._started = now
        self._task = asyncio.create_task(self._rebuild(engine), name="engine-rebuild")

    async def _rebuild(self, dead: E) -> None:
        dead.shutdown()  # vLLM's monitor began this; it frees what the dead engine still holds
        await self._build()

    def _give_up(self, reason: str) -> None:
        log.critical("giving up on the engine: %s", reason)
        self.status = "failed"
        self.error = reason
        self._ready.set()  # every waiting request gets its error
        if self.engine is not None:
            self.engine.shutdown()
        self.gave_up.set()
        if self.on_give_up is not None:
            self.on_give_up(reason)

    @property
    def rebuilding(self) -> bool:
        """A dead engine being replaced (not the first build)."""
        self._check()
        return self.status == "loading" and self.restarts > 0

    async def wait(self, *, through_rebuilds: bool = True) -> E:
        """The engine once it is ready; ENGINE_UNAVAILABLE if it failed, and without
        `through_rebuilds` at once while a dead one is rebuilt."""
        while True:
            if not through_rebuilds and self.rebuilding:
                raise GenerationError(
                    ErrorKind.ENGINE_UNAVAILABLE,
                    f"{self._subject} is not available: {self.error}; try again once it is rebuilt",
                )
            await self._ready.wait()
            self._check()
            if self.ready and self.engine is not None:
                return self.engine
            if self.status == "unloaded":
                if self.demand is None:
                    raise GenerationError(
                        ErrorKind.ENGINE_UNAVAILABLE, f"{self._subject} is unloaded"
                    )
                await self.demand()
                continue
            if self.status != "loading":
                break
        if self.restarts or self.gave_up.is_set():
            message = f"{self._subject} is not available: {self.error}"
        else:
            message = f"{self._subject} failed to start: {self.error}"
        raise GenerationError(ErrorKind.ENGINE_UNAVAILABLE, message)

    async def stop(self) -> None:
        """Stop the engine; return once it is gone, a build in progress included (its loader
        ends it when cancelled: gateway/engine/pooling_engine.py's waits for the thread's
        engine and shuts it down)."""
        self._stopping = True
        if self.status == "loading":  # whoever waits for it is answered now
            self.status, self.error = "failed", "the engine was stopped while it loaded"
            self._ready.set()
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])  # not raising the task's cancellation as this one's
        if self.engine is not None:
            # In a worker thread: vLLM waits for its engine-core process to end, then kills it
            # (engine_args.shutdown_grace_seconds), which on the event loop would stall every
            # other model's streams.
            await asyncio.to_thread(self.engine.shutdown)
