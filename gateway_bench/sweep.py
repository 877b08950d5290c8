"""`llm-gateway bench sweep`: every target in turn, then the report.

Order: the in-process ceiling, plain and then with logprobs=0 (its engine is shut down before
anything else starts), vLLM's OpenAI server (likewise plain, then with logprobs=0), vLLM's
server once more with vLLM's own defaults, then the gateway: connection scale first (memory
is read on a fresh process), the protocols in table order, and the continuation benchmark.
The ceiling and vLLM's server get the gateway's CPU defaults (machine.py); the gateway
applies them itself. A target that fails to start is reported with no figures; the run goes
on with the next.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any

import aiohttp
import msgspec
from tqdm import tqdm

from gateway.config.settings import served_model_name
from gateway_bench import chart, goals, machine, targets
from gateway_bench.connections import connection_scale
from gateway_bench.continuation import continuation_bench
from gateway_bench.options import Options, Positive, Scenario, begin
from gateway_bench.report import write
from gateway_bench.results import (
    BenchReport,
    ConnectionResult,
    ContinuationResult,
    EngineDescription,
    StepResult,
    TargetKind,
    TargetResult,
    WorkloadDescription,
)
from gateway_bench.runner import GATEWAY_CLIENTS, REFERENCES, Client, requests_per_step, run_step
from gateway_bench.sweep_report import CHART, sweep_report
from gateway_bench.worker import Context, session
from gateway_bench.workload import Workload
from protocols.names import Protocol

if TYPE_CHECKING:
    from gateway.engine.vllm_engine import VllmEngine

_FD_MARGIN = 1024
WARMUP_TOKENS = 8


# The gateway protocols the bench measures, by their protocols.names.Protocol value.
PROTOCOL_NAMES: tuple[Protocol, ...] = tuple(Protocol(c.name) for c in GATEWAY_CLIENTS)


class BenchOptions(Options, frozen=True, kw_only=True):
    # Workload
    concurrency: tuple[Positive, ...] = (1, 8, 32, 64)
    output_tokens: Positive = 64  # tokens generated per request
    prompt_tokens: tuple[Positive, Positive] = (128, 128)
    rounds: Positive = 2  # requests per step: max(rounds * concurrency, min_requests)
    min_requests: Positive = 8
    # Targets
    ceiling: bool = True
    vllm_server: bool = True
    vllm_server_defaults: bool = True  # vLLM's server once more, with vLLM's own defaults
    gateway: bool = True
    llama_cpp: bool = (
        False  # llama.cpp's llama-server on the shipped GGUF (built once: llama_cpp.py)
    )
    protocols: tuple[Protocol, ...] = PROTOCOL_NAMES
    gateway_url: str = ""  # measure this running gateway instead of starting one
    gateway_pid: int | None = None  # its process, for the memory figure
    vllm_url: str = ""  # measure this running vLLM server instead of starting one
    # Continuation
    continuation: bool = True
    continuation_lengths: tuple[Positive, ...] = (512, 1024, 1536)
    continuation_repetitions: Positive = 3
    continuation_generated: Positive = 16
    continuation_new_tokens: Positive = 4
    # Connection scale
    connections: bool = True
    idle_connections: Positive = 1000
    streams: Positive = 256
    stream_tokens: Positive = 16


QUICK = BenchOptions(
    concurrency=(1, 4),
    output_tokens=8,
    prompt_tokens=(32, 32),
    rounds=1,
    min_requests=2,
    continuation_lengths=(160, 288),
    continuation_repetitions=1,
    continuation_generated=8,
    continuation_new_tokens=2,
    idle_connections=16,
    streams=8,
    stream_tokens=4,
    enforce_eager=True,
    quick=True,
)
HELP = {
    "concurrency": "comma-separated sweep",
    "prompt_tokens": "prompt length N or range N-M",
    "rounds": "requests per step = rounds x concurrency",
    "min_requests": "at least this many requests per step",
    "protocols": "gateway protocols",
    "ceiling": "vLLM in-process",
    "vllm_server": "vLLM's OpenAI server (all three variants)",
    "vllm_server_defaults": "the variant of vLLM's server started with vLLM's own defaults",
    "gateway_url": "measure this running gateway (e.g. http://10.0.0.5:8000)",
    "gateway_pid": "the running gateway's pid, for memory per connection",
    "vllm_url": "measure this running vLLM OpenAI server",
    "continuation_lengths": "history tokens",
    "idle_connections": "idle WebSockets held at once",
    "streams": "concurrent short streams",
    "stream_tokens": "tokens per stream",
    "enforce_eager": "no torch.compile: engines start faster",
}


def check(options: BenchOptions) -> str | None:
    unknown = sorted(set(options.protocols) - set(PROTOCOL_NAMES))
    if unknown:
        return f"unknown protocol(s) {','.join(unknown)}; known: {','.join(PROTOCOL_NAMES)}"
    if options.continuation and min(options.continuation_lengths) <= options.continuation_generated:
        return "continuation lengths must exceed the generated tokens"
    return None


def _failed(protocol: Client, error: BaseException) -> TargetResult:
    return protocol.result([], f"not measured: {type(error).__name__}: {error}")


async def sweep(
    client: Client, context: Context, workload: Workload, o: BenchOptions, progress: tqdm[Any]
) -> TargetResult:
    """One target: a warm-up at the highest concurrency, then a step at each."""
    peak, limit_s = max(o.concurrency), o.request_timeout
    warmup = workload.requests(client.name, "warmup", peak, min(WARMUP_TOKENS, o.output_tokens))
    progress.set_postfix_str(f"{client.label}: warm-up")
    warm = await run_step(client, context, warmup, peak, limit_s=limit_s)
    steps: list[StepResult] = []
    for concurrency in o.concurrency:
        count = requests_per_step(concurrency, o.rounds, o.min_requests)
        requests = workload.requests(client.name, f"c{concurrency}", count)
        progress.set_postfix_str(f"{client.label}: concurrency {concurrency}")
        name = f"{client.name}-c{concurrency}"
        done = partial(progress.update, 1)
        step = await run_step(client, context, requests, concurrency, done, limit_s, name)
        steps.append(step.figures(concurrency, sum(r.max_new_tokens for r in requests)))
    return client.result(steps, warmup_errors=sum(1 for r in warm.records if r.error))


# A target group's server (or engine), ready: what its workers share and its start-up time.
Ready = tuple[Context, float | None]
Started = AbstractAsyncContextManager[Ready]


class _Run:
    def __init__(
        self, options: BenchOptions, workload: Workload, session: aiohttp.ClientSession, out: Path
    ):
        self.options, self.workload, self.session, self.out = options, workload, session, out
        self.defaults = machine.cpu_defaults(options.dtype)
        self.targets: list[TargetResult] = []
        self.continuation: ContinuationResult | None = None
        self.connections: ConnectionResult | None = None
        self.bar = tqdm(
            total=self._total(), unit="req", disable=not options.progress, dynamic_ncols=True
        )

    def _total(self) -> int:
        o = self.options
        per_target = sum(requests_per_step(c, o.rounds, o.min_requests) for c in o.concurrency)
        count = 2 * int(o.ceiling) + 2 * int(o.vllm_server) + int(_vllm_defaults(o))
        count += len(o.protocols) if o.gateway else 0
        extra = len(o.continuation_lengths) * o.continuation_repetitions
        return per_target * count + (extra if o.gateway and o.continuation else 0)

    def say(self, message: str) -> None:
        self.bar.set_postfix_str(message)
        if self.options.progress:
            targets.say(message)

    def context(self, endpoint: targets.Endpoint, model: str = "") -> Context:
        return endpoint.context(self.session, self.options.profiles(self.out), model)

    async def group(self, protocols: list[Client], started: Started, gateway: bool = False) -> None:
        """Each of `protocols` on the server `started` gives (the first with its start-up
        time); on the `gateway`, connection scale before them (memory read on a fresh process)
        and the continuation benchmark after. If the server fails, the targets not measured
        are reported with the error."""
        done = len(self.targets)
        try:
            async with started as (context, start_s):
                if gateway and self.options.connections:
                    await self.scale(context)
                for protocol in protocols:
                    try:
                        o, bar = self.options, self.bar
                        result = await sweep(protocol, context, self.workload, o, bar)
                    except Exception as e:
                        result = _failed(protocol, e)
                        targets.say(f"{protocol.label}: {e}")
                    result.start_s, start_s = start_s, None  # the engine started once
                    self.targets.append(result)
                if gateway and self.options.continuation:
                    await self.continue_histories(context)
        except Exception as e:
            measured = {t.name for t in self.targets[done:]}
            self.targets += [_failed(p, e) for p in protocols if p.name not in measured]
            targets.say(f"{', '.join(p.label for p in protocols)}: {e}")

    @asynccontextmanager
    async def ceiling(self, engine: VllmEngine | None, model: str) -> AsyncIterator[Ready]:
        """vLLM's AsyncLLM used directly: the shared engine's when given (the test suite's),
        else one built here with the gateway's CPU defaults and shut down afterwards."""
        profiles = self.options.profiles(self.out)  # the bench's own process: the frontend
        if engine is not None:
            yield Context(self.session, llm=engine.llm, profiles=profiles), None
            return
        from gateway_bench.ceiling import start_llm  # imports vLLM: only when this target runs

        self.say("starting vLLM in-process")
        began = perf_counter()
        settings = self.options.engine_settings(self.defaults.dtype)
        llm = await start_llm(settings, model, self.defaults.environment)
        start_s = round(perf_counter() - began, 1)
        try:
            yield Context(self.session, llm=llm, profiles=profiles), start_s
        finally:
            llm.shutdown()

    @asynccontextmanager
    async def vllm(self, model: str, own_defaults: bool = False) -> AsyncIterator[Ready]:
        """vLLM's server with the gateway's CPU defaults, or (`own_defaults`) with vLLM's own."""
        o = self.options
        if o.vllm_url:
            url = o.vllm_url.rstrip("/")
            served = await targets.served_model(self.session, url)
            yield self.context(targets.Endpoint(url), served), None
            return
        name = "vllm-server-defaults" if own_defaults else "vllm-server"
        launch = partial(targets.vllm_launch, o, model, own_defaults=own_defaults)
        async with targets.started(o, self.out, name, launch) as endpoint:
            yield self.context(endpoint, endpoint.model), endpoint.start_s

    @asynccontextmanager
    async def llama_cpp(self) -> AsyncIterator[Ready]:
        """llama.cpp's llama-server on the shipped GGUF, built into the cache the first time."""
        from gateway.config.cache import default_cache_dir
        from gateway_bench import llama_cpp

        cache = default_cache_dir() / "llama-cpp"
        await asyncio.to_thread(cache.mkdir, parents=True, exist_ok=True)
        binary = await asyncio.to_thread(llama_cpp.built_server, cache, self.say)
        gguf = await asyncio.to_thread(llama_cpp.shipped_gguf)
        launch = partial(llama_cpp.llama_launch, binary, gguf)
        # llama-server closes kept-alive connections by its HTTP library's own limits, and a
        # request written into one it has closed fails ("Can not write request body": half of
        # them at one caller, 2026-12-03): each request on a connection of its own.
        async with (
            session(fresh_connections=True) as fresh,
            targets.started(self.options, self.out, "llama-cpp", launch) as endpoint,
        ):
            context = endpoint.context(fresh, self.options.profiles(self.out), endpoint.model)
            yield context, endpoint.start_s

    @asynccontextmanager
    async def gateway(self, provided: targets.Endpoint | None) -> AsyncIterator[Ready]:
        o = self.options
        if provided is not None or o.gateway_url:
            endpoint = provided or targets.Endpoint(o.gateway_url.rstrip("/"), o.gateway_pid)
            yield self.context(endpoint), None
            return
        async with targets.started_gateway(o, self.out) as endpoint:  # its own CPU defaults
            yield self.context(endpoint), endpoint.start_s

    async def scale(self, context: Context) -> None:
        o = self.options
        self.say(f"{o.idle_connections} idle WebSockets, then {o.streams} streams")
        try:
            pid = context.pids[0] if context.pids else None
            counts = (o.idle_connections, o.streams, o.stream_tokens)
            scale = connection_scale(context, self.workload, pid, counts, o.request_timeout)
            self.connections = await scale
        except Exception as e:
            targets.say(f"connection scale not measured: {type(e).__name__}: {e}")

    async def continue_histories(self, context: Context) -> None:
        o = self.options
        try:
            self.continuation = await continuation_bench(
                context,
                self.workload,
                o.continuation_lengths,
                o.continuation_repetitions,
                (o.continuation_generated, o.continuation_new_tokens),
                o.request_timeout,
                self.bar,
            )
        except Exception as e:
            targets.say(f"continuation not measured: {type(e).__name__}: {e}")


def _of(*kinds: TargetKind) -> list[Client]:
    return [REFERENCES[kind] for kind in kinds]


def _vllm_defaults(options: BenchOptions) -> bool:
    """Whether the run measures vLLM's server with its own defaults: only one it starts."""
    return options.vllm_server and options.vllm_server_defaults and not options.vllm_url


def _engine_description(options: BenchOptions) -> EngineDescription:
    settings = msgspec.structs.asdict(options.engine_settings())
    chosen = {name: settings[name] for name in EngineDescription.__struct_fields__}
    model = options.model or f"{served_model_name(options.engine_settings())} (embedded)"
    return EngineDescription(**{**chosen, "model": model})


def _workload_description(options: BenchOptions, workload: Workload) -> WorkloadDescription:
    return WorkloadDescription(
        seed=options.seed,
        prompt_tokens_min=options.prompt_tokens[0],
        prompt_tokens_max=options.prompt_tokens[1],
        output_tokens=options.output_tokens,
        concurrency=list(options.concurrency),
        requests_per_step={
            str(c): requests_per_step(c, options.rounds, options.min_requests)
            for c in options.concurrency
        },
        exact_prompt_lengths=workload.exact,
    )


async def run_benchmark(
    options: BenchOptions,
    *,
    engine: VllmEngine | None = None,
    gateway: targets.Endpoint | None = None,
    command: str = "",
) -> tuple[BenchReport, Path]:
    """Measure every target `options` asks for and write the report; returns it and its
    directory. `engine` (its vLLM `AsyncLLM`, `engine.llm`, is the in-process target) and
    `gateway` are used as they are when given (the test suite's), instead of starting them."""
    began, started_at = perf_counter(), datetime.now(UTC).isoformat(timespec="seconds")
    out, host = await begin(options, options.idle_connections + options.streams + _FD_MARGIN)
    # The model directory: for the servers the bench starts, and for the workload's tokenizer.
    needs_model = engine is None or (options.vllm_server and not options.vllm_url)
    needs_model = needs_model or (options.gateway and gateway is None and not options.gateway_url)
    model = await asyncio.to_thread(targets.model_dir, options) if needs_model else ""
    tokenizer = engine.tokenizer if engine else await asyncio.to_thread(targets.tokenizer, model)
    workload = Workload.from_tokenizer(
        tokenizer,
        seed=options.seed,
        prompt_tokens=options.prompt_tokens,
        output_tokens=options.output_tokens,
    )
    async with session() as client_session:
        run = _Run(options, workload, client_session, out)
        try:
            if options.ceiling:
                await run.group(_of("ceiling", "ceiling-logprobs"), run.ceiling(engine, model))
            if options.vllm_server:
                servers = _of("vllm-server", "vllm-server-logprobs", "vllm-server-chat")
                await run.group(servers, run.vllm(model))
            if _vllm_defaults(options):
                await run.group(_of("vllm-server-defaults"), run.vllm(model, own_defaults=True))
            if options.llama_cpp:
                await run.group(_of("llama-cpp"), run.llama_cpp())
            if options.gateway:
                chosen = [p for p in GATEWAY_CLIENTS if p.name in options.protocols]
                await run.group(chosen, run.gateway(gateway), gateway=True)
        finally:
            run.bar.close()
    host.load_end = machine.load()
    result = BenchReport(
        command=command or "llm-gateway bench sweep",
        started_at=started_at,
        duration_s=round(perf_counter() - began, 1),
        quick=options.quick,
        machine=host,
        engine=_engine_description(options),
        workload=_workload_description(options, workload),
        targets=run.targets,
        continuation=run.continuation,
        connections=run.connections,
        goals=goals.evaluate(run.targets, run.continuation, run.connections, options.output_tokens),
    )
    drawn = True
    try:
        chart.draw(result, out / CHART)
    except Exception as e:  # a report without its chart is still worth writing
        drawn = False
        targets.say(f"no chart: {e}")
    write(result, sweep_report(result, CHART if drawn else None), out)
    return result, out


async def _run(options: BenchOptions, command: str) -> tuple[str, Path, bool]:
    result, out = await run_benchmark(options, command=command)
    return sweep_report(result, chart=None).markdown(), out, True


SCENARIO = Scenario(
    "sweep",
    "Load-test vLLM in-process, vLLM's OpenAI server and every streaming protocol of the "
    "gateway on the same engine settings (and vLLM's server once more with its own defaults), "
    "and write a report.",
    BenchOptions,
    QUICK,
    _run,
    HELP,
    check,
)
