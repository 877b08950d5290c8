"""Continuation by request_id against a fresh and a resent history, on WS `/ws`
(docs/BENCHMARKS.md, "Continuation"): the sweep's measurement, and the replicas' (`turns`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any, NamedTuple

from tqdm import tqdm

from gateway_bench.clients import send, ws_batch
from gateway_bench.metrics import Record, median
from gateway_bench.results import ContinuationPoint, ContinuationResult
from gateway_bench.worker import Context, Worker
from gateway_bench.workload import Request, Workload, text_of


class Turns(NamedTuple):
    """One history's TTFTs in ms: continued, fresh, and resent verbatim (None: not asked)."""

    continued_ms: float
    fresh_ms: float
    resent_ms: float | None = None


async def turns(
    worker: Worker,
    workload: Workload,
    words: list[str],
    ids: tuple[str, str, str],
    lengths: tuple[int, int, int],
    limit_s: float = 300.0,
    around: Callable[[], AbstractAsyncContextManager[Any]] = nullcontext,
) -> Turns:
    """`words` answered with `generated` tokens under the first of `ids` (`lengths`: history,
    generated and new tokens), continued there by `new_tokens` (`around` the continuation),
    then a fresh history of the same length under the second id (another first word: nothing
    of it in the prefix cache), and the whole history resent verbatim under the third (none:
    not resent)."""
    history, generated, new_tokens = lengths
    key, fresh_id, resend_id = ids

    async def answer(request: Request) -> Record:
        try:
            async with asyncio.timeout(limit_s):
                return await send(ws_batch, worker, request)
        except Exception:
            await worker.close()
            raise

    prompt = text_of(words)
    made = (await answer(Request(key, prompt, generated, len(words)))).text or ""
    async with around():
        continued = await answer(Request(key, "", new_tokens, history))
    other = text_of(workload.salted(words, f"{workload.run}:fresh:{fresh_id}")) + made
    fresh = await answer(Request(fresh_id, other, new_tokens, history))
    if not resend_id:
        return Turns(continued.ttft_ms(), fresh.ttft_ms())
    resent = await answer(Request(resend_id, prompt + made, new_tokens, history))
    return Turns(continued.ttft_ms(), fresh.ttft_ms(), resent.ttft_ms())


async def continuation_bench(
    context: Context,
    workload: Workload,
    histories: tuple[int, ...],
    repetitions: int,
    tokens: tuple[int, int],
    limit_s: float,
    progress: tqdm[Any],
) -> ContinuationResult:
    """Each history length `repetitions` times; `tokens`: generated in the history, and asked
    of each measured request."""
    worker = Worker(context)
    generated, new_tokens = tokens
    points: list[ContinuationPoint] = []
    try:
        for history in histories:
            progress.set_postfix_str(f"continuation at {history} tokens")
            measured: list[Turns] = []
            errors: list[str] = []
            for rep in range(repetitions):
                words = workload.words_for(f"history-{history}", rep, history - generated)
                words = workload.salted(words, f"{workload.run}:history")
                key, fresh, resend = (
                    workload.request_id(kind, history, rep)
                    for kind in ("history", "fresh", "resend")
                )
                lengths = (history, generated, new_tokens)
                try:
                    turn = await turns(
                        worker, workload, words, (key, fresh, resend), lengths, limit_s
                    )
                    measured.append(turn)
                except Exception as e:
                    errors.append(f"{type(e).__name__}: {e}")
                progress.update(1)
            cont = median([t.continued_ms for t in measured], 2)
            cold = median([t.fresh_ms for t in measured], 2)
            points.append(
                ContinuationPoint(
                    history_tokens=history,
                    repetitions=repetitions,
                    continuation_ttft_ms=cont,
                    fresh_ttft_ms=cold,
                    resend_ttft_ms=median([t.resent_ms for t in measured if t.resent_ms], 2),
                    ratio=round(cont / cold, 3) if cont is not None and cold else None,
                    errors=len(errors),
                    first_error=errors[0] if errors else None,
                )
            )
    finally:
        await worker.close()
    return ContinuationResult(
        protocol="WS /ws", generated_tokens=generated, new_tokens=new_tokens, points=points
    )
