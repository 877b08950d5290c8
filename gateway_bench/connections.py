"""Connection scale: many idle WebSockets, then many concurrent streams, on one gateway
(docs/BENCHMARKS.md, "Connection scale")."""

from __future__ import annotations

import asyncio
from contextlib import suppress
from time import perf_counter

import aiohttp
import psutil

from gateway_bench.clients import send, ws_batch
from gateway_bench.metrics import Record
from gateway_bench.results import ConnectionResult
from gateway_bench.worker import Context, Worker
from gateway_bench.workload import Request, Workload

_HANDSHAKES_AT_ONCE = 64
_SETTLE_S = 1.5
_MB = 1 << 20


def _rss(process: psutil.Process | None) -> int | None:
    return None if process is None else int(process.memory_info().rss)


class _Idle:
    def __init__(self) -> None:
        self.sockets: list[aiohttp.ClientWebSocketResponse] = []
        self.holders: list[asyncio.Task[None]] = []
        self.errors: list[str] = []
        self.closing = False

    async def hold(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        message = await ws.receive()  # only returns when the connection closes or misbehaves
        if not self.closing:
            self.errors.append(f"idle connection ended: {message.type.name}")

    async def open(self, session: aiohttp.ClientSession, url: str, gate: asyncio.Semaphore) -> None:
        try:
            async with gate:
                ws = await session.ws_connect(url)
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            self.errors.append(f"connect: {type(e).__name__}: {e}")
            return
        self.sockets.append(ws)
        self.holders.append(asyncio.create_task(self.hold(ws)))

    async def close(self) -> None:
        self.closing = True
        await asyncio.gather(*(ws.close() for ws in self.sockets), return_exceptions=True)
        for task in self.holders:
            task.cancel()
        await asyncio.gather(*self.holders, return_exceptions=True)


async def _sample_peak(process: psutil.Process, peak: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], int(process.memory_info().rss))
        with suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


async def _stream(
    worker: Worker, request: Request, barrier: asyncio.Barrier, limit_s: float
) -> Record | str:
    """Open the connection, wait until every stream has, then stream one prompt."""
    try:
        try:
            await worker.websocket("/ws")
        finally:
            await barrier.wait()  # also when it failed: nobody waits for it
        async with asyncio.timeout(limit_s):
            return await send(ws_batch, worker, request)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    finally:
        await worker.close()


async def connection_scale(
    context: Context,
    workload: Workload,
    pid: int | None,
    counts: tuple[int, int, int],
    limit_s: float,
) -> ConnectionResult:
    """`counts`: the idle connections, the streams, and each stream's output tokens."""
    idle, streams, output_tokens = counts
    process = psutil.Process(pid) if pid is not None else None
    state = _Idle()
    rss_before = _rss(process)
    gate = asyncio.Semaphore(_HANDSHAKES_AT_ONCE)
    url = context.base_url + "/ws"
    try:
        await asyncio.gather(*(state.open(context.session, url, gate) for _ in range(idle)))
        await asyncio.sleep(_SETTLE_S)
        rss_idle = _rss(process)

        requests = workload.requests("streams", "streams", streams, output_tokens)
        peak, stop = [rss_idle or 0], asyncio.Event()
        sampler = asyncio.create_task(_sample_peak(process, peak, stop)) if process else None
        barrier = asyncio.Barrier(len(requests) + 1)
        tasks = [
            asyncio.create_task(_stream(Worker(context), r, barrier, limit_s)) for r in requests
        ]
        await barrier.wait()
        began = perf_counter()
        outcomes = await asyncio.gather(*tasks)
        wall = perf_counter() - began
        stop.set()
        if sampler is not None:
            await sampler
        open_at_end = sum(1 for ws in state.sockets if not ws.closed)
    finally:
        await state.close()

    stream_errors = [o for o in outcomes if isinstance(o, str)]
    per_connection = None
    if rss_before is not None and rss_idle is not None and state.sockets:
        per_connection = round((rss_idle - rss_before) / len(state.sockets) / 1024, 2)
    errors = state.errors or stream_errors
    first_error = errors[0] if errors else None
    return ConnectionResult(
        idle_requested=idle,
        idle_open=open_at_end,
        idle_errors=len(state.errors),
        rss_before_mb=None if rss_before is None else round(rss_before / _MB, 1),
        rss_idle_mb=None if rss_idle is None else round(rss_idle / _MB, 1),
        kb_per_idle_connection=per_connection,
        streams=streams,
        stream_errors=len(stream_errors),
        stream_tokens=sum(o.tokens for o in outcomes if isinstance(o, Record)),
        stream_output_tokens=output_tokens,
        stream_wall_s=round(wall, 3),
        rss_streaming_peak_mb=round(peak[0] / _MB, 1) if process is not None else None,
        first_error=first_error,
    )
