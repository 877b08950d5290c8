"""`llm-gateway bench mixed`: a person's chats under a saturating batch load (docs/BENCHMARKS.md,
"Mixed")."""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter

import aiohttp

from gateway.config.settings import served_model_name
from gateway_bench import machine, targets
from gateway_bench.clients import (
    Call,
    chat_completions,
    completions,
    control_ws,
    invocations,
    send,
)
from gateway_bench.engine_counts import drained
from gateway_bench.metrics import Record
from gateway_bench.mixed_options import QUICK, SCHEDULES, Chat, MixedOptions, burst, check
from gateway_bench.mixed_report import (
    MixedReport,
    RegimeResult,
    ShapeResult,
    TargetResult,
    markdown,
    write_report,
)
from gateway_bench.options import Scenario
from gateway_bench.worker import Context, Worker, pooled_connector
from gateway_bench.workload import Request

# A target's server for a regime, ready to measure: (target name, regime) -> its endpoint.
StartTarget = Callable[[str, str], AbstractAsyncContextManager[targets.Endpoint]]
_WORDS = ("river", "stone", "light", "music", "garden", "winter", "market", "story", "harbor")


@dataclass(frozen=True)
class Target:
    name: str
    interactive: Call
    batch: Call
    is_vllm: bool


TARGETS = {
    "vllm-server": Target("vllm-server", chat_completions, completions, True),
    "gateway-fcfs": Target("gateway-fcfs", control_ws, invocations, False),
    "gateway-priority": Target("gateway-priority", control_ws, invocations, False),
}


def _prompt(rng: random.Random, words: int, tag: str) -> str:
    return f"{tag}: " + " ".join(rng.choice(_WORDS) for _ in range(words))


class Requests:
    """Fresh prompts (no two alike: the prefix cache helps no target)."""

    def __init__(self, options: MixedOptions, target: str) -> None:
        self._rng = random.Random(f"{options.seed}-{target}")
        self._options = options
        self._n = 0

    def make(self, kind: str, tokens: int) -> Request:
        self._n += 1
        prompt = _prompt(self._rng, self._options.prompt_words, f"{kind} {self._n}")
        return Request(f"{kind}-{self._n}", prompt, tokens, self._options.prompt_words)


@dataclass
class Bench:
    """What a target's measurement shares: its clients, its server and its prompts."""

    target: Target
    context: Context
    options: MixedOptions
    requests: Requests
    running_limit: int

    async def chat(self, tokens: int) -> Record:
        worker = Worker(self.context)  # a person: a connection of their own
        try:
            return await send(self.target.interactive, worker, self.requests.make("chat", tokens))
        finally:
            await worker.close()


def batch_tokens(options: MixedOptions, rng: random.Random) -> int:
    """A batch request's max_tokens: `batch_tokens` give or take `batch_tokens_spread`."""
    spread = round(options.batch_tokens * options.batch_tokens_spread)
    return max(1, options.batch_tokens + rng.randint(-spread, spread))


@dataclass
class BatchLoad:
    """`batch_clients` clients sending batch requests back to back until `stop`; `full` is
    set once as many batch requests have answered as the engine runs at once."""

    bench: Bench
    shape: str
    records: list[Record] = field(default_factory=list)
    failed: int = 0
    full: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def client(self, index: int) -> None:
        bench = self.bench
        rng = random.Random(f"{bench.options.seed}-{self.shape}-batch-{index}")
        worker = Worker(bench.context)
        try:
            while not self.stop.is_set():
                request = bench.requests.make("batch", batch_tokens(bench.options, rng))
                try:
                    record = await send(bench.target.batch, worker, request)
                except Exception as e:
                    self.failed += 1
                    print(f"mixed: a batch request failed: {e}", file=sys.stderr)
                    await worker.close()
                    continue
                self.records.append(record)
                if len(self.records) >= min(bench.options.batch_clients, bench.running_limit):
                    self.full.set()
        finally:
            await worker.close()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[BatchLoad]:
        clients = [
            asyncio.create_task(self.client(i)) for i in range(self.bench.options.batch_clients)
        ]
        try:
            yield self
        finally:
            self.stop.set()  # each batch client ends after its current request: its tokens count
            if sys.exc_info()[0] is not None:
                for task in clients:
                    task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)

    def tok_s(self, start: float, end: float) -> float:
        return sum(_tokens_within(r, start, end) for r in self.records) / (end - start)


def _ttft(record: Record) -> float | None:
    return None if record.first is None else record.first - record.sent


def _ttfts(records: list[Record]) -> list[float]:
    return [t for r in records if (t := _ttft(r)) is not None]


async def _preemptions(bench: Bench) -> int | None:
    """The engine's preemption count once it has drained (a preemption counts when the
    preempted request resumes); None if it does not drain or does not say."""
    context = bench.context
    counts = await drained(context.session, context.base_url, bench.options.drain_timeout_s)
    if counts is None:
        print(f"mixed: {bench.target.name}: the engine did not drain", file=sys.stderr)
    return None if counts is None else counts.preemptions


async def _shape(bench: Bench, shape: str) -> ShapeResult:
    before = await _preemptions(bench)
    chat: Chat = bench.chat
    async with BatchLoad(bench, shape).running() as load:
        await load.full.wait()  # each running slot has served a whole batch request
        start = perf_counter()
        chats = await SCHEDULES[shape](
            chat, bench.options, random.Random(f"{bench.options.seed}-{shape}")
        )
        end = perf_counter()
    after = await _preemptions(bench)
    took = perf_counter() - start
    print(f"mixed: {bench.target.name}, {shape}: {len(chats)} chats, {took:.1f} s", file=sys.stderr)
    series = [(round(r.sent - start, 3), round(t, 4)) for r in chats if (t := _ttft(r)) is not None]
    return ShapeResult.of(
        shape,
        series=series,
        chats=len(chats),
        batch_tok_s=load.tok_s(start, end),
        preemptions=None if before is None or after is None else after - before,
        interactive_failed=sum(1 for r in chats if r.first is None),
        batch_failed=load.failed,
    )


async def _measure(bench: Bench) -> TargetResult:
    options = bench.options
    idle = [await bench.chat(options.short_chat_tokens) for _ in range(options.idle_requests)]
    idle_burst = await burst(bench.chat, options) if "burst" in options.shapes else []
    shapes = [await _shape(bench, shape) for shape in options.shapes]
    return TargetResult.of(
        bench.target.name, idle=_ttfts(idle), idle_burst=_ttfts(idle_burst), shapes=shapes
    )


def _tokens_within(record: Record, start: float, end: float) -> float:
    """The tokens of a batch request that arrived between start and end (by its reads)."""
    if not record.arrivals or not record.tokens:
        return 0.0
    inside = sum(1 for t in record.arrivals if start <= t <= end)
    return record.tokens * inside / len(record.arrivals)


@asynccontextmanager
async def started_target(
    name: str, regime: str, options: MixedOptions, model: str, out: Path
) -> AsyncIterator[targets.Endpoint]:
    """The target `name` started for `regime` (its own server and engine), stopped after."""
    port = targets.free_port()
    command, env, served = target_command(name, regime, options, model, port)
    log = out / f"{name}-{regime}.log"
    async with targets.server(command, env, port, log, options.start_timeout, served) as endpoint:
        yield endpoint


def target_command(
    name: str, regime: str, options: MixedOptions, model: str, port: int
) -> tuple[list[str], dict[str, str], str]:
    """The command line, environment and served model name of target `name` in `regime`: in
    overload, its engine runs at most `overload_running` requests at once."""
    target = TARGETS[name]
    defaults = machine.cpu_defaults(options.dtype)
    settings = options.engine_settings(defaults.dtype)
    overload = regime == "overload"
    served = served_model_name(settings)
    if target.is_vllm:
        command = targets.vllm_server_command(settings, model, served, port, defaults.dtype)
        if overload:
            command += ["--max-num-seqs", str(options.overload_running)]
        env = dict(defaults.environment)
    else:
        command = targets.gateway_command(port)
        env = targets.gateway_environment(settings)
        env["SCHEDULING_POLICY"] = "fcfs" if name == "gateway-fcfs" else "priority"
        env["BULK_MAX_RUNNING"] = options.bulk_max_running
        env["INTERACTIVE_STEP_TOKENS"] = options.interactive_step_tokens
        if overload:
            env["MAX_RUNNING_REQUESTS"] = str(options.overload_running)
    return command, env, served


async def _run_target(
    name: str, regime: str, options: MixedOptions, endpoint: targets.Endpoint
) -> TargetResult:
    target = TARGETS[name]
    running_limit = options.overload_running if regime == "overload" else options.batch_clients
    timeout = aiohttp.ClientTimeout(total=None)
    connector = pooled_connector()
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        context = Context(session, endpoint.url, model=endpoint.model if target.is_vllm else "")
        return await _measure(
            Bench(target, context, options, Requests(options, name), running_limit)
        )


async def run_mixed(
    options: MixedOptions, command: str, start: StartTarget | None = None
) -> tuple[MixedReport, Path]:
    """Every regime's targets, each measured on the server `start(name, regime)` gives; by
    default `started_target`, a server and engine of its own set for the regime."""
    out = Path(options.out)
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    model = await asyncio.to_thread(targets.model_dir, options)
    targets.raise_file_limit(4 * options.batch_clients + 256)
    host = await asyncio.to_thread(machine.describe, options.dtype)
    regimes = []
    for regime in options.regimes:
        results = []
        for name in options.targets:
            running = (
                start(name, regime) if start else started_target(name, regime, options, model, out)
            )
            async with running as endpoint:
                results.append(await _run_target(name, regime, options, endpoint))
        regimes.append(RegimeResult(regime, results))
    report = MixedReport(command=command, machine=host, options=options, regimes=regimes)
    await asyncio.to_thread(write_report, report, out)
    return report, out


async def _run(options: MixedOptions, command: str) -> tuple[str, Path, bool]:
    report, out = await run_mixed(options, command)
    return markdown(report), out, True


SCENARIO = Scenario(
    "mixed",
    "A person's chats under a saturating batch load: vLLM's server, the gateway with FCFS and "
    "the gateway with priorities, per regime and chat shape.",
    MixedOptions,
    QUICK,
    _run,
    check=check,
)


def parse(argv: Sequence[str]) -> MixedOptions:
    return SCENARIO.parse(argv)
