"""One engine replica: a Ray actor that the gateway creates, names and routes to itself
(gateway/engine/replicas.py), with Ray Core's public actor API only.

It builds the engine the gateway would build (`gateway.engine.loader.local_loader`) with its
first call and serves `VllmEngine.stream` / `complete` / `beam_search` (their keyword arguments
pass through), each call naming the continuation key it was routed by. Ray restarts the actor
when its process dies; an engine that dies takes the process with it, so Ray restarts that
too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections import OrderedDict
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import msgspec

from gateway.config.settings import Settings
from gateway.engine.loader import local_loader
from gateway.engine.lora import Adapter
from gateway.engine.outputs import EngineStep
from gateway.engine.vllm_engine import VllmEngine
from protocols.constraints import UncompilableConstraint
from protocols.errors import ErrorKind, GenerationError
from protocols.generation import SamplingOptions

log = logging.getLogger(__name__)
_WATCH_SECONDS = 60.0
_SERVED_KEYS = 10_000  # routing keys each replica remembers serving (diagnostics, tests)


class ReplicaFailure(msgspec.Struct, frozen=True):
    """A `GenerationError` on its way back from a replica (exceptions lose their fields)."""

    kind: ErrorKind
    message: str
    field: str | None = None
    constraint: bool = False  # an UncompilableConstraint

    @classmethod
    def of(cls, error: GenerationError) -> ReplicaFailure:
        constraint = isinstance(error, UncompilableConstraint)
        return cls(error.kind, error.message, error.field, constraint)


class ReplicaInfo(msgspec.Struct, frozen=True):
    tokenizer: Any
    max_model_len: int
    dtype: str
    dtype_reason: str
    eos_token_ids: frozenset[int]
    adapters: dict[str, Path] = msgspec.field(default_factory=dict)  # the replica's, by name
    base_model: str = ""  # the name that asks for no adapter
    adapter_ids: dict[str, int] = msgspec.field(default_factory=dict)  # the same in each replica
    lora: bool = False  # LoRA on: adapters may be loaded at run time


class EngineReplica:
    """One engine in one Ray actor, on its share of a small machine's cores: replica `index`
    of `count`."""

    def __init__(self, settings: Settings, name: str, index: int, count: int) -> None:
        from gateway.engine.cpu_defaults import engine_environment

        cores = engine_environment({}).get("VLLM_CPU_OMP_THREADS_BIND", "").split(",")
        if cores != [""]:  # a small machine: its cores shared out, not all to every replica
            share = os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", _share(cores, index, count))
            # Ray sets OMP_NUM_THREADS to the actor's num_cpus (1); the engine's threads are
            # as many as its cores, and vLLM sizes its CPU attention by torch's thread count.
            os.environ["OMP_NUM_THREADS"] = str(len(share.split(",")))
        self.settings = settings
        self.name = name
        self._building: asyncio.Future[VllmEngine] | None = None
        self._served: OrderedDict[str, int] = OrderedDict()

    async def _engine(self) -> VllmEngine:
        """The engine, built by the first call (a Ray actor's `__init__` runs off its event
        loop, where the engine must live); shielded: a cancelled call leaves the build going."""
        if self._building is None:
            self._building = asyncio.ensure_future(self._build())
        return await asyncio.shield(self._building)

    async def _build(self) -> VllmEngine:
        engine = await local_loader(self.settings)()

        def died(reason: str) -> None:
            log.error(
                "replica %s: its engine died (%s); Ray restarts the replica", self.name, reason
            )
            # A process that dies, not an actor that asks to end: Ray restarts it.
            os.kill(os.getpid(), signal.SIGKILL)

        engine.on_death(died)
        return engine

    async def ready(self) -> int:
        """Once the engine is built: this replica's pid."""
        await self._engine()
        return os.getpid()

    async def watch(self) -> None:
        """Answers a minute later, unless this replica's process ends first: then the
        gateway's call fails at once. (Not never: a gateway that ended leaves no call here.)"""
        await asyncio.sleep(_WATCH_SECONDS)

    async def describe(self) -> ReplicaInfo:
        e = await self._engine()
        adapters = e.adapters
        return ReplicaInfo(
            e.tokenizer,
            e.max_model_len,
            e.dtype,
            e.dtype_reason,
            e.eos_token_ids,
            adapters.paths,
            adapters.base,
            adapters.ids,
            adapters.enabled,
        )

    def served(self, key: str) -> tuple[str, int, int]:
        """(this replica, how many engine requests it served for `key`, its pid)."""
        return self.name, self._served.get(key, 0), os.getpid()

    async def unfinished_requests(self) -> int:
        return (await self._engine()).unfinished_requests()

    async def load_adapter(self, adapter: Adapter) -> ReplicaFailure | None:
        """Loads `adapter` by the gateway's id (None: loaded); a name this replica knew by
        another id is an adapter the gateway unloaded since, replaced."""
        engine = await self._engine()
        known = engine.adapters.find(adapter.name)
        if known is not None and known.lora_id != adapter.lora_id:
            engine.adapters.remove(adapter.name)
        try:
            await engine.load_adapter(adapter.name, adapter.path, adapter.lora_id)
        except GenerationError as e:
            return ReplicaFailure.of(e)
        return None

    async def unload_adapter(self, adapter: Adapter) -> None:
        engine = await self._engine()
        known = engine.adapters.find(adapter.name)
        if known is not None and known.lora_id == adapter.lora_id:
            engine.adapters.remove(adapter.name)
        await engine.llm.remove_lora(adapter.lora_id)

    async def _started(self, key: str | None, kwargs: dict[str, Any]) -> VllmEngine:
        """The engine, the request counted under its key, and its adapter known here by name:
        a replica that started after the adapter was loaded (Ray restarting a dead one) learns
        it from the request, and vLLM loads it from its path with its first request."""
        engine = await self._engine()
        if key:
            self._served[key] = self._served.get(key, 0) + 1
            self._served.move_to_end(key)
            while len(self._served) > _SERVED_KEYS:
                self._served.popitem(last=False)
        adapter = kwargs.get("adapter")
        if isinstance(adapter, Adapter):
            if engine.adapters.find(adapter.name) != adapter:
                engine.adapters.add(adapter.name, adapter.path, adapter.lora_id)
            kwargs["adapter"] = adapter.name
        return engine

    async def stream(
        self,
        key: str | None,
        token_ids: list[int],
        options: SamplingOptions,
        *args: Any,
        **kwargs: Any,
    ) -> AsyncGenerator[EngineStep | ReplicaFailure, None]:
        engine = await self._started(key, kwargs)
        steps = engine.stream(token_ids, options, None, *args, **kwargs)
        try:
            async for step in steps:
                yield step
        except GenerationError as e:
            yield ReplicaFailure.of(e)
        finally:
            await steps.aclose()  # a cancelled call aborts the engine request here

    async def complete(
        self,
        key: str | None,
        token_ids: list[int],
        options: SamplingOptions,
        *args: Any,
        **kwargs: Any,
    ) -> list[EngineStep] | ReplicaFailure:
        engine = await self._started(key, kwargs)
        try:
            return await engine.complete(token_ids, options, None, *args, **kwargs)
        except GenerationError as e:
            return ReplicaFailure.of(e)

    async def beam_search(
        self,
        key: str | None,
        token_ids: list[int],
        options: SamplingOptions,
        *args: Any,
        **kwargs: Any,
    ) -> list[EngineStep] | ReplicaFailure:
        engine = await self._started(key, kwargs)
        try:
            return await engine.beam_search(token_ids, options, None, *args, **kwargs)
        except GenerationError as e:
            return ReplicaFailure.of(e)


def _share(cores: list[str], index: int, count: int) -> str:
    """Replica `index`'s cores: the machine's split between the `count` replicas (all of them
    when there is one), one each when there are more replicas than cores."""
    if count > len(cores):
        return cores[index % len(cores)]
    return ",".join(cores[index * len(cores) // count : (index + 1) * len(cores) // count])
