"""Continuation by request_id against a fresh and a resent history, on WS `/ws`
(docs/BENCHMARKS.md, "Continuation")."""

from __future__ import annotations

import asyncio

from gateway_bench.clients import send, ws_batch
from gateway_bench.metrics import Record, median
from gateway_bench.results import ContinuationPoint, ContinuationResult
from gateway_bench.runner import Progress
from gateway_bench.sweep_options import BenchOptions
from gateway_bench.worker import Context, Worker
from gateway_bench.workload import Request, Workload, text_of


async def _send(worker: Worker, request: Request, limit_s: float) -> Record:
    try:
        async with asyncio.timeout(limit_s):
            return await send(ws_batch, worker, request)
    except Exception:
        await worker.close()
        raise


async def _point(
    worker: Worker, workload: Workload, history: int, o: BenchOptions, progress: Progress
) -> ContinuationPoint:
    generated, new_tokens = o.continuation_generated, o.continuation_new_tokens
    limit_s = o.request_timeout
    continued: list[float] = []
    fresh: list[float] = []
    resent: list[float] = []
    errors: list[str] = []
    for rep in range(o.continuation_repetitions):
        words = workload.words_for(f"history-{history}", rep, history - generated)
        words = workload.salted(words, f"{workload.run}:history")
        prompt = text_of(words)
        key = workload.request_id("history", history, rep)
        try:
            first = await _send(worker, Request(key, prompt, generated, len(words)), limit_s)
            whole = prompt + (first.text or "")
            again = await _send(worker, Request(key, "", new_tokens, history), limit_s)
            continued.append(again.ttft_ms())
            other = text_of(workload.salted(words, f"{workload.run}:fresh:{rep}")) + (
                first.text or ""
            )
            fresh_id = workload.request_id("fresh", history, rep)
            cold = await _send(worker, Request(fresh_id, other, new_tokens, history), limit_s)
            fresh.append(cold.ttft_ms())
            resend_id = workload.request_id("resend", history, rep)
            warm = await _send(worker, Request(resend_id, whole, new_tokens, history), limit_s)
            resent.append(warm.ttft_ms())
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
        progress.update(1)
    cont, cold_ms = median(continued, 2), median(fresh, 2)
    return ContinuationPoint(
        history_tokens=history,
        repetitions=o.continuation_repetitions,
        continuation_ttft_ms=cont,
        fresh_ttft_ms=cold_ms,
        resend_ttft_ms=median(resent, 2),
        ratio=round(cont / cold_ms, 3) if cont is not None and cold_ms else None,
        errors=len(errors),
        first_error=errors[0] if errors else None,
    )


async def continuation_bench(
    context: Context, workload: Workload, options: BenchOptions, progress: Progress
) -> ContinuationResult:
    worker = Worker(context)
    points: list[ContinuationPoint] = []
    try:
        for history in options.continuation_lengths:
            progress.set_postfix_str(f"continuation at {history} tokens")
            points.append(await _point(worker, workload, history, options, progress))
    finally:
        await worker.close()
    return ContinuationResult(
        protocol="WS /ws",
        generated_tokens=options.continuation_generated,
        new_tokens=options.continuation_new_tokens,
        points=points,
    )
