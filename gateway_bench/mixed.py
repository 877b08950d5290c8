"""`llm-gateway bench mixed`: a person's chats under a saturating batch load (docs/BENCHMARKS.md,
"Mixed").

A shape (when each chat starts, under the batch load) gets `chat(max_tokens)`, which sends one
chat request on a connection of its own and returns its record, and gives back every chat's
record once all have answered. Randomness is seeded by the shape alone, so every target sees
the same schedule.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from time import perf_counter
from typing import Any

from gateway_bench import machine, targets
from gateway_bench.clients import Call, chat_completions, completions, control_ws, invocations, send
from gateway_bench.metrics import Record, ms_at
from gateway_bench.mixed_report import (
    QUICK,
    MixedOptions,
    MixedReport,
    RegimeResult,
    ShapeResult,
    TargetResult,
    mixed_report,
    ratio_of,
    write_report,
)
from gateway_bench.options import Scenario, begin
from gateway_bench.runner import Client, Step, run_step
from gateway_bench.scrape import drained
from gateway_bench.worker import Context, Worker, session
from gateway_bench.workload import Request

# A target's server for a regime, ready to measure: (target name, regime) -> its endpoint.
StartTarget = Callable[[str, str], AbstractAsyncContextManager[targets.Endpoint]]
_WORDS = ("river", "stone", "light", "music", "garden", "winter", "market", "story", "harbor")


Chat = Callable[[int], Coroutine[Any, Any, Record]]
Shape = Callable[[Chat, MixedOptions, random.Random], Awaitable[list[Record]]]


async def steady(chat: Chat, options: MixedOptions, rng: random.Random) -> list[Record]:
    """A long chat every `chat_interval_s`, whether the previous one has answered or not."""
    chats: list[asyncio.Task[Record]] = []
    for _ in range(options.chat_requests):
        chats.append(asyncio.create_task(chat(options.chat_tokens)))
        await asyncio.sleep(options.chat_interval_s)
    return list(await asyncio.gather(*chats))


def sporadic_gap(options: MixedOptions, rng: random.Random) -> float:
    return max(options.sporadic_gap_min_s, rng.expovariate(1 / options.sporadic_gap_mean_s))


async def sporadic(chat: Chat, options: MixedOptions, rng: random.Random) -> list[Record]:
    """Short chats one at a time: each starts a random gap after the previous one ended, so
    the engine runs bulk alone in between."""
    records = []
    for n in range(options.sporadic_chats):
        if n:
            await asyncio.sleep(sporadic_gap(options, rng))
        records.append(await chat(options.short_chat_tokens))
    return records


async def burst(chat: Chat, options: MixedOptions) -> list[Record]:
    """`burst_size` short chats at once."""
    sent = [chat(options.short_chat_tokens) for _ in range(options.burst_size)]
    return list(await asyncio.gather(*sent))


async def bursts(chat: Chat, options: MixedOptions, rng: random.Random) -> list[Record]:
    """`bursts` bursts, each `burst_gap_s` after the previous one has answered."""
    records: list[Record] = []
    for n in range(options.bursts):
        if n:
            await asyncio.sleep(options.burst_gap_s)
        records += await burst(chat, options)
    return records


SCHEDULES: dict[str, Shape] = {"steady": steady, "sporadic": sporadic, "burst": bursts}


def planned_chats(shape: str, options: MixedOptions) -> int:
    """How many chats `shape` sends."""
    return {
        "steady": options.chat_requests,
        "sporadic": options.sporadic_chats,
        "burst": options.bursts * options.burst_size,
    }[shape]


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


class Requests:
    """Fresh prompts (no two alike: the prefix cache helps no target)."""

    def __init__(self, options: MixedOptions, target: str) -> None:
        self._rng = random.Random(f"{options.seed}-{target}")
        self._options = options
        self._n = 0

    def make(self, kind: str, tokens: int) -> Request:
        self._n += 1
        words = " ".join(self._rng.choice(_WORDS) for _ in range(self._options.prompt_words))
        prompt = f"{kind} {self._n}: {words}"
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
    """`batch_clients` clients sending batch requests back to back (one runner step) until
    `stop`; `full` is set once as many batch requests have answered as the engine runs at
    once."""

    bench: Bench
    shape: str
    answered: int = 0
    full: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def answer(self) -> None:
        self.answered += 1
        if self.answered >= min(self.bench.options.batch_clients, self.bench.running_limit):
            self.full.set()

    def requests(self) -> Iterator[Request]:
        rng = random.Random(f"{self.bench.options.seed}-{self.shape}-batch")
        while not self.stop.is_set():
            yield self.bench.requests.make("batch", batch_tokens(self.bench.options, rng))

    @asynccontextmanager
    async def running(self) -> AsyncIterator[asyncio.Task[Step]]:
        b = self.bench
        client = Client("batch", "batch", b.target.batch, "gateway", "reported")
        step = run_step(
            client,
            b.context,
            self.requests(),
            b.options.batch_clients,
            self.answer,
            b.options.request_timeout,
        )
        task = asyncio.create_task(step)
        try:
            yield task
        finally:
            self.stop.set()  # each batch client ends after its current request: its tokens count
            await asyncio.wait({task})


def _ttfts(records: list[Record]) -> list[float]:
    return [t for r in records if (t := r.ttft_s) is not None]


def _tokens_within(record: Record, start: float, end: float) -> float:
    """The tokens of a batch request that arrived between start and end (by its reads)."""
    if not record.arrivals or not record.tokens:
        return 0.0
    inside = sum(1 for t in record.arrivals if start <= t <= end)
    return record.tokens * inside / len(record.arrivals)


async def _preemptions(bench: Bench) -> int | None:
    """The engine's preemption count once it has drained (a preemption counts when the
    preempted request resumes); None if it does not drain or does not say."""
    context = bench.context
    counts = await drained(context.session, context.base_url, bench.options.drain_timeout_s)
    if counts is None:
        targets.say(f"mixed: {bench.target.name}: the engine did not drain")
    return None if counts is None else counts.preemptions


async def _shape(bench: Bench, shape: str) -> ShapeResult:
    before = await _preemptions(bench)
    load = BatchLoad(bench, shape)
    async with load.running() as batch:
        full = asyncio.create_task(load.full.wait())
        await asyncio.wait({batch, full}, return_when=asyncio.FIRST_COMPLETED)
        full.cancel()
        start = perf_counter()  # each running slot has served a whole batch request
        chats = await SCHEDULES[shape](
            bench.chat, bench.options, random.Random(f"{bench.options.seed}-{shape}")
        )
        end = perf_counter()
    step = batch.result()
    after = await _preemptions(bench)
    targets.say(f"mixed: {bench.target.name}, {shape}: {len(chats)} chats, {end - start:.1f} s")
    series = [(round(r.sent - start, 3), round(t, 4)) for r in chats if (t := r.ttft_s) is not None]
    failed = [r.error for r in step.records if r.error is not None]
    if failed:
        targets.say(f"mixed: {len(failed)} batch requests failed, the first: {failed[0]}")
    tokens = sum(r.tokens for r in [*step.records, *chats])
    preemptions = None if before is None or after is None else after - before
    ttft = [t for _, t in series]
    batch_tokens = sum(_tokens_within(r, start, end) for r in step.records)
    return ShapeResult(
        shape=shape,
        chats=len(chats),
        ttft_p50_ms=ms_at(ttft, 50),
        ttft_p99_ms=ms_at(ttft, 99),
        batch_tok_s=round(batch_tokens / (end - start), 1),
        preemptions=preemptions,
        preemptions_per_chat=ratio_of(preemptions, len(chats)),
        interactive_failed=sum(1 for r in chats if r.first is None),
        batch_failed=len(failed),
        series=series,
        frontend_cpu_ms_per_token=step.cpu.per_token_ms(tokens),
    )


async def _measure(bench: Bench) -> TargetResult:
    options = bench.options
    idle = [await bench.chat(options.short_chat_tokens) for _ in range(options.idle_requests)]
    idle_burst = await burst(bench.chat, options) if "burst" in options.shapes else []
    shapes = [await _shape(bench, shape) for shape in options.shapes]
    idle_ttft, burst_ttft = ms_at(_ttfts(idle), 50), ms_at(_ttfts(idle_burst), 50)
    return TargetResult(
        target=bench.target.name,
        idle_ttft_p50_ms=idle_ttft,
        idle_burst_p50_ms=burst_ttft,
        shapes=shapes,
    )


def launch(name: str, regime: str, options: MixedOptions, model: str, port: int) -> targets.Launch:
    """Target `name`'s server in `regime`: in overload, its engine runs at most
    `overload_running` requests at once."""
    overload = regime == "overload"
    if TARGETS[name].is_vllm:
        args = ["--max-num-seqs", str(options.overload_running)] if overload else []
        return targets.vllm_launch(options, model, port, args=args)
    env = {"SCHEDULING_POLICY": "fcfs" if name == "gateway-fcfs" else "priority"}
    env["BULK_MAX_RUNNING"] = options.bulk_max_running
    env["INTERACTIVE_STEP_TOKENS"] = options.interactive_step_tokens
    if overload:
        env["MAX_RUNNING_REQUESTS"] = str(options.overload_running)
    return targets.gateway_launch(options, port, env, machine.cpu_defaults(options.dtype).dtype)


async def _run_target(
    name: str, regime: str, options: MixedOptions, endpoint: targets.Endpoint, out: Path
) -> TargetResult:
    target = TARGETS[name]
    running_limit = options.overload_running if regime == "overload" else options.batch_clients
    async with session() as client_session:
        model = endpoint.model if target.is_vllm else ""
        profiles = options.profiles(out / f"{name}-{regime}")
        context = endpoint.context(client_session, profiles, model)
        return await _measure(
            Bench(target, context, options, Requests(options, name), running_limit)
        )


async def run_mixed(
    options: MixedOptions, command: str, start: StartTarget | None = None
) -> tuple[MixedReport, Path]:
    """Every regime's targets, each measured on the server `start(name, regime)` gives; by
    default one started for it (`launch`), a server and engine of its own."""
    out, host = await begin(options, 4 * options.batch_clients + 256)
    model = await asyncio.to_thread(targets.model_dir, options)
    regimes = []
    for regime in options.regimes:
        results = []
        for name in options.targets:
            own = partial(launch, name, regime, options, model)
            running = (
                start(name, regime)
                if start
                else targets.started(options, out, f"{name}-{regime}", own)
            )
            async with running as endpoint:
                results.append(await _run_target(name, regime, options, endpoint, out))
        regimes.append(RegimeResult(regime, results))
    report = MixedReport(command=command, machine=host, options=options, regimes=regimes)
    await asyncio.to_thread(write_report, report, out)
    return report, out


async def _run(options: MixedOptions, command: str) -> tuple[str, Path, bool]:
    report, out = await run_mixed(options, command)
    return mixed_report(report).markdown(), out, True


SCENARIO = Scenario(
    "mixed",
    "A person's chats under a saturating batch load: vLLM's server, the gateway with FCFS and "
    "the gateway with priorities, per regime and chat shape.",
    MixedOptions,
    QUICK,
    _run,
)
