"""Engine replicas on Ray (ENGINE_REPLICAS=N, RAY_ADDRESS): the engine path, unchanged, over
N engines on a Ray cluster, with Ray Core's public API only (actors, `.remote()`, awaited
object refs, `ray.cancel`, `ray.get_actor`, `ray.kill`), and one setting of Ray's in the
replicas' environment (gateway/engine/ray_seam.py).

The replicas are N named actors (`EngineReplica`, gateway/engine/replica_actor.py) that the
gateway creates, or finds when another gateway did. The gateway holds a `ReplicaEngine`: an
`Engine` whose tokenizer is the replicas' own (sent once) and whose engine calls go to the
replica it picks itself (`Fleet.pick`): by the prompt's continuation key
(gateway/engine/affinity.py) with rendezvous hashing, so every continuation of a key reaches
the replica whose prefix cache holds its blocks; a prompt with no key to any replica.
Closing a stream cancels the remote call, which aborts the engine request in the replica.
A replica that dies ends each of its running requests with one `engine_unavailable` error
(nothing is retried: a stream may have sent text already); Ray restarts it, and meanwhile
only its keys move.

LoRA adapters: ADAPTERS are each replica's from its start, by the same ids. One loaded at run
time goes to every running replica (or to none: a replica that fails is named, the others
unload it), and each request carries its adapter whole (name, path, id), so a replica started
since learns it from the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from gateway.config.settings import Settings
from gateway.engine.affinity import AFFINITY
from gateway.engine.contract import Engine, TokenizerSide
from gateway.engine.lora import Adapter, Adapters
from gateway.engine.meter import Meter
from gateway.engine.outputs import EngineStep
from gateway.engine.ray_seam import REPLICA_ENV
from gateway.engine.replica_actor import EngineReplica, ReplicaFailure, ReplicaInfo
from gateway.engine.scheduler_view import SchedulerView
from protocols.constraints import UncompilableConstraint
from protocols.errors import ErrorKind, GenerationError, invalid
from protocols.generation import SamplingOptions

log = logging.getLogger(__name__)
APP = "llm-gateway-engine"  # the replicas' names: llm-gateway-engine-0, -1, ...
NAMESPACE = "llm-gateway"


def replica_names(count: int) -> list[str]:
    return [f"{APP}-{index}" for index in range(count)]


def _weight(key: str, replica: int) -> bytes:
    return hashlib.blake2b(f"{replica}/{key}".encode(), digest_size=8).digest()


class Fleet:
    """The replicas as this gateway sees them: which answer now (watched: a call each that
    fails when its replica's process ends), and which one a request goes to."""

    def __init__(self, actors: list[Any], routing: str) -> None:
        self.actors = actors
        self.routing = routing
        self.up: dict[int, int] = {}  # the replicas answering, by index: their pids
        self.running = [0] * len(actors)  # this gateway's requests on each replica
        self._watchers: list[asyncio.Task[None]] = []

    def watch(self, pids: list[int]) -> None:
        """Starts watching every replica (`pids`: each one's, ready). On the event loop."""
        self.up = dict(enumerate(pids))
        self._watchers = [asyncio.create_task(self._watch(i)) for i in range(len(self.actors))]

    async def _watch(self, index: int) -> None:
        actor = self.actors[index]
        while True:
            try:
                await actor.watch.remote()
                continue  # still there
            except RayActorError:  # its process ended, or cannot be reached
                self.up.pop(index, None)
            log.warning("engine replica %d stopped; its keys go to the others meanwhile", index)
            try:  # retried until Ray has restarted it and its engine is built
                self.up[index] = await actor.ready.options(max_task_retries=-1).remote()
            except RayError as e:
                log.error("engine replica %d cannot serve again: %s", index, e)
                return
            log.warning("engine replica %d serves again", index)

    def stop(self) -> None:
        for task in self._watchers:
            task.cancel()

    def pick(self, key: str | None) -> int:
        """Affinity: the replica of highest weight for `key` among those answering (rendezvous
        hashing: one that stops moves only its own keys, each to the next in its order), any
        for no key. Load (REPLICA_ROUTING=load): the one running fewer of this gateway's
        requests of two drawn at random."""
        up = list(self.up)
        if not up:
            message = "No engine replica is running (Ray is starting them): try again"
            raise GenerationError(ErrorKind.ENGINE_UNAVAILABLE, message)
        if self.routing == "load":
            return min(random.sample(up, min(2, len(up))), key=lambda i: self.running[i])
        if key is None:
            return random.choice(up)
        return max(up, key=lambda i: _weight(key, i))


def _not_loaded(adapter: Adapter, failed: dict[int, Any], replicas: int) -> GenerationError:
    reasons = []
    field = "lora_path"
    for index, failure in failed.items():
        if isinstance(failure, ReplicaFailure):
            field = failure.field or field
            reasons.append(f"{APP}-{index}: {failure.message}")
        else:
            reasons.append(f"{APP}-{index}: {failure}")
    message = (
        f"The adapter at {adapter.path} could not be loaded on {len(failed)} of {replicas} "
        f"engine replicas ({'; '.join(reasons)}): it is loaded on none"
    )
    return invalid(message, field)


def _unavailable(error: RayError) -> GenerationError:
    if isinstance(error, RayActorError):
        message = "The engine replica serving this request stopped; send it again"
        return GenerationError(ErrorKind.ENGINE_UNAVAILABLE, message)
    return GenerationError(ErrorKind.ENGINE_ERROR, f"The engine replica failed: {error}")


def _raised(item: object) -> None:
    if isinstance(item, ReplicaFailure):
        kind = UncompilableConstraint if item.constraint else GenerationError
        raise kind(item.kind, item.message, item.field)


class ReplicaEngine(TokenizerSide):
    """The gateway's side: an `Engine` (gateway/engine/contract.py) whose engines are the
    replicas. Tokenizing and chat templates run here (`TokenizerSide`, on the replicas'
    tokenizer); only engine requests cross to a replica."""

    def __init__(self, fleet: Fleet, info: ReplicaInfo, on_shutdown: Callable[[], None]) -> None:
        adapters = Adapters({}, enabled=info.lora, base=info.base_model)
        for name, path in info.adapters.items():  # by the replicas' ids
            adapters.add(name, path, info.adapter_ids.get(name))
        super().__init__(
            info.tokenizer,
            info.eos_token_ids,
            info.max_model_len,
            info.dtype,
            info.dtype_reason,
            adapters,
            SchedulerView(),  # stays empty: each replica's engine counts its own
        )
        self.fleet = fleet
        self._closing = False
        self._on_shutdown = on_shutdown
        self._running = 0
        self._managing = asyncio.Lock()  # one load or unload at a time, on every replica

    async def load_adapter(self, name: str, path: Path, lora_id: int | None = None) -> None:
        async with self._managing:
            await self._load(name, path, lora_id)

    async def unload_adapter(self, name: str) -> bool:
        async with self._managing:
            return await self._unload(name)

    async def _each(self, method: str, adapter: Adapter) -> dict[int, Any]:
        """`method(adapter)` on every replica answering: each one's result or exception."""
        replicas = list(self.fleet.up)
        calls = (getattr(self.fleet.actors[i], method).remote(adapter) for i in replicas)
        results = await asyncio.gather(*calls, return_exceptions=True)
        return dict(zip(replicas, results, strict=True))

    async def _load(self, name: str, path: Path, lora_id: int | None) -> None:
        """Loads the adapter on every running replica, or on none: one that fails (its
        reason named) unloads it from those that loaded it, and the load is refused."""
        self.adapters.check_new(name)
        # Ids apart from the start-up adapters' (1, 2, ...) and, drawn at random, from those
        # of another gateway on the same replicas.
        adapter = Adapter(name, path, lora_id or random.randrange(1 << 20, 1 << 31))
        if not self.fleet.up:
            message = "No engine replica is running (Ray is restarting them): try again"
            raise GenerationError(ErrorKind.ENGINE_UNAVAILABLE, message)
        results = await self._each("load_adapter", adapter)
        failed = {index: result for index, result in results.items() if result is not None}
        if failed:
            loaded = [self.fleet.actors[i] for i in results if i not in failed]
            await asyncio.gather(
                *(actor.unload_adapter.remote(adapter) for actor in loaded),
                return_exceptions=True,
            )
            raise _not_loaded(adapter, failed, len(results))
        self.adapters.add(name, path, adapter.lora_id)

    async def _unload(self, name: str) -> bool:
        """No request names it from now on; every running replica frees it. A replica that
        could not (other than one that died, whose engine is gone) is reported."""
        adapter = self.adapters.remove(name)
        if adapter is None:
            return False
        results = await self._each("unload_adapter", adapter)  # none running: none holds it
        kept = {
            index: str(result)
            for index, result in results.items()
            if isinstance(result, BaseException) and not isinstance(result, RayActorError)
        }
        if kept:
            where = "; ".join(f"{APP}-{index}: {reason}" for index, reason in kept.items())
            message = (
                f"The adapter `{name}` is unloaded (no request may name it), but engine "
                f"replicas could not free it: {where}"
            )
            raise GenerationError(ErrorKind.ENGINE_ERROR, message, "lora_name")
        return True

    def _call(
        self,
        method: str,
        token_ids: list[int],
        options: SamplingOptions,
        priority: int,
        adapter: str | None,
        caller: str,
    ) -> tuple[int, Any]:
        """`method` called on the replica the request goes to: its index, and the call's
        object ref (a generator's refs for a stream). The request's adapter goes whole (name,
        path, id), not by its name: whichever replica serves it knows it then."""
        key = AFFINITY.get()
        index = self.fleet.pick(key)
        found = self.adapters.find(adapter) if adapter is not None else None
        call = getattr(self.fleet.actors[index], method)
        named = found if found is not None else adapter
        remote = call.remote(key, list(token_ids), options, priority, adapter=named, caller=caller)
        return index, remote

    @asynccontextmanager
    async def _remote(
        self, replica: int, prompt_tokens: int, meter: Meter | None, call: Any
    ) -> AsyncIterator[None]:
        """Meter one remote engine request; cancel it however its consumer stops listening."""
        self._running += 1
        self.fleet.running[replica] += 1
        if meter is not None:
            meter.started(prompt_tokens)
        try:
            yield
        except (asyncio.CancelledError, GeneratorExit):
            ray.cancel(call)
            raise
        except (RayError, GenerationError) as e:
            failure = e if isinstance(e, GenerationError) else _unavailable(e)
            if meter is not None:
                meter.outcome = failure.kind.value
            if failure is not e:
                raise failure from e
            raise
        finally:
            self._running -= 1
            self.fleet.running[replica] -= 1
            if meter is not None:
                meter.ended()

    async def stream(
        self,
        token_ids: list[int],
        options: SamplingOptions,
        meter: Meter | None = None,
        priority: int = 0,
        adapter: str | None = None,
        caller: str = "",
    ) -> AsyncGenerator[EngineStep, None]:
        replica, steps = self._call("stream", token_ids, options, priority, adapter, caller)
        async with self._remote(replica, len(token_ids), meter, steps):
            async for ref in steps:
                item = await ref
                _raised(item)
                step: EngineStep = item
                if meter is not None:
                    meter.step(len(step.token_ids), step.cached_tokens, step.finished)
                yield step

    async def _whole(
        self,
        method: str,
        token_ids: list[int],
        options: SamplingOptions,
        meter: Meter | None,
        priority: int,
        adapter: str | None,
        caller: str,
    ) -> list[EngineStep]:
        replica, answer = self._call(method, token_ids, options, priority, adapter, caller)
        async with self._remote(replica, len(token_ids), meter, answer):
            found = await answer
            _raised(found)
            steps: list[EngineStep] = found
            if meter is not None:
                tokens = sum(len(s.token_ids) for s in steps)
                meter.step(tokens, steps[0].cached_tokens if steps else 0, True)
            return steps

    async def complete(
        self,
        token_ids: list[int],
        options: SamplingOptions,
        meter: Meter | None = None,
        priority: int = 0,
        adapter: str | None = None,
        caller: str = "",
    ) -> list[EngineStep]:
        args = (priority, adapter, caller)
        return await self._whole("complete", token_ids, options, meter, *args)

    async def beam_search(
        self,
        token_ids: list[int],
        options: SamplingOptions,
        meter: Meter | None = None,
        priority: int = 0,
        adapter: str | None = None,
        caller: str = "",
    ) -> list[EngineStep]:
        args = (priority, adapter, caller)
        return await self._whole("beam_search", token_ids, options, meter, *args)

    def unfinished_requests(self) -> int:
        """The engine requests this gateway has running on the replicas."""
        return self._running

    @property
    def healthy(self) -> bool:
        return True  # Ray restarts a replica whose process (or engine) died

    def on_death(self, callback: Callable[[str], None]) -> None:
        return None

    def core_pids(self) -> list[int]:
        return []

    def death_reason(self) -> str:
        return ""

    def shutdown(self) -> None:
        if not self._closing:
            self._closing = True
            self.fleet.stop()
            self._on_shutdown()


def _connect(settings: Settings) -> tuple[list[Any], Callable[[], None]]:
    """Joins RAY_ADDRESS (or starts a local cluster) and creates the replicas unless they run
    there already (another gateway's): their actors, and what removes them."""
    if not ray.is_initialized():
        ray.init(
            address=settings.ray_address or None,
            namespace=NAMESPACE,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    count = settings.engine_replicas
    replica: Any = ray.remote(EngineReplica)
    actors: list[Any] = [
        replica.options(
            name=name,
            namespace=NAMESPACE,
            get_if_exists=True,
            # On a cluster of its own they end with the gateway; on RAY_ADDRESS's they stay
            # for every gateway that names them, until removed (`remove_replicas`).
            lifetime="detached" if settings.ray_address else None,
            max_restarts=-1,
            num_cpus=1,
            runtime_env={"env_vars": REPLICA_ENV},
        ).remote(settings, name, index, count)
        for index, name in enumerate(replica_names(count))
    ]

    def shutdown() -> None:
        if not settings.ray_address:  # a cluster of its own: the replicas go with the gateway
            for actor in actors:
                ray.kill(actor)

    return actors, shutdown


def remove_replicas(count: int) -> None:
    """Ends the replicas on the cluster this process joined (those a gateway left there)."""
    for name in replica_names(count):
        with contextlib.suppress(ValueError):  # none by that name
            ray.kill(ray.get_actor(name, namespace=NAMESPACE))


def replica_loader(settings: Settings) -> Callable[[], Any]:
    async def load() -> Engine:
        actors, shutdown = await asyncio.to_thread(_connect, settings)
        log.info("waiting for %d engine replicas on Ray", len(actors))
        # Retried through restarts: Ray may restart a replica that has not started yet (its
        # memory monitor kills a worker on a machine short of memory).
        ready = (actor.ready.options(max_task_retries=-1).remote() for actor in actors)
        pids = await asyncio.gather(*ready)
        fleet = Fleet(actors, settings.replica_routing)
        fleet.watch(list(pids))
        info: ReplicaInfo = await actors[0].describe.remote()
        return ReplicaEngine(fleet, info, shutdown)

    return load
