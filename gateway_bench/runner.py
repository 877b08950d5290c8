"""The sweep's targets, and the one step runner of every scenario: a step's requests sent back
to back by C workers (docs/BENCHMARKS.md, "The workload" and "The figures"), and variants
measured in turn, their ratios' medians."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from time import perf_counter

from gateway_bench import clients
from gateway_bench.cpu import CpuMeter, CpuUse
from gateway_bench.metrics import Record, failed, summarize
from gateway_bench.results import StepResult, TargetKind, TargetResult, TokenSource
from gateway_bench.worker import Context, Worker
from gateway_bench.workload import Request
from protocols.names import Protocol


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

    def result(
        self, steps: list[StepResult], notes: str = "", warmup_errors: int = 0
    ) -> TargetResult:
        return TargetResult(
            name=self.name,
            label=self.label,
            kind=self.kind,
            tokens=self.tokens,
            notes=notes or self.notes,
            steps=steps,
            warmup_errors=warmup_errors,
            logprobs=self.logprobs,
            compared_with=self.compared_with,
        )


# The references: vLLM in-process (the ceiling) and vLLM's OpenAI server, each target's
# name its kind.
_REFERENCES: tuple[tuple[TargetKind, str, clients.Call, TokenSource, str], ...] = (
        ("ceiling", "vLLM in-process", clients.inprocess(), "counted",
         "vLLM's AsyncLLM called directly, RequestOutputKind.DELTA, the gateway's CPU "
         "settings (dtype, environment); exact token counts"),
        ("ceiling-logprobs", "vLLM in-process, logprobs=0", clients.inprocess(0), "counted",
         "as the ceiling, with logprobs=0: the reference for protocols that send every "
         "token's log-probability"),
        ("vllm-server", "vLLM OpenAI server", clients.completions, "reported",
         "streaming /v1/completions, ignore_eos; tokens from usage (stream_options); the "
         "gateway's CPU settings (--dtype, environment)"),
        ("vllm-server-logprobs", "vLLM OpenAI server, logprobs=0", clients.completions_logprobs,
         "reported", "as vLLM's server, with logprobs: 0 (each token's log-probability)"),
        ("vllm-server-defaults", "vLLM OpenAI server, its defaults", clients.completions,
         "reported",
         "as vLLM's server, started with vLLM's own defaults: no --dtype, no added environment"),
        ("vllm-server-chat", "vLLM OpenAI server, chat", clients.chat_completions, "reported",
         "streaming /v1/chat/completions (the prompt as one user message), ignore_eos, "
         "include_usage; the reference for the gateway's chat route"),
        ("llama-cpp", "llama.cpp llama-server, chat", clients.chat_completions, "reported",
         "llama.cpp's own server (--llama-cpp: built from llama-cpp-python's sdist) on the "
         "shipped Q4_1 GGUF, streaming /v1/chat/completions, ignore_eos, include_usage"),
)  # fmt: skip
REFERENCES: dict[TargetKind, Client] = {
    kind: Client(kind, label, call, kind, tokens, notes=notes)
    for kind, label, call, tokens, notes in _REFERENCES
}
_SAME = "the very request sent to vLLM's server"
_PROTOCOLS: tuple[tuple[Protocol, str, clients.Call, TokenSource, str, str], ...] = (
    # protocol, label, client, token source, how it is measured, its WebSocket path
    (Protocol.WS, "WS /ws", clients.ws_batch, "reported",
     "one prompt per payload, generation_config.ignore_eos; COMPLETE.new_tokens_count", "/ws"),
    (Protocol.API_GENERATE_ONE, "POST /api/generate-one", clients.generate_one, "requested",
     "streamed text/plain; no token count on the wire: max_new_tokens (ignore_eos)", ""),
    (Protocol.CONTROL, "WS /generate", clients.control_ws, "reported",
     "control protocol, parameters.ignore_eos; usage.completion_tokens", "/generate"),
    (Protocol.V1_GENERATE, "POST /v1/generate (SSE)", clients.v1_generate, "reported",
     "stream: true, ignore_eos; usage.completion_tokens", ""),
    (Protocol.WS_EVENTS, "WS /ws/events", clients.ws_events_stream, "requested",
     "parameters.ignore_eos; no token count on the wire: max_new_tokens", "/ws/events"),
    (Protocol.LMI, "POST /invocations (jsonlines)", clients.invocations, "counted",
     "parameters.ignore_eos_token; one line per token, exact counts", ""),
    (Protocol.TGI, "POST /generate_stream (TGI)", clients.tgi_stream, "counted",
     "parameters.ignore_eos_token (a gateway extension); tokens counted from the stream", ""),
    (Protocol.OPENAI_CHAT, "POST /v1/chat/completions", clients.chat_completions, "reported",
     f"{_SAME} (its chat row): stream, include_usage, ignore_eos; usage.completion_tokens", ""),
    (Protocol.OPENAI_COMPLETIONS, "POST /v1/completions", clients.completions, "reported",
     f"{_SAME}: stream, include_usage, ignore_eos; usage.completion_tokens", ""),
    (Protocol.OLLAMA, "POST /api/chat (Ollama, NDJSON)", clients.ollama_chat, "reported",
     "stream, options.num_predict and ignore_eos (a gateway extension); the last line's "
     "eval_count", ""),
)  # fmt: skip


def _gateway(
    name: Protocol, label: str, call: clients.Call, tokens: TokenSource, notes: str, path: str
) -> Client:
    """The protocols that count tokens from the stream send each token's log-probability with
    it; the chat route is compared with vLLM's chat route, the others with /v1/completions."""
    chat = name in (Protocol.OPENAI_CHAT, Protocol.OLLAMA)
    compared: TargetKind = "vllm-server-chat" if chat else "vllm-server"
    logprobs = tokens == "counted"
    return Client(name, label, call, "gateway", tokens, path or None, notes, logprobs, compared)


GATEWAY_CLIENTS: tuple[Client, ...] = tuple(_gateway(*row) for row in _PROTOCOLS)


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


@dataclass
class Step:
    """One step's records, wall time, and the CPU used meanwhile (cpu.py)."""

    records: list[Record]
    wall_s: float
    cpu: CpuUse

    def figures(self, concurrency: int, expected_tokens: int = 0) -> StepResult:
        """The step's figures (metrics.summarize), with its frontend CPU per token."""
        step = summarize(self.records, concurrency, self.wall_s, expected_tokens)
        step.other_cpu_pct = self.cpu.other_pct
        step.frontend_cpu_ms_per_token = self.cpu.per_token_ms(step.tokens)
        return step


async def run_step(
    client: Client,
    context: Context,
    requests: Iterable[Request],
    concurrency: int,
    on_done: Callable[[], object] = lambda: None,
    limit_s: float = 300.0,
    profile: str = "",
) -> Step:
    """Every request answered, by `concurrency` workers. `profile`: the step's name, under
    which a py-spy profile of the server is recorded when the context asks for profiles."""
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
            on_done()

    where = (
        context.profiles / f"{profile}.speedscope.json" if profile and context.profiles else None
    )
    meter = await CpuMeter.start(context.pids, where)
    began = perf_counter()
    try:
        await asyncio.gather(*(work(w) for w in workers))
        wall = perf_counter() - began
    finally:
        cpu = await meter.stop()  # also on a failure: its py-spy ended
        await asyncio.gather(*(w.close() for w in workers), return_exceptions=True)
    return Step(records, wall, cpu)


async def repeated(
    variants: Sequence[str],
    repeats: int,
    measure: Callable[[str], Awaitable[StepResult]],
    ratio_to: Callable[[str], str | None],
) -> dict[str, tuple[list[StepResult], float | None]]:
    """Every variant measured `repeats` times, in turn within each repeat (a shared machine's
    load drifts between repeats): each variant's steps, and the median of its tok/s ratio to
    `ratio_to(variant)` within each repeat (None: compared with none)."""
    steps: dict[str, list[StepResult]] = {v: [] for v in variants}
    ratios: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(repeats):
        for variant in variants:
            steps[variant].append(await measure(variant))
        for variant in variants:
            other = ratio_to(variant)
            if other is not None and steps[other][-1].tokens_per_s:
                ratio = steps[variant][-1].tokens_per_s / steps[other][-1].tokens_per_s
                ratios[variant].append(ratio)
    return {
        v: (steps[v], round(statistics.median(ratios[v]), 3) if ratios[v] else None)
        for v in variants
    }
