"""The generation service: one entry point that every protocol calls.

`run` takes a payload's prompts and yields, per engine step, the list of neutral events that
step produced for them. It applies admission, continuation by request_id, the in-flight
request_id check and the context-length check, and on exit (finished, failed, or the caller
stopped listening) it cancels what still runs, which aborts those engine requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager

from gateway.admission import Admission
from gateway.continuation import ContinuationStore, History, Key, token_array
from gateway.engine import Engine
from gateway.engine_holder import EngineHolder
from gateway.metrics import STREAM_METER, GatewayMetrics
from protocols.errors import ErrorKind, GenerationError, invalid
from protocols.generation import (
    Delta,
    Event,
    Failed,
    Finished,
    Initialized,
    PromptItem,
    SamplingOptions,
    Started,
)

log = logging.getLogger(__name__)


TERMINAL = (Finished, Failed)


class _Payload:
    """One call of `run`: where its events go and its continuation entry."""

    def __init__(
        self,
        key: Key | None,
        known: dict[str, History] | None,
        options: SamplingOptions,
        stream: bool,
        protocol: str,
    ) -> None:
        self.key = key
        self.protocol = protocol
        self.known = known or {}
        self.histories = dict(self.known)
        self.options = options
        self.stream = stream
        self.queue: asyncio.Queue[Event] = asyncio.Queue()


class GenerationService:
    def __init__(
        self,
        holder: EngineHolder,
        admission: Admission,
        store: ContinuationStore,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.holder = holder
        self.admission = admission
        self.store = store
        self.metrics = metrics or GatewayMetrics()
        self.metrics.watch_admission(lambda: admission.waiting, lambda: admission.running)
        self._in_flight: set[str] = set()

    @asynccontextmanager
    async def engine_slot(self, protocol: str = "other") -> AsyncIterator[Engine]:
        """An admission slot, then the ready engine: every generation goes through this.

        Engine requests made inside are counted in the metrics under `protocol`.
        """
        async with self.admission.slot():
            engine = await self.holder.wait()
            previous = STREAM_METER.get()
            STREAM_METER.set(self.metrics.meter(protocol))
            try:
                yield engine
            finally:
                # set, not reset: a generator holding the slot may be closed from another
                # task's context, where the original token is not valid
                STREAM_METER.set(previous)

    async def run(
        self,
        items: Sequence[PromptItem],
        options: SamplingOptions,
        *,
        stream: bool,
        protocol: str,
        continuation: bool = True,
    ) -> AsyncGenerator[list[Event], None]:
        """`continuation=False`: the prompts start afresh and leave no history behind."""
        key = tuple(item.request_id for item in items) if continuation else None
        known = self.store.get(key) if key else None
        if key is not None:
            hits = sum(item.request_id in (known or {}) for item in items)
            self.metrics.continuation.labels("hit").inc(hits)
            self.metrics.continuation.labels("miss").inc(len(items) - hits)
        payload = _Payload(key, known, options, stream, protocol)
        tasks: list[asyncio.Task[None]] = []
        for index, item in enumerate(items):
            if item.request_id in self._in_flight:
                payload.queue.put_nowait(_failed(index, _duplicate(item.request_id)))
                continue
            self._in_flight.add(item.request_id)
            tasks.append(asyncio.create_task(self._run_one(payload, index, item)))
        remaining = len(items)
        try:
            while remaining:
                step = [await payload.queue.get()]
                while not payload.queue.empty():
                    step.append(payload.queue.get_nowait())
                remaining -= sum(isinstance(e, TERMINAL) for e in step)
                yield _merge_deltas(step)
        finally:
            # Each task releases its request_id and records its history itself, so nothing
            # here depends on this cleanup running to its end (a twice-cancelled caller).
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run_one(self, payload: _Payload, index: int, item: PromptItem) -> None:
        try:
            outcome = await self._attempt(payload, index, item)
        finally:
            self._in_flight.discard(item.request_id)
        payload.queue.put_nowait(outcome)

    async def _attempt(self, payload: _Payload, index: int, item: PromptItem) -> Finished | Failed:
        try:
            async with self.engine_slot(payload.protocol) as engine:
                history = payload.known.get(item.request_id)
                if history is None:
                    history = History(token_array(prompt_tokens(engine, item.prompt)), item.prompt)
                check_context(engine, len(history.token_ids))
                payload.queue.put_nowait(Started(index))
                finished, new_ids = await _generate(engine, index, history, payload)
        except GenerationError as e:
            return _failed(index, e)
        except Exception as e:
            log.exception("generation failed for request_id %r", item.request_id)
            message = f"Generation failed: {type(e).__name__}: {e}"
            return _failed(index, GenerationError(ErrorKind.ENGINE_ERROR, message))
        payload.histories[item.request_id] = History(
            history.token_ids + token_array(new_ids), finished.full_text, finished.is_eos
        )
        if payload.key is not None:
            self.store.put(payload.key, payload.histories)
        return finished


async def _generate(
    engine: Engine, index: int, history: History, payload: _Payload
) -> tuple[Finished, list[int]]:
    options, queue = payload.options, payload.queue
    started = time.perf_counter()
    pieces: list[str] = []
    new_ids: list[int] = []
    is_eos = history.ended_at_eos
    reason = "stop" if is_eos else "length"
    cached = 0
    if history.ended_at_eos:
        # The sequence is over: continuing it generates nothing (docs/PROTOCOLS.md).
        queue.put_nowait(Initialized(index, history.text))
    elif options.num_beams > 1:
        [best] = await engine.beam_search(history.token_ids.tolist(), options)
        queue.put_nowait(Initialized(index, history.text))
        pieces.append(best.text)
        new_ids.extend(best.token_ids)
        is_eos, reason = best.is_eos, best.finish_reason or reason
    else:
        initialized = False
        async for step in engine.stream(history.token_ids.tolist(), options):
            if not initialized:
                initialized = True
                queue.put_nowait(Initialized(index, history.text))
                cached = step.cached_tokens
            pieces.append(step.text)
            new_ids.extend(step.token_ids)
            if payload.stream and step.text:
                queue.put_nowait(Delta(index, step.text))
            if step.finished:
                is_eos, reason = step.is_eos, step.finish_reason or reason
    new_text = "".join(pieces)
    finished = Finished(
        index=index,
        new_text=new_text,
        full_text=history.text + new_text,
        new_tokens=len(new_ids),
        is_eos=is_eos,
        finish_reason=reason,
        execution_time=time.perf_counter() - started,
        cached_prompt_tokens=cached,
    )
    return finished, new_ids


def prompt_tokens(engine: Engine, prompt: str) -> list[int]:
    if not prompt:
        raise invalid(
            "The prompt must not be empty (a known request_id may continue with an empty prompt)",
            "prompt",
        )
    return engine.encode(prompt)


def check_context(engine: Engine, prompt_length: int) -> None:
    """Refuse a prompt that leaves no room for a new token in the model's context."""
    if prompt_length >= engine.max_model_len:
        raise GenerationError(
            ErrorKind.CONTEXT_LENGTH_EXCEEDED,
            f"The prompt is {prompt_length} tokens; this model's context is "
            f"{engine.max_model_len} tokens, which must also hold the new tokens",
            "prompt",
        )


def _duplicate(request_id: str) -> GenerationError:
    return GenerationError(
        ErrorKind.DUPLICATE_REQUEST_ID,
        f"request_id {request_id!r} is already generating; wait for its end or use another id",
        "request_id",
    )


def _failed(index: int, error: GenerationError) -> Failed:
    return Failed(index, error.kind, error.message, error.field)


def _merge_deltas(step: list[Event]) -> list[Event]:
    """Keep one Delta per prompt in a step, so no frame holds two updates of one prompt."""
    if len(step) == 1:
        return step
    merged: list[Event] = []
    deltas: dict[int, Delta] = {}
    for event in step:
        if isinstance(event, Delta):
            previous = deltas.get(event.index)
            if previous is not None:
                previous.text += event.text
                continue
            deltas[event.index] = event
        merged.append(event)
    return merged
