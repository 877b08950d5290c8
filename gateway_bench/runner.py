"""The sweep's targets, and the concurrency sweep: for each step, C workers send the step's
requests back to back (docs/BENCHMARKS.md, "The workload" and "The figures")."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Protocol as Interface

from gateway_bench import clients
from gateway_bench.cpu import CpuMeter, CpuUse
from gateway_bench.metrics import Record, failed, summarize
from gateway_bench.results import StepResult, TargetKind, TargetResult, TokenSource
from gateway_bench.worker import Context, Worker
from gateway_bench.workload import Request, Workload
from protocols.names import Protocol

WARMUP_TOKENS = 8


@dataclass(frozen=True)
class Client:
    """One measured target: how to send it a request, and how to report it."""

    name: str  # CLI and JSON name: a gateway protocol's `protocols.names.Protocol` value
    label: str  # table label
    call: clients.Call
    kind: TargetKind
    tokens: TokenSource
    websocket: str | None = None  # a worker opens this path before the measurement
    notes: str = ""
    # Every token on the wire carries its log-probability, which the engine must compute.
    logprobs: bool = False
    compared_with: TargetKind = "vllm-server"  # the vLLM server target on the same route


INPROCESS = Client(
    "ceiling",
    "vLLM in-process",
    clients.inprocess,
    "ceiling",
    "counted",
    notes="vLLM's AsyncLLM called directly, RequestOutputKind.DELTA, the gateway's CPU "
    "settings (dtype, environment); exact token counts",
)
INPROCESS_LOGPROBS = Client(
    "ceiling-logprobs",
    "vLLM in-process, logprobs=0",
    clients.inprocess_logprobs,
    "ceiling-logprobs",
    "counted",
    notes="as the ceiling, with logprobs=0: the reference for protocols that send every "
    "token's log-probability",
)
VLLM_SERVER = Client(
    "vllm-server",
    "vLLM OpenAI server",
    clients.completions,
    "vllm-server",
    "reported",
    notes="streaming /v1/completions, ignore_eos; tokens from usage (stream_options); the "
    "gateway's CPU settings (--dtype, environment)",
)
VLLM_SERVER_LOGPROBS = Client(
    "vllm-server-logprobs",
    "vLLM OpenAI server, logprobs=0",
    clients.completions_logprobs,
    "vllm-server-logprobs",
    "reported",
    notes="as vLLM's server, with logprobs: 0 (each token's log-probability)",
)
VLLM_SERVER_DEFAULTS = Client(
    "vllm-server-defaults",
    "vLLM OpenAI server, its defaults",
    clients.completions,
    "vllm-server-defaults",
    "reported",
    notes="as vLLM's server, started with vLLM's own defaults: no --dtype, no added environment",
)
VLLM_SERVER_CHAT = Client(
    "vllm-server-chat",
    "vLLM OpenAI server, chat",
    clients.chat_completions,
    "vllm-server-chat",
    "reported",
    notes="streaming /v1/chat/completions (the prompt as one user message), ignore_eos, "
    "include_usage; the reference for the gateway's chat route",
)
GATEWAY_CLIENTS: tuple[Client, ...] = (
    Client(
        Protocol.WS,
        "WS /ws",
        clients.ws_batch,
        "gateway",
        "reported",
        websocket="/ws",
        notes="one prompt per payload, generation_config.ignore_eos; COMPLETE.new_tokens_count",
    ),
    Client(
        Protocol.API_GENERATE_ONE,
        "POST /api/generate-one",
        clients.generate_one,
        "gateway",
        "requested",
        notes="streamed text/plain; no token count on the wire: max_new_tokens (ignore_eos)",
    ),
    Client(
        Protocol.CONTROL,
        "WS /generate",
        clients.control_ws,
        "gateway",
        "reported",
        websocket="/generate",
        notes="control protocol, parameters.ignore_eos; usage.completion_tokens",
    ),
    Client(
        Protocol.V1_GENERATE,
        "POST /v1/generate (SSE)",
        clients.v1_generate,
        "gateway",
        "reported",
        notes="stream: true, ignore_eos; usage.completion_tokens",
    ),
    Client(
        Protocol.WS_EVENTS,
        "WS /ws/events",
        clients.ws_events_stream,
        "gateway",
        "requested",
        websocket="/ws/events",
        notes="parameters.ignore_eos; no token count on the wire: max_new_tokens",
    ),
    Client(
        Protocol.LMI,
        "POST /invocations (jsonlines)",
        clients.invocations,
        "gateway",
        "counted",
        notes="parameters.ignore_eos_token; one line per token, exact counts",
        logprobs=True,
    ),
    Client(
        Protocol.TGI,
        "POST /generate_stream (TGI)",
        clients.tgi_stream,
        "gateway",
        "counted",
        notes="parameters.ignore_eos_token (a gateway extension); tokens counted from the stream",
        logprobs=True,
    ),
    Client(
        Protocol.OPENAI_CHAT,
        "POST /v1/chat/completions",
        clients.chat_completions,
        "gateway",
        "reported",
        notes="the very request sent to vLLM's server (its chat row): stream, include_usage, "
        "ignore_eos; usage.completion_tokens",
        compared_with="vllm-server-chat",
    ),
    Client(
        Protocol.OPENAI_COMPLETIONS,
        "POST /v1/completions",
        clients.completions,
        "gateway",
        "reported",
        notes="the very request sent to vLLM's server: stream, include_usage, ignore_eos; "
        "usage.completion_tokens",
    ),
)


class Progress(Interface):
    def update(self, n: float | None = 1) -> bool | None: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: ...


class NoProgress:
    def update(self, n: float | None = 1) -> bool | None:
        return None

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        return None


def requests_per_step(concurrency: int, rounds: int, minimum: int) -> int:
    return max(concurrency * rounds, minimum)


def _error_text(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "timed out"
    return str(error) or type(error).__name__


async def _one(client: Client, worker: Worker, request: Request, limit_s: float) -> Record:
    sent = perf_counter()
    try:
        async with asyncio.timeout(limit_s):
            return await clients.send(client.call, worker, request)
    except Exception as e:
        await worker.close()  # a WebSocket in an unknown state is not reused
        return failed(sent, f"{type(e).__name__}: {_error_text(e)}")


async def run_step(
    client: Client,
    context: Context,
    requests: Sequence[Request],
    concurrency: int,
    progress: Progress,
    limit_s: float,
) -> tuple[list[Record], float, CpuUse]:
    """Every request answered, by `concurrency` workers: the records, the wall time and the
    CPU used meanwhile (cpu.py)."""
    workers = [Worker(context) for _ in range(concurrency)]
    if client.websocket is not None:
        path = client.websocket
        # A connection that fails to open is retried by its first request, which counts the error.
        await asyncio.gather(*(w.websocket(path) for w in workers), return_exceptions=True)
    pending = iter(requests)
    records: list[Record] = []

    async def work(worker: Worker) -> None:
        for request in pending:  # one shared iterator: each worker takes the next request
            records.append(await _one(client, worker, request, limit_s))
            progress.update(1)

    meter = CpuMeter(context.pids)
    meter.start()
    began = perf_counter()
    try:
        await asyncio.gather(*(work(w) for w in workers))
        wall = perf_counter() - began
    finally:
        await asyncio.gather(*(w.close() for w in workers), return_exceptions=True)
    return records, wall, meter.stop()


async def sweep(
    client: Client,
    context: Context,
    workload: Workload,
    concurrencies: Sequence[int],
    *,
    rounds: int,
    minimum: int,
    progress: Progress,
    limit_s: float,
) -> TargetResult:
    peak = max(concurrencies)
    warmup = workload.requests(
        client.name, "warmup", peak, min(WARMUP_TOKENS, workload.output_tokens)
    )
    progress.set_postfix_str(f"{client.label}: warm-up")
    warm_records, _, _ = await run_step(client, context, warmup, peak, NoProgress(), limit_s)
    steps: list[StepResult] = []
    for concurrency in concurrencies:
        count = requests_per_step(concurrency, rounds, minimum)
        requests = workload.requests(client.name, f"c{concurrency}", count)
        progress.set_postfix_str(f"{client.label}: concurrency {concurrency}")
        records, wall, cpu = await run_step(
            client, context, requests, concurrency, progress, limit_s
        )
        expected = sum(r.max_new_tokens for r in requests)
        step = summarize(records, concurrency=concurrency, wall_s=wall, expected_tokens=expected)
        step.other_cpu_pct = cpu.other_pct
        if step.tokens:
            step.frontend_cpu_ms_per_token = round(cpu.frontend_s * 1000 / step.tokens, 3)
        steps.append(step)
    return TargetResult(
        name=client.name,
        label=client.label,
        kind=client.kind,
        tokens=client.tokens,
        notes=client.notes,
        steps=steps,
        warmup_errors=sum(1 for r in warm_records if r.error is not None),
        logprobs=client.logprobs,
        compared_with=client.compared_with,
    )
