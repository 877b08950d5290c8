"""`Residency`: which chat models are loaded, within MODEL_MEMORY_GIB and MAX_LOADED_MODELS
(docs/MODELS.md).

A model not loaded is loaded when a request asks for its engine (EngineHolder.demand), one load
at a time. To make room, the least recently used idle model is unloaded first: never one with
a prompt in flight or queued, never a pinned one. When only busy models stand in the way the
load waits for one to go idle; when nothing could ever make room it is refused at once with the
figures. A request waits at most MODEL_LOAD_TIMEOUT_SECONDS for its model (then a 503 saying it
is loading; the load goes on). A model idle for its keep_alive is unloaded (0: right after its
last prompt; -1: never). Each engine is vLLM's, its engine core in a process of its own: a load
runs there and in a worker thread, not on the event loop serving the loaded models.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram

from gateway.config.models_file import DEFAULT_SOURCE
from gateway.config.settings import Settings
from gateway.engine.model_memory import GIB, available_bytes, chat_engine_bytes
from gateway.engine_path.chat_model import ChatModel
from gateway.engine_path.generation import LOAD_PRIORITY
from gateway.engine_path.metrics import GatewayMetrics
from protocols.errors import ErrorKind, GenerationError
from protocols.keep_alive import FOREVER

log = logging.getLogger(__name__)
_LOAD_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


class LoadRefused(GenerationError):
    """A load that cannot fit with nothing to unload (DJL's API answers it 507)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.ENGINE_UNAVAILABLE, message)


class _PriorityGate:
    """One holder at a time; waiters in priority order (lower first), then arrival."""

    def __init__(self) -> None:
        self._held = False
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    async def acquire(self, priority: int) -> None:
        if not self._held and not self._waiting:
            self._held = True
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._arrivals), turn))
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()  # handed the gate as it was cancelled: pass it on
            raise

    def release(self) -> None:
        while self._waiting:
            _, _, turn = heapq.heappop(self._waiting)
            if not turn.done():
                turn.set_result(None)
                return
        self._held = False


class _Metrics:
    def __init__(self, metrics: GatewayMetrics) -> None:
        r = metrics.registry
        self.loaded = Gauge("gateway_models_loaded", "Chat models loaded (or loading)", registry=r)
        self.loads = Counter(
            "gateway_model_loads",
            "Chat model loads by model and outcome",
            ["model", "outcome"],
            registry=r,
        )
        self.load_seconds = Histogram(
            "gateway_model_load_seconds",
            "A chat model's load, to its engine ready, by model",
            ["model"],
            buckets=_LOAD_BUCKETS,
            registry=r,
        )
        self.unloads = Counter(
            "gateway_model_unloads",
            "Chat model unloads by model and reason (idle, evicted, admin)",
            ["model", "reason"],
            registry=r,
        )
        self.waiting = Gauge(
            "gateway_model_load_waiting", "Requests waiting for their model's load", registry=r
        )
        self.bytes = Gauge(
            "gateway_model_memory_bytes",
            "A loaded model's engine memory, by its estimate",
            ["model"],
            registry=r,
        )


class Residency:
    def __init__(
        self,
        models: Sequence[ChatModel],
        settings: Settings,
        metrics: GatewayMetrics,
        other_engines_bytes: Callable[[], int] = lambda: 0,
    ) -> None:
        """`other_engines_bytes`: what the embedding models' engines hold, by their estimate,
        counted against the same budget."""
        self._models = list(models)
        self._settings = settings
        self._other_bytes = other_engines_bytes
        self._metrics = _Metrics(metrics)
        self._metrics.loaded.set_function(lambda: sum(m.resident for m in self._models))
        self._one_load = _PriorityGate()
        self._loads: dict[str, asyncio.Task[None]] = {}
        self._waiters: dict[str, int] = {}  # requests waiting for each model's load
        self._idled = asyncio.Event()  # set whenever a model goes idle
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._kept: dict[str, float] = {}  # a request's keep_alive, over the model's own
        self._unloading: set[asyncio.Task[None]] = set()
        for model in self._models:
            self._watch(model)

    def _watch(self, model: ChatModel) -> None:
        model.holder.demand = partial(self._demanded, model)
        model.service.on_idle = partial(self._went_idle, model)

    def add(self, model: ChatModel) -> None:
        self._models.append(model)
        self._watch(model)

    async def remove(self, model: ChatModel) -> None:
        if model in self._models:
            self._models.remove(model)
        timer = self._timers.pop(model.name, None)
        if timer is not None:
            timer.cancel()
        load = self._loads.pop(model.name, None)
        if load is not None:
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
        if model.resident:
            self._metrics.unloads.labels(model.name, "admin").inc()
        await model.holder.stop()
        self._metrics.bytes.labels(model.name).set(0)

    # --- loading ------------------------------------------------------------------------------

    async def _demanded(self, model: ChatModel) -> None:
        """Its engine was asked for while it is unloaded: load it (or join its load), waiting at
        most MODEL_LOAD_TIMEOUT_SECONDS."""
        model.touch()
        load = self._loads.get(model.name)
        if load is None or load.done():
            priority = LOAD_PRIORITY.get()
            load = asyncio.create_task(self._load(model, priority), name=f"load-{model.name}")
            load.add_done_callback(_retrieved)  # its refusal is its waiters' (maybe none now)
            self._loads[model.name] = load
        timeout = self._settings.model_load_timeout_seconds
        self._metrics.waiting.inc()
        self._waiters[model.name] = self._waiters.get(model.name, 0) + 1
        try:
            await asyncio.wait_for(asyncio.shield(load), timeout)
        except TimeoutError:
            raise GenerationError(
                ErrorKind.ENGINE_UNAVAILABLE,
                f"The model `{model.name}` is loading (past MODEL_LOAD_TIMEOUT_SECONDS, "
                f"{timeout:g} s); try again shortly",
            ) from None
        finally:
            self._metrics.waiting.dec()
            self._waiters[model.name] -= 1
            if not self._waiters[model.name] and not load.done() and model.holder.unloaded:
                load.cancel()  # nobody waits for a load still waiting for room: it gives way

    async def _load(self, model: ChatModel, priority: int) -> None:
        await self._one_load.acquire(priority)
        try:
            await self._loaded(model)
        finally:
            self._one_load.release()

    async def _loaded(self, model: ChatModel) -> None:
        """Make room for the model, then build its engine."""
        if not model.holder.unloaded:
            return  # loaded meanwhile
        need = await asyncio.to_thread(_estimate, model)
        try:
            await self._make_room(model, need)
        except LoadRefused:
            self._metrics.loads.labels(model.name, "refused").inc()
            raise
        model.memory_bytes = need
        started = time.monotonic()
        log.info("loading the model %s (about %.2f GiB)", model.name, need / GIB)
        model.holder.start()
        try:
            await model.holder.wait()
        except GenerationError:
            self._metrics.loads.labels(model.name, "failed").inc()
            log.error("the model %s failed to load: %s", model.name, model.holder.error)
            return  # its requests get the holder's error
        self._metrics.loads.labels(model.name, "loaded").inc()
        self._metrics.load_seconds.labels(model.name).observe(time.monotonic() - started)
        self._metrics.bytes.labels(model.name).set(need)
        self._went_idle(model)  # its keep_alive runs from now if nothing asks for it

    async def _make_room(self, model: ChatModel, need: int) -> None:
        """Unload idle models (least recently used first) until `need` more bytes and one more
        model fit; wait for a busy one to go idle when only busy ones stand in the way."""
        budget = int(self._settings.model_memory_gib * GIB)
        cap = self._settings.max_loaded_models
        reserve = int(self._settings.model_load_reserve_gib * GIB)
        freed = 0
        while True:
            others = [m for m in self._models if m is not model and m.resident]
            held = sum(m.memory_bytes for m in others) + self._other_bytes()
            available = available_bytes()
            short: list[str] = []
            if cap and len(others) >= cap:
                short.append(f"{len(others)} models loaded, MAX_LOADED_MODELS is {cap}")
            if budget and held + need > budget:
                short.append(
                    f"the loaded engines hold {held / GIB:.2f} GiB of MODEL_MEMORY_GIB's "
                    f"{budget / GIB:g} GiB"
                )
            if not budget and available is not None and need > available + freed - reserve:
                short.append(
                    f"the machine has {available / GIB:.2f} GiB available, "
                    f"{reserve / GIB:.2f} GiB of it kept in reserve (MODEL_LOAD_RESERVE_GIB)"
                )
            if not short:
                return
            unpinned = [m for m in others if not m.spec.pinned]
            idle = [m for m in unpinned if m.idle]
            if idle:
                victim = min(idle, key=lambda m: m.last_used)
                freed += victim.memory_bytes
                await self._unload(victim, "evicted")
                continue
            # unloading every unpinned model would make room (pinned ones and embedders stay)
            could_fit = not budget or held - sum(m.memory_bytes for m in unpinned) + need <= budget
            if not unpinned or not could_fit:
                raise LoadRefused(
                    f"The model `{model.name}` needs about {need / GIB:.2f} GiB and cannot be "
                    f"loaded: {'; '.join(short)}, and no model can be unloaded (pinned or busy)"
                )
            self._idled.clear()  # only busy models stand in the way: wait for one to finish
            await self._idled.wait()

    # --- asked for by a request (Ollama's keep_alive) -----------------------------------------

    async def load_now(self, model: ChatModel) -> None:
        """Load the model (or join its load) as a request's prompt would; its keep_alive runs
        from now."""
        model.touch()
        await model.holder.wait()
        self._went_idle(model)

    async def unload_now(self, model: ChatModel) -> bool:
        """Unload the model now, unless it is pinned, busy or not loaded (False)."""
        if model.spec.pinned or not model.idle or not model.holder.ready:
            return False
        timer = self._timers.pop(model.name, None)
        if timer is not None:
            timer.cancel()
        await self._unload(model, "idle")
        return model.holder.unloaded

    def keep_alive(self, model: ChatModel, seconds: float) -> None:
        """A request's keep_alive (seconds; negative: forever) is the model's from now on, until
        another's; a pinned model stays."""
        if model.spec.pinned:
            return
        self._kept[model.name] = seconds
        if model.idle:
            self._went_idle(model)

    def expires_at(self, model: ChatModel) -> float | None:
        """When its keep_alive unloads the model (`time.time()`'s seconds), counted from now
        while it is busy; None: never."""
        keep = self._keep_alive_of(model)
        if model.spec.pinned or keep == FOREVER:
            return None
        timer = self._timers.get(model.name)
        if timer is None:
            return time.time() + keep
        return time.time() + max(0.0, timer.when() - asyncio.get_running_loop().time())

    def _keep_alive_of(self, model: ChatModel) -> float:
        return self._kept.get(model.name, model.spec.keep_alive_seconds)

    # --- unloading ----------------------------------------------------------------------------

    def _went_idle(self, model: ChatModel) -> None:
        model.touch()
        self._idled.set()
        timer = self._timers.pop(model.name, None)
        if timer is not None:
            timer.cancel()
        keep = self._keep_alive_of(model)
        if model.spec.pinned or keep == FOREVER or not model.holder.ready:
            return
        loop = asyncio.get_running_loop()
        self._timers[model.name] = loop.call_later(keep, self._keep_alive_over, model)

    def _keep_alive_over(self, model: ChatModel) -> None:
        self._timers.pop(model.name, None)
        if model.idle and model.holder.ready and model.name not in self._busy_loads():
            task = asyncio.create_task(self._unload(model, "idle"), name=f"unload-{model.name}")
            self._unloading.add(task)
            task.add_done_callback(self._unloading.discard)

    def _busy_loads(self) -> set[str]:
        return {name for name, task in self._loads.items() if not task.done()}

    async def _unload(self, model: ChatModel, reason: str) -> None:
        if not model.idle or model.holder.unloaded:
            return
        log.info("unloading the model %s (%s)", model.name, reason)
        await model.holder.unload()
        model.memory_bytes = 0
        self._metrics.unloads.labels(model.name, reason).inc()
        self._metrics.bytes.labels(model.name).set(0)

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        for task in [*self._loads.values(), *self._unloading]:
            task.cancel()
        await asyncio.gather(*self._loads.values(), *self._unloading, return_exceptions=True)


def _retrieved(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def _estimate(model: ChatModel) -> int:
    """Its engine's memory at most: weights as on disk, its KV cache, its engine's processes."""
    engine = model.spec.settings.engine
    if model.spec.source == DEFAULT_SOURCE:
        from gateway.engine.default_model import prepare_default_model

        directory = prepare_default_model()
    else:
        directory = Path(model.spec.source)
    return chat_engine_bytes(directory, engine.kv_cache_gib)
