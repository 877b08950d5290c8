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
from collections.abc import AsyncGenerator, Sequence

from gateway.admission import Admission
from gateway.continuation import ContinuationStore, History
from gateway.engine import Engine
from gateway.engine_holder import EngineHolder
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


class GenerationService:
    def __init__(
        self, holder: EngineHolder, admission: Admission, store: ContinuationStore
    ) -> None:
        self.holder = holder
        self.admission = admission
        self.store = store
        self._in_flight: set[str] = set()

    async def run(
        self, items: Sequence[PromptItem], options: SamplingOptions, *, stream: bool
    ) -> AsyncGenerator[list[Event], None]:
        key = tuple(item.request_id for item in items)
        queue: asyncio.Queue[Event] = asyncio.Queue()
        known = self.store.get(key) or {}
        histories = dict(known)
        claimed: list[str] = []
        tasks: list[asyncio.Task[None]] = []
        for index, item in enumerate(items):
            if item.request_id in self._in_flight:
                queue.put_nowait(_failed(index, _duplicate(item.request_id)))
                continue
            self._in_flight.add(item.request_id)
            claimed.append(item.request_id)
            history = known.get(item.request_id)
            job = self._run_one(index, item, history, options, stream, queue, histories)
            tasks.append(asyncio.create_task(job))
        remaining = len(items)
        try:
            while remaining:
                step = [await queue.get()]
                while not queue.empty():
                    step.append(queue.get_nowait())
                remaining -= sum(isinstance(e, Finished | Failed) for e in step)
                yield _merge_deltas(step)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._in_flight.difference_update(claimed)
            if tasks:
                self.store.put(key, histories)

    async def _run_one(
        self,
        index: int,
        item: PromptItem,
        history: History | None,
        options: SamplingOptions,
        stream: bool,
        queue: asyncio.Queue[Event],
        histories: dict[str, History],
    ) -> None:
        try:
            async with self.admission.slot():
                engine = await self.holder.wait()
                if history is None:
                    history = History(_prompt_tokens(engine, item.prompt), item.prompt)
                _check_context(engine, history)
                queue.put_nowait(Started(index))
                finished, new_ids = await _generate(engine, index, history, options, stream, queue)
            histories[item.request_id] = History(
                history.token_ids + new_ids, finished.full_text, finished.is_eos
            )
            queue.put_nowait(finished)
        except GenerationError as e:
            queue.put_nowait(_failed(index, e))
        except Exception as e:
            log.exception("generation failed for request_id %r", item.request_id)
            queue.put_nowait(_failed(index, GenerationError(ErrorKind.ENGINE_ERROR, f"{e}")))


async def _generate(
    engine: Engine,
    index: int,
    history: History,
    options: SamplingOptions,
    stream: bool,
    queue: asyncio.Queue[Event],
) -> tuple[Finished, list[int]]:
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
        best = await engine.beam_search(history.token_ids, options)
        queue.put_nowait(Initialized(index, history.text))
        pieces.append(best.text)
        new_ids.extend(best.token_ids)
        is_eos, reason = best.is_eos, best.finish_reason or reason
    else:
        async for step in engine.stream(history.token_ids, options):
            if not new_ids:
                queue.put_nowait(Initialized(index, history.text))
                cached = step.cached_tokens
            pieces.append(step.text)
            new_ids.extend(step.token_ids)
            if stream and step.text:
                queue.put_nowait(Delta(index, step.text, len(step.token_ids)))
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


def _prompt_tokens(engine: Engine, prompt: str) -> list[int]:
    if not prompt:
        raise invalid("`prompt` must not be empty when its request_id has no history", "prompt")
    return engine.encode(prompt)


def _check_context(engine: Engine, history: History) -> None:
    if len(history.token_ids) >= engine.max_model_len:
        raise GenerationError(
            ErrorKind.CONTEXT_LENGTH_EXCEEDED,
            f"The prompt is {len(history.token_ids)} tokens; this model's context is "
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
    return Failed(index, error.kind.value, error.message, error.field)


def _merge_deltas(step: list[Event]) -> list[Event]:
    """Keep one Delta per prompt in a step, so no frame holds two updates of one prompt."""
    merged: list[Event] = []
    deltas: dict[int, Delta] = {}
    for event in step:
        if isinstance(event, Delta):
            previous = deltas.get(event.index)
            if previous is not None:
                previous.text += event.text
                previous.token_count += event.token_count
                continue
            deltas[event.index] = event
        merged.append(event)
    return merged
