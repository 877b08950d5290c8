"""Engine replicas on Ray Serve (ENGINE_REPLICAS=N, RAY_ADDRESS): the engine path, unchanged,
over N engines on a Ray cluster.

Each replica (`EngineReplica`, a Serve deployment) builds the engine the gateway would build
(`gateway.engine.loader.local_loader`) and serves `Engine.stream` / `complete` / `beam_search`
(their keyword arguments pass through). The gateway holds a `ReplicaEngine`: an `Engine` whose
tokenizer is the replicas' own (sent once) and whose engine calls go through a
`DeploymentHandle` routed by Ray's `ConsistentHashRouter` on the prompt's continuation key
(gateway/engine/affinity.py), so every continuation of a key reaches the replica whose prefix
cache holds its blocks; a prompt with no key goes to any replica. Steps come back over gRPC, as in
Serve's throughput-optimized mode (`_direct`). Closing a stream cancels the
remote call, which aborts the engine request in the replica. A replica that dies ends each of
its running requests with one `engine_unavailable` error (nothing is retried: a stream may
have sent text already); Serve starts another, and the ring moves only the dead one's keys.

LoRA adapters: ADAPTERS are each replica's from its start, by the same ids. One loaded at run
time goes to every running replica (or to none: a replica that fails is named, the others
unload it), and each request carries its adapter whole (name, path, id), so a replica started
since learns it from the request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import ray
from grpc.aio import AioRpcError
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayError
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from gateway.config.settings import Settings
from gateway.engine.adapter import Engine, EngineStep, SchedulerView
from gateway.engine.affinity import AFFINITY
from gateway.engine.loader import local_loader
from gateway.engine.lora import Adapter, Adapters
from gateway.engine.meter import Meter
from protocols.constraints import UncompilableConstraint
from protocols.errors import ErrorKind, GenerationError, invalid
from protocols.generation import SamplingOptions

log = logging.getLogger(__name__)
APP = "llm-gateway-engine"
ROUTER = "ray.serve.experimental.consistent_hash_router.ConsistentHashRouter"
# The replica's side of Serve's throughput-optimized mode (its other settings: see `_direct`;
# the direct HTTP ingress it also turns on is not wanted: the gateway is the ingress).
REPLICA_ENV = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",  # methods on Serve's loop: no thread hop
    "RAY_SERVE_LOG_TO_STDERR": "0",
    # Ray runs its workers at nice 15, and the engine's processes inherit it: the model would
    # give its cores up to the gateway and Ray's own processes (nice 0) whenever they run.
    # The engine runs at the priority `ray start` ran at, as in-process at the gateway's.
    "RAY_worker_niceness": "0",
}
# Serve's controller runs its control loop 10 times a second by default: on 2 cores that and
# its GCS calls took 0.038 cores from the model, 0.016 once a second (docs/BENCHMARKS.md);
# a dead replica is noticed up to a second later. Set only where the gateway starts Serve.
CONTROLLER_ENV = {"env_vars": {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1"}}
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
    """One engine in one Ray actor, on its share of a small machine's cores."""

    async def __init__(self, settings: Settings) -> None:  # type: ignore[misc]  # Serve awaits it
        from gateway.engine.cpu_defaults import engine_environment

        context = serve.get_replica_context()
        cores = engine_environment({}).get("VLLM_CPU_OMP_THREADS_BIND", "").split(",")
        if cores != [""]:  # a small machine: its cores shared out, not all to every replica
            share = os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", _share(cores, context))
            # Ray sets OMP_NUM_THREADS to the actor's num_cpus (1); the engine's threads are
            # as many as its cores, and vLLM sizes its CPU attention by torch's thread count.
            os.environ["OMP_NUM_THREADS"] = str(len(share.split(",")))
        self.engine = await local_loader(settings)()
        self.tag = serve.get_replica_context().replica_tag
        self._served: OrderedDict[str, int] = OrderedDict()

    def _count(self) -> None:
        context = serve.context._get_serve_request_context()
        key = context.session_id if context is not None else ""
        if key:
            self._served[key] = self._served.get(key, 0) + 1
            self._served.move_to_end(key)
            while len(self._served) > _SERVED_KEYS:
                self._served.popitem(last=False)

    def describe(self) -> ReplicaInfo:
        e = self.engine
        adapters = e.adapters.paths
        return ReplicaInfo(
            e.tokenizer,
            e.max_model_len,
            e.dtype,
            e.dtype_reason,
            e.eos_token_ids,
            adapters,
            e.adapters.base,
            e.adapters.ids,
            e.adapters.enabled,
        )

    def served(self, key: str) -> tuple[str, int, int]:
        """(this replica, how many engine requests it served for `key`, its pid)."""
        return self.tag, self._served.get(key, 0), os.getpid()

    def unfinished_requests(self) -> int:
        return self.engine.unfinished_requests()

    async def load_adapter(self, adapter: Adapter) -> ReplicaFailure | None:
        """Loads `adapter` by the gateway's id (None: loaded); a name this replica knew by
        another id is an adapter the gateway unloaded since, replaced."""
        known = self.engine.adapters.find(adapter.name)
        if known is not None and known.lora_id != adapter.lora_id:
            self.engine.adapters.remove(adapter.name)
        try:
            await self.engine.load_adapter(adapter.name, adapter.path, adapter.lora_id)
        except GenerationError as e:
            return ReplicaFailure.of(e)
        return None

    async def unload_adapter(self, adapter: Adapter) -> None:
        known = self.engine.adapters.find(adapter.name)
        if known is not None and known.lora_id == adapter.lora_id:
            self.engine.adapters.remove(adapter.name)
        await self.engine.llm.remove_lora(adapter.lora_id)

    def _known(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The request's adapter by its name, known here: a replica that started after the
        adapter was loaded (Serve replacing a dead one) learns it from the request, and vLLM
        loads it from its path with its first request."""
        adapter = kwargs.get("adapter")
        if isinstance(adapter, Adapter):
            if self.engine.adapters.find(adapter.name) != adapter:
                self.engine.adapters.add(adapter.name, adapter.path, adapter.lora_id)
            kwargs["adapter"] = adapter.name
        return kwargs

    async def stream(
        self, token_ids: list[int], options: SamplingOptions, *args: Any, **kwargs: Any
    ) -> AsyncGenerator[EngineStep | ReplicaFailure, None]:
        self._count()
        kwargs = self._known(kwargs)
        steps = self.engine.stream(token_ids, options, None, *args, **kwargs)
        try:
            async for step in steps:
                yield step
        except GenerationError as e:
            yield ReplicaFailure.of(e)
        finally:
            await steps.aclose()  # a cancelled call aborts the engine request here

    async def complete(
        self, token_ids: list[int], options: SamplingOptions, *args: Any, **kwargs: Any
    ) -> list[EngineStep] | ReplicaFailure:
        self._count()
        kwargs = self._known(kwargs)
        try:
            return await self.engine.complete(token_ids, options, None, *args, **kwargs)
        except GenerationError as e:
            return ReplicaFailure.of(e)

    async def beam_search(
        self, token_ids: list[int], options: SamplingOptions, *args: Any, **kwargs: Any
    ) -> list[EngineStep] | ReplicaFailure:
        self._count()
        kwargs = self._known(kwargs)
        try:
            return await self.engine.beam_search(token_ids, options, None, *args, **kwargs)
        except GenerationError as e:
            return ReplicaFailure.of(e)

    def check_health(self) -> None:
        """Serve replaces a replica whose engine died."""
        if not self.engine.healthy:
            raise RuntimeError(self.engine.death_reason())


async def _running_replicas(*, required: bool = True) -> dict[str, Any]:
    """Each running replica's actor, by its tag, as Serve's controller lists them."""
    from ray.serve.context import _get_global_client

    def listed() -> dict[str, Any]:
        client = _get_global_client()
        if client is None:
            return {}
        details = client.get_serve_details()
        deployments = details["applications"][APP]["deployments"].values()
        return {
            r["replica_id"]: ray.get_actor(r["actor_name"], namespace="serve")
            for d in deployments
            for r in d["replicas"]
            if r["state"] == "RUNNING"
        }

    replicas = await asyncio.to_thread(listed)
    if required and not replicas:
        message = "No engine replica is running (Serve is starting them): try again"
        raise GenerationError(ErrorKind.ENGINE_UNAVAILABLE, message)
    return replicas


async def _call(actor: Any, method: str, *args: Any) -> Any:
    """`method` of one replica, on its actor: Serve's handle routes a call to one replica of
    its choosing, and adapters go to all. A request as Serve's own router sends it."""
    from ray.serve._private.common import RequestMetadata

    metadata = RequestMetadata(
        request_id=uuid.uuid4().hex,
        internal_request_id=uuid.uuid4().hex,
        call_method=method,
        app_name=APP,
    )
    return await actor.handle_request.remote(pickle.dumps(metadata), *args)


def _not_loaded(adapter: Adapter, failed: dict[str, Any], replicas: int) -> GenerationError:
    reasons = []
    field = "lora_path"
    for tag, failure in failed.items():
        if isinstance(failure, ReplicaFailure):
            field = failure.field or field
            reasons.append(f"{tag}: {failure.message}")
        else:
            reasons.append(f"{tag}: {failure}")
    message = (
        f"The adapter at {adapter.path} could not be loaded on {len(failed)} of {replicas} "
        f"engine replicas ({'; '.join(reasons)}): it is loaded on none"
    )
    return invalid(message, field)


def _share(cores: list[str], context: Any) -> str:
    """This replica's cores: the machine's split between the deployment's replicas (all of
    them when it has one), one each when there are more replicas than cores."""
    count: int = context.world_size
    rank: int = context.rank.local_rank
    if count > len(cores):
        return cores[rank % len(cores)]
    return ",".join(cores[rank * len(cores) // count : (rank + 1) * len(cores) // count])


def _unavailable(error: RayError | AioRpcError) -> GenerationError:
    if isinstance(error, ActorDiedError | ActorUnavailableError | RayActorError | AioRpcError):
        message = "The engine replica serving this request stopped; send it again"
        return GenerationError(ErrorKind.ENGINE_UNAVAILABLE, message)
    return GenerationError(ErrorKind.ENGINE_ERROR, f"The engine replica failed: {error}")


def _raised(item: object) -> None:
    if isinstance(item, ReplicaFailure):
        kind = UncompilableConstraint if item.constraint else GenerationError
        raise kind(item.kind, item.message, item.field)


class ReplicaEngine(Engine):
    """The gateway's side: an `Engine` whose engines are the replicas. Tokenizing and chat
    templates run here; only engine requests cross to a replica."""

    def __init__(self, handle: Any, info: ReplicaInfo, on_shutdown: Callable[[], None]) -> None:
        # No engine of its own: Engine.__init__ would want one. What it sets, set here.
        self.handle = handle
        self.tokenizer = info.tokenizer
        self._special = frozenset(int(i) for i in self.tokenizer.all_special_ids)
        self.eos_token_ids = info.eos_token_ids
        self.max_model_len = info.max_model_len
        self.dtype = info.dtype
        self.dtype_reason = info.dtype_reason
        self._closing = False
        self._on_shutdown = on_shutdown
        self._running = 0
        self.scheduler = SchedulerView()  # stays empty: each replica's engine counts its own
        self.adapters = Adapters({}, enabled=info.lora, base=info.base_model)
        for name, path in info.adapters.items():  # by the replicas' ids
            self.adapters.add(name, path, info.adapter_ids.get(name))
        self._managing = asyncio.Lock()  # one load or unload at a time, on every replica

    async def load_adapter(self, name: str, path: Path, lora_id: int | None = None) -> None:
        async with self._managing:
            await self._load(name, path, lora_id)

    async def unload_adapter(self, name: str) -> bool:
        async with self._managing:
            return await self._unload(name)

    async def _load(self, name: str, path: Path, lora_id: int | None) -> None:
        """Loads the adapter on every running replica, or on none: one that fails (its
        reason named) unloads it from those that loaded it, and the load is refused."""
        self.adapters.check_new(name)
        # Ids apart from the start-up adapters' (1, 2, ...) and, drawn at random, from those
        # of another gateway on the same replicas.
        adapter = Adapter(name, path, lora_id or random.randrange(1 << 20, 1 << 31))
        replicas = await _running_replicas()
        results = await asyncio.gather(
            *(_call(actor, "load_adapter", adapter) for actor in replicas.values()),
            return_exceptions=True,
        )
        failed = {
            tag: result for tag, result in zip(replicas, results, strict=True) if result is not None
        }
        if failed:
            loaded = [replicas[tag] for tag in replicas if tag not in failed]
            await asyncio.gather(
                *(_call(actor, "unload_adapter", adapter) for actor in loaded),
                return_exceptions=True,
            )
            raise _not_loaded(adapter, failed, len(replicas))
        self.adapters.add(name, path, adapter.lora_id)

    async def _unload(self, name: str) -> bool:
        """No request names it from now on; every running replica frees it. A replica that
        could not (other than one that died, whose engine is gone) is reported."""
        adapter = self.adapters.remove(name)
        if adapter is None:
            return False
        replicas = await _running_replicas(required=False)  # none running: none holds it
        results = await asyncio.gather(
            *(_call(actor, "unload_adapter", adapter) for actor in replicas.values()),
            return_exceptions=True,
        )
        kept = {
            tag: str(result)
            for tag, result in zip(replicas, results, strict=True)
            if isinstance(result, BaseException) and not isinstance(result, RayActorError)
        }
        if kept:
            where = "; ".join(f"{tag}: {reason}" for tag, reason in kept.items())
            message = (
                f"The adapter `{name}` is unloaded (no request may name it), but engine "
                f"replicas could not free it: {where}"
            )
            raise GenerationError(ErrorKind.ENGINE_ERROR, message, "lora_name")
        return True

    def _identified(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The request's adapter whole (name, path, id), not its name: whichever replica
        serves it knows it then, one started since it was loaded too."""
        name = kwargs.get("adapter")
        adapter = self.adapters.find(name) if isinstance(name, str) else None
        return kwargs if adapter is None else {**kwargs, "adapter": adapter}

    def _routed(self, method: str, *, stream: bool = False) -> Any:
        key = AFFINITY.get()
        # Steps over gRPC (per-step cost; each step far below gRPC's 4 MiB message limit);
        # whole answers as Ray objects (once per request, and of any size).
        handle = self.handle.options(stream=stream, _by_reference=not stream)
        if key is not None:
            handle = handle.options(session_id=key)
        return getattr(handle, method)

    @asynccontextmanager
    async def _remote(
        self, prompt_tokens: int, meter: Meter | None, cancel: Callable[[], None]
    ) -> AsyncIterator[None]:
        """Meter one remote engine request; cancel it however its consumer stops listening."""
        self._running += 1
        if meter is not None:
            meter.started(prompt_tokens)
        try:
            yield
        except (asyncio.CancelledError, GeneratorExit):
            cancel()
            raise
        except (RayError, AioRpcError, GenerationError) as e:
            failure = e if isinstance(e, GenerationError) else _unavailable(e)
            if meter is not None:
                meter.outcome = failure.kind.value
            if failure is not e:
                raise failure from e
            raise
        finally:
            self._running -= 1
            if meter is not None:
                meter.ended()

    async def stream(
        self,
        token_ids: list[int],
        options: SamplingOptions,
        meter: Meter | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> AsyncGenerator[EngineStep, None]:
        call = self._routed("stream", stream=True)
        response = call.remote(list(token_ids), options, *args, **self._identified(kwargs))
        async with self._remote(len(token_ids), meter, response.cancel):
            async for item in response:
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
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> list[EngineStep]:
        response = self._routed(method).remote(
            list(token_ids), options, *args, **self._identified(kwargs)
        )
        async with self._remote(len(token_ids), meter, response.cancel):
            found = await response
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
        *args: Any,
        **kwargs: Any,
    ) -> list[EngineStep]:
        return await self._whole("complete", token_ids, options, meter, args, kwargs)

    async def beam_search(
        self,
        token_ids: list[int],
        options: SamplingOptions,
        meter: Meter | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> list[EngineStep]:
        return await self._whole("beam_search", token_ids, options, meter, args, kwargs)

    def unfinished_requests(self) -> int:
        """The engine requests this gateway has running on the replicas."""
        return self._running

    @property
    def healthy(self) -> bool:
        return True  # Serve replaces a replica whose engine died (EngineReplica.check_health)

    def on_death(self, callback: Callable[[str], None]) -> None:
        return None

    def core_pids(self) -> list[int]:
        return []

    def death_reason(self) -> str:
        return ""

    def shutdown(self) -> None:
        if not self._closing:
            self._closing = True
            self._on_shutdown()


def deployment(settings: Settings) -> Any:
    """The replicas as a Serve application: ENGINE_REPLICAS of them, one CPU each, strict
    affinity (no fallback replica: a key's blocks are on one), or with REPLICA_ROUTING=load
    Ray's default router (PowerOfTwoChoices: the less loaded of two replicas drawn)."""
    router = RequestRouterConfig()
    if settings.replica_routing == "affinity":
        router = RequestRouterConfig(
            request_router_class=ROUTER,  # type: ignore[arg-type]  # a class or import path
            request_router_kwargs={"num_virtual_nodes": 100, "num_fallback_replicas": 0},
        )
    replicas: Any = serve.deployment(EngineReplica)
    return replicas.options(
        num_replicas=settings.engine_replicas,
        ray_actor_options={"num_cpus": 1, "runtime_env": {"env_vars": REPLICA_ENV}},
        request_router_config=router,
        max_ongoing_requests=settings.max_running_requests + settings.max_waiting_requests,
        health_check_period_s=5,
    ).bind(settings)


def _connect(settings: Settings) -> tuple[Any, Callable[[], None]]:
    """Joins RAY_ADDRESS (or starts a local cluster), deploys the replicas unless they already
    run there, and waits until they are ready: their handle, and what removes them."""
    if not ray.is_initialized():
        ray.init(
            address=settings.ray_address or None,
            namespace="llm-gateway",
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    serve.start(proxy_location="Disabled", controller_options={"runtime_env": CONTROLLER_ENV})
    if APP not in serve.status().applications:  # else deployed already (a RayService, a gateway)
        log.info("deploying %d engine replicas on Ray Serve", settings.engine_replicas)
        serve.run(deployment(settings), name=APP, route_prefix=None)  # returns once ready
    while (app := serve.status().applications[APP]).status != "RUNNING":
        if app.status == "DEPLOY_FAILED":
            raise RuntimeError(f"The engine replicas could not start: {app.message}")
        time.sleep(1.0)  # a worker thread's wait for replicas another client is starting

    def shutdown() -> None:
        if not settings.ray_address:  # a cluster of its own: the replicas go with the gateway
            serve.delete(APP)

    return serve.get_app_handle(APP), shutdown


def _direct(handle: Any) -> Any:
    """The handle as Ray Serve's throughput-optimized mode sets it up (its
    RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0; its RAY_SERVE_USE_GRPC_BY_DEFAULT=1 is
    `_by_reference=False` per streamed call, `ReplicaEngine._routed`): its router on the
    gateway's event loop (no hop to a thread of its own per step), each step over gRPC from
    the replica (not a Ray object: no owner to report to). Per engine step this halved the
    CPU the gateway and the replica spend (docs/BENCHMARKS.md). Called on the event loop,
    which the router then runs on. A handle of its own: Serve caches the one
    `get_app_handle` gives, and another caller (a thread) may want that."""
    own: DeploymentHandle[Any] = DeploymentHandle(handle.deployment_name, handle.app_name)
    own._init(_run_router_in_separate_loop=False)  # type: ignore[no-untyped-call]
    return own


def build(args: dict[str, str]) -> Any:
    """The replicas by import path (`gateway.engine.replicas:build`), for a RayService's
    serveConfigV2: `args` are settings by their variable names, as in `.env`."""
    from gateway.config.loading import load_settings

    return deployment(load_settings(args, dotenv_path=None))


def replica_loader(settings: Settings) -> Callable[[], Any]:
    async def load() -> Engine:
        handle, shutdown = await asyncio.to_thread(_connect, settings)
        handle = _direct(handle)
        info: ReplicaInfo = await handle.describe.remote()
        return ReplicaEngine(handle, info, shutdown)

    return load
