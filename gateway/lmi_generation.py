"""Engine calls for the LMI and TGI routes: one prompt, or a dynamic batch, under a plan.

Every prompt goes through `GenerationService.engine_slot()` (admission, then the ready
engine), `prompt_tokens` and `check_context`. A stream that is closed, or a call that is
cancelled, aborts its engine requests. Failures are `GenerationError`s (`PromptFailed` in a
dynamic batch, which says which prompt).
"""

from __future__ import annotations

import asyncio
import logging
import math
import weakref
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing

import msgspec

from gateway.engine import Engine, EngineStep
from gateway.generation import GenerationService, check_context, prompt_tokens
from protocols.errors import ErrorKind, GenerationError
from protocols.generation import TokenInfo
from protocols.generation_plan import Generated, Generation, GenerationPlan, Piece

log = logging.getLogger(__name__)
_SPECIAL: weakref.WeakKeyDictionary[Engine, frozenset[int]] = weakref.WeakKeyDictionary()


class PromptFailed(Exception):
    """The failure of the prompt at `index` of a dynamic batch."""

    def __init__(self, index: int, error: GenerationError) -> None:
        super().__init__(error.message)
        self.index = index
        self.error = error


def special_ids(engine: Engine) -> frozenset[int]:
    found = _SPECIAL.get(engine)
    if found is None:
        found = frozenset(int(i) for i in engine.tokenizer.all_special_ids)
        _SPECIAL[engine] = found
    return found


def finish_reason(step: EngineStep, plan: GenerationPlan) -> str:
    """vLLM's reason in the LMI / TGI vocabulary: length, eos_token or stop_sequence."""
    if step.finish_reason != "stop":
        return "length"
    stop = step.stop_reason
    if isinstance(stop, str) or (isinstance(stop, int) and stop in plan.options.stop_token_ids):
        return "stop_sequence"
    return "eos_token"


def _prompt_ids(engine: Engine, prompt: str, plan: GenerationPlan) -> list[int]:
    ids = prompt_tokens(engine, prompt)
    if plan.truncate is not None:
        ids = ids[-plan.truncate :]
    try:
        check_context(engine, len(ids))
    except GenerationError as e:
        raise GenerationError(e.kind, e.message, "$.inputs") from e
    return ids


def _unknown(engine: Engine, token_id: int) -> TokenInfo:
    """A token the engine gave no log-probability for (beam search, first prompt token)."""
    return TokenInfo(token_id, engine.decode([token_id]), math.nan)


def _prefill(
    engine: Engine, ids: list[int], infos: Sequence[TokenInfo | None] | None
) -> list[TokenInfo]:
    listed = list(infos or ())
    prefill: list[TokenInfo] = []
    for i, tid in enumerate(ids):
        info = listed[i] if i < len(listed) else None
        prefill.append(info if info is not None else _unknown(engine, tid))
    return prefill


def _score(sequence: Generated, by_mean: bool) -> float:
    logprobs = [t.logprob for t in sequence.tokens or () if not math.isnan(t.logprob)]
    total = sum(logprobs)
    return total / max(len(logprobs), 1) if by_mean else total


def _engine_failure(e: Exception) -> GenerationError:
    log.exception("LMI/TGI generation failed")
    return GenerationError(ErrorKind.ENGINE_ERROR, f"Generation failed: {type(e).__name__}: {e}")


async def generate(
    service: GenerationService, prompt: str, plan: GenerationPlan, protocol: str
) -> Generation:
    """Every sequence the plan asks for, run to the end; the best `plan.returned`, best first."""
    try:
        async with service.engine_slot(protocol) as engine:
            ids = _prompt_ids(engine, prompt, plan)
            if plan.beam:
                steps = await engine.beam_search(ids, plan.options, beams_returned=plan.returned)
            else:
                options = msgspec.structs.replace(plan.options, n=plan.sequences)
                steps = await engine.complete(ids, options)
    except GenerationError:
        raise
    except Exception as e:
        raise _engine_failure(e) from e
    sequences = [
        Generated(
            s.text,
            len(s.token_ids),
            finish_reason(s, plan),
            [_unknown(engine, t) for t in s.token_ids] if plan.beam else s.tokens,
        )
        for s in steps
    ]
    if not plan.beam and len(sequences) > 1:
        sequences.sort(key=lambda s: _score(s, plan.rank_by_mean), reverse=True)
        del sequences[plan.returned :]
    prefill = _prefill(engine, ids, steps[0].prompt_tokens) if plan.prefill else None
    return Generation(sequences, len(ids), special_ids(engine), prefill)


async def _pieces(
    service: GenerationService, prompt: str, plan: GenerationPlan, protocol: str
) -> AsyncGenerator[Piece, None]:
    try:
        async with service.engine_slot(protocol) as engine:
            ids = _prompt_ids(engine, prompt, plan)
            special = special_ids(engine)
            prefill: list[TokenInfo] | None = None
            texts: list[str] = []
            count = 0
            # Engine.stream is an async generator (typed as an iterator): close it to abort.
            steps = engine.stream(ids, plan.options)
            async with aclosing(steps):
                async for step in steps:
                    if plan.prefill and prefill is None:
                        prefill = _prefill(engine, ids, step.prompt_tokens)
                    texts.append(step.text)
                    count += len(step.token_ids)
                    final = None
                    if step.finished:
                        done = Generated("".join(texts), count, finish_reason(step, plan))
                        final = Generation([done], len(ids), special, prefill)
                    yield Piece(step.text, step.tokens or [], special, final)
                    if final is not None:
                        return
    except GenerationError:
        raise
    except Exception as e:
        raise _engine_failure(e) from e
    raise GenerationError(ErrorKind.ENGINE_ERROR, "The engine ended the generation unfinished")


async def stream(
    service: GenerationService, prompt: str, plan: GenerationPlan, protocol: str
) -> AsyncGenerator[Piece, None]:
    """One piece per engine step; the last carries the finished `Generation`."""
    async with aclosing(stream_many(service, [prompt], plan, protocol)) as batches:
        try:
            async for batch in batches:
                for _, piece in batch:
                    yield piece
        except PromptFailed as e:
            raise e.error from None


async def generate_many(
    service: GenerationService, prompts: Sequence[str], plan: GenerationPlan, protocol: str
) -> list[Generation]:
    """A dynamic batch: every prompt at once; the first failure cancels the others."""

    async def one(index: int, prompt: str) -> Generation:
        try:
            return await generate(service, prompt, plan, protocol)
        except GenerationError as e:
            raise PromptFailed(index, e) from e

    tasks = [asyncio.create_task(one(i, p)) for i, p in enumerate(prompts)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def stream_many(
    service: GenerationService, prompts: Sequence[str], plan: GenerationPlan, protocol: str
) -> AsyncGenerator[list[tuple[int, Piece]], None]:
    """A streamed dynamic batch: what each wake-up found, as (prompt index, piece) pairs.

    Each prompt generates in a task of its own, so its admission slot is entered and left in
    one task (and context) whichever task reads the pieces.
    """
    queue: asyncio.Queue[tuple[int, Piece] | PromptFailed] = asyncio.Queue()

    async def pump(index: int, prompt: str) -> None:
        pieces = _pieces(service, prompt, plan, protocol)
        try:
            async for piece in pieces:
                queue.put_nowait((index, piece))
        except GenerationError as e:
            queue.put_nowait(PromptFailed(index, e))
        except Exception as e:  # a bug must still end the stream rather than hang it
            queue.put_nowait(PromptFailed(index, _engine_failure(e)))
        finally:
            await pieces.aclose()

    tasks = [asyncio.create_task(pump(i, p)) for i, p in enumerate(prompts)]
    remaining = len(prompts)
    try:
        while remaining:
            found = [await queue.get()]
            while not queue.empty():
                found.append(queue.get_nowait())
            batch: list[tuple[int, Piece]] = []
            for item in found:
                if isinstance(item, PromptFailed):
                    raise item
                batch.append(item)
                if item[1].final is not None:
                    remaining -= 1
            yield batch
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
