"""`ModelRegistry`: the models one gateway serves, by name. The chat models (with their
adapters: gateway/engine_path/chat_models.py) are configured at start-up; embedding models
come from EMBEDDING_MODEL at start-up and from DJL's management API at run time
(gateway/routes/model_management.py), each on its own pooling engine.

A load at run time is checked against memory first: the engine's estimate
(gateway/engine/model_memory.py) must fit both what the machine has available (less
`MODEL_LOAD_RESERVE_GIB`, kept for the running engines' growth) and MODEL_LOAD_MEMORY_GIB's
budget for models loaded at run time, or it is refused with the figures, never started.

A model unregistered while its engine is still being built is forgotten at once (its name
free, its requests refused) but its memory stays counted, in both checks, until its engine
is gone: the build runs on in a thread that cannot be stopped, and its engine is shut down as
soon as it is built (EngineHolder.stop). So POST/DELETE pairs never hold more engines than
the budget admits.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

from gateway.config.settings import DEFAULT_EMBEDDING_MODEL, Settings
from gateway.edge.limits import Limiter
from gateway.engine.holder import EngineHolder
from gateway.engine.model_memory import GIB, available_bytes, engine_bytes
from gateway.engine.pooling_engine import PoolingEngine, default_embedding_model, pooling_loader
from gateway.engine_path.admission import Admission
from gateway.engine_path.chat_model import ChatModel
from gateway.engine_path.chat_models import ChatModels
from gateway.engine_path.embedding_model import EmbeddingModel
from gateway.engine_path.metrics import GatewayMetrics
from gateway.engine_path.residency import LoadRefused
from protocols.errors import GenerationError

Task = Literal["generate", "embed"]
EMBEDDING_START_SECONDS = 20.0  # the status messages' estimate


class ModelRefused(Exception):
    """A registration or removal refused: `status` is DJL's (400, 404, 409, 507)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Entry:
    """One served model as the management API lists it."""

    name: str
    task: Task
    source: str  # DJL's modelUrl: the directory, `default`, or the chat model's
    status: str  # loading (also while it is rebuilt), ready or failed
    loaded_at_startup: bool
    error: str | None = None  # why it is not ready


@dataclass(frozen=True)
class _Embedder:
    model: EmbeddingModel
    holder: EngineHolder[PoolingEngine]
    source: str
    at_startup: bool
    memory_bytes: int  # the estimate it was admitted with (0: EMBEDDING_MODEL's)
    built_here: bool  # its engine built by `register` (EMBEDDING_MODEL's is handed in)


class ModelRegistry:
    def __init__(
        self,
        chats: ChatModels,
        settings: Settings,
        admission: Admission,
        limiter: Limiter,
        metrics: GatewayMetrics,
        chat_factory: Callable[[str, str], ChatModel] | None = None,
    ) -> None:
        """`chat_factory(name, source)`: a chat model registered at run time, unloaded."""
        self.chats = chats
        self._chat_factory = chat_factory
        self._settings = settings
        self._admission = admission  # the chat path's, and its limits: embeddings share them
        self._limiter = limiter
        self._metrics = metrics
        self._embedders: dict[str, _Embedder] = {}
        # Unregistered, their engines not gone yet (a build still running): still counted
        self._winding_down: dict[asyncio.Task[None], _Embedder] = {}
        self._changing = asyncio.Lock()

    def add_at_startup(self, holder: EngineHolder[PoolingEngine], name: str) -> None:
        """The embedding model EMBEDDING_MODEL names (its holder already started; LOAD_MODELS'
        come through `register`)."""
        model = self._model(holder, name)
        source = self._settings.embedding_model
        self._embedders[name] = _Embedder(model, holder, source, True, 0, False)

    def _model(self, holder: EngineHolder[PoolingEngine], name: str) -> EmbeddingModel:
        priority = self._settings.embedding_priority
        meter = self._metrics.model_meter(name, "embed")
        return EmbeddingModel(
            holder,
            name,
            priority,
            self._admission,
            self._limiter,
            meter,
            max_token_vectors=self._settings.embedding_max_num_batched_tokens,
            max_in_flight=2 * self._settings.embedding_max_num_seqs,
            max_tokens_in_flight=2 * self._settings.embedding_max_num_batched_tokens,
        )

    def embedding(self, name: str | None = None) -> EmbeddingModel | None:
        """The embedding model `name` names; None: the first served (start-up's first)."""
        if name is None:
            first = next(iter(self._embedders.values()), None)
            return first.model if first is not None else None
        found = self._embedders.get(name)
        return found.model if found is not None else None

    def embedding_models(self) -> list[EmbeddingModel]:
        return [e.model for e in self._embedders.values()]

    def task_of(self, name: str) -> Task | None:
        """What the model `name` does (the chat models' adapters generate), None: not served."""
        if name in self._embedders:
            return "embed"
        if self.chats.named(name) is not None or name in self.chats.names():
            return "generate"
        return None

    def embedding_bytes(self) -> int:
        """What the embedding engines hold by their estimates (EMBEDDING_MODEL's uncounted)."""
        return sum(e.memory_bytes for e in self._counted())

    def entries(self) -> list[Entry]:
        listed = []
        for chat in self.chats:
            status, error = chat.served.status()
            listed.append(Entry(chat.name, "generate", chat.spec.source, status, True, error))
        for name, embedder in self._embedders.items():
            status, error = embedder.model.status()
            at_startup = embedder.at_startup
            listed.append(Entry(name, "embed", embedder.source, status, at_startup, error))
        return listed

    async def register(
        self,
        name: str,
        source: str,
        *,
        synchronous: bool = True,
        at_startup: bool = False,
        task: Task | None = None,
    ) -> Entry:
        """Start an embedding model's engine for `source` (`default` or a model directory)
        served as `name`, or add a chat model (`task` generate, or a causal LM's config.json)
        loaded on demand; with `synchronous`, return once it is ready (or failed: removed and
        refused). ModelRefused: a name in use, a source that is not a model directory, or a
        load that does not fit the memory."""
        if task == "generate" or (task is None and _generates(source)):
            return await self._register_chat(name, source, synchronous=synchronous)
        async with self._changing:
            if self.task_of(name) is not None:
                raise ModelRefused(409, f'Model "{name}" is already registered')
            directory = _model_directory(source)
            # Off the event loop: the weights' sizes are a walk of the directory's tree
            need = await asyncio.to_thread(
                engine_bytes, directory, self._settings.embedding_kv_cache_gib
            )
            self._check_memory(name, need)
            settings = msgspec.structs.replace(
                self._settings, embedding_model=source, embedding_served_model_name=name
            )
            # No `on_give_up`: a model loaded at run time that keeps dying is reported failed
            # (GET /models); it does not end the gateway as the start-up models' would.
            holder = EngineHolder(
                pooling_loader(settings),
                EMBEDDING_START_SECONDS,
                max_restarts=settings.engine_max_restarts,
                restart_window_seconds=settings.engine_restart_window_seconds,
            )
            holder.start()
            model = self._model(holder, name)
            self._embedders[name] = _Embedder(model, holder, source, at_startup, need, True)
        if synchronous:
            try:
                await holder.wait()
            except Exception as e:  # the engine did not start: nothing of it is kept
                found = self._embedders.get(name)
                if found is not None and found.holder is holder:  # not unregistered meanwhile
                    await self.unregister(name)
                raise ModelRefused(500, f'Model "{name}" failed to load: {e}') from e
        return next(e for e in self.entries() if e.name == name)

    async def _register_chat(self, name: str, source: str, *, synchronous: bool) -> Entry:
        if self._chat_factory is None:
            raise ModelRefused(400, "This gateway registers no chat models at run time")
        async with self._changing:
            if self.task_of(name) is not None:
                raise ModelRefused(409, f'Model "{name}" is already registered')
            if source == DEFAULT_EMBEDDING_MODEL:
                raise ModelRefused(
                    400,
                    "`url` default is the shipped embedding model: a chat model's `url` is "
                    "its model directory",
                )
            _model_directory(source)
            model = self._chat_factory(name, source)
            self.chats.add(model)
        if synchronous:
            try:
                await model.holder.wait()  # loaded as a request would load it
            except LoadRefused as e:
                await self.chats.remove(model)
                raise ModelRefused(507, e.message) from e
            except GenerationError as e:
                await self.chats.remove(model)
                raise ModelRefused(500, f'Model "{name}" failed to load: {e.message}') from e
        return next(e for e in self.entries() if e.name == name)

    async def unregister(self, name: str) -> None:
        """Stop the embedding (or run-time chat) model `name`'s engine and forget it (requests
        it is answering end with the engine's stop). ModelRefused: the default chat model, or a
        name not served."""
        chat = self.chats.named(name)
        if chat is not None:
            if chat is self.chats.default:
                raise ModelRefused(400, f'Model "{name}" is the default chat model: it stays')
            await self.chats.remove(chat)
            return
        async with self._changing:
            if self.task_of(name) == "generate":  # a chat model's adapter
                raise ModelRefused(
                    400, f'"{name}" is a LoRA adapter: unload it with the adapters API'
                )
            embedder = self._embedders.pop(name, None)
            if embedder is None:
                raise ModelRefused(404, f'Model or workflow not found: "{name}"')
            loading = embedder.holder.status == "loading"
            stopping = asyncio.create_task(embedder.holder.stop(), name=f"unregister-{name}")
            self._winding_down[stopping] = embedder
            stopping.add_done_callback(self._wound_down)
        if not loading:
            await asyncio.wait([stopping])  # a built engine stops at once: answer after it

    def _wound_down(self, task: asyncio.Task[None]) -> None:
        self._winding_down.pop(task, None)

    def winding_down(self) -> int:
        """Engines of models unregistered and not gone yet (their builds still running)."""
        return len(self._winding_down)

    async def stop(self, *, handed_in_too: bool) -> None:
        """Stop the engines `register` built, and with `handed_in_too` EMBEDDING_MODEL's (a
        test's app shares that one with others); return once every one is gone, those
        unregistered while loading included."""
        for embedder in list(self._embedders.values()):
            if handed_in_too or embedder.built_here:
                await embedder.holder.stop()
        if self._winding_down:
            await asyncio.wait(list(self._winding_down))

    def _counted(self) -> list[_Embedder]:
        """The models whose memory counts: those served, and those whose engines wind down."""
        return [*self._embedders.values(), *self._winding_down.values()]

    def _check_memory(self, name: str, need: int) -> None:
        budget = self._settings.model_load_memory_gib
        if budget > 0:
            taken = sum(e.memory_bytes for e in self._counted())
            if taken + need > budget * GIB:
                stopping = sum(e.memory_bytes for e in self._winding_down.values())
                unloading = (
                    f" ({stopping / GIB:.2f} GiB of it unregistered, until their engines stop)"
                    if stopping
                    else ""
                )
                raise ModelRefused(
                    507,
                    f'Model "{name}" needs about {need / GIB:.2f} GiB; models loaded at run '
                    f"time hold {taken / GIB:.2f} GiB of MODEL_LOAD_MEMORY_GIB's {budget:g} GiB"
                    + unloading,
                )
        free = available_bytes()
        reserve = int(self._settings.model_load_reserve_gib * GIB)
        if free is not None:  # engines still loading have not taken their memory yet
            free -= sum(e.memory_bytes for e in self._counted() if not e.model.ready)
        if free is not None and need > free - reserve:
            raise ModelRefused(
                507,
                f'Model "{name}" needs about {need / GIB:.2f} GiB; the machine has '
                f"{free / GIB:.2f} GiB available, {reserve / GIB:.2f} GiB of it kept in reserve "
                "(MODEL_LOAD_RESERVE_GIB)",
            )


def _generates(source: str) -> bool:
    """Whether the model directory `source` holds a causal LM (`...ForCausalLM`)."""
    if source == DEFAULT_EMBEDDING_MODEL:
        return False
    try:
        config = json.loads((Path(source) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    architectures = config.get("architectures") if isinstance(config, dict) else None
    return isinstance(architectures, list) and any(
        isinstance(a, str) and a.endswith("ForCausalLM") for a in architectures
    )


def _model_directory(source: str) -> Path:
    """The model directory `source` names (`default`: the shipped all-MiniLM-L6-v2)."""
    if source == DEFAULT_EMBEDDING_MODEL:
        return default_embedding_model()
    directory = Path(source)
    if not (directory / "config.json").is_file():
        raise ModelRefused(400, f"`url` is not a model directory on this machine: {source}")
    return directory
