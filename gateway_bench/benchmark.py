"""One benchmark run: every target in turn, then the report.

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
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING

import aiohttp
from tqdm import tqdm

from gateway.config.settings import EngineSettings, served_model_name
from gateway_bench import chart, goals, machine, report, targets
from gateway_bench.connections import connection_scale
from gateway_bench.continuation import continuation_bench
from gateway_bench.options import Options, Positive, Scenario
from gateway_bench.results import (
    BenchReport,
    ConnectionResult,
    ContinuationResult,
    CpuDefaults,
    EngineDescription,
    TargetResult,
    WorkloadDescription,
)
from gateway_bench.runner import (
    GATEWAY_CLIENTS,
    INPROCESS,
    INPROCESS_LOGPROBS,
    VLLM_SERVER,
    VLLM_SERVER_CHAT,
    VLLM_SERVER_DEFAULTS,
    VLLM_SERVER_LOGPROBS,
    Client,
    requests_per_step,
    sweep,
)
from gateway_bench.worker import Context, pooled_connector
from gateway_bench.workload import Workload
from protocols.names import Protocol

if TYPE_CHECKING:
    from gateway.engine.vllm_engine import VllmEngine

_FD_MARGIN = 1024
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


def _check(options: BenchOptions) -> str | None:
    unknown = sorted(set(options.protocols) - set(PROTOCOL_NAMES))
    if unknown:
        return f"unknown protocol(s) {','.join(unknown)}; known: {','.join(PROTOCOL_NAMES)}"
    if options.continuation and min(options.continuation_lengths) <= options.continuation_generated:
        return "continuation lengths must exceed the generated tokens"
    return None


def _failed(protocol: Client, error: BaseException) -> TargetResult:
    return TargetResult(
        name=protocol.name,
        label=protocol.label,
        kind=protocol.kind,
        tokens=protocol.tokens,
        notes=f"not measured: {type(error).__name__}: {error}",
        steps=[],
        logprobs=protocol.logprobs,
        compared_with=protocol.compared_with,
    )


class _Run:
    def __init__(
        self,
        options: BenchOptions,
        workload: Workload,
        session: aiohttp.ClientSession,
        defaults: CpuDefaults,
    ):
        self.options = options
        self.workload = workload
        self.session = session
        self.defaults = defaults
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
        if not self.options.progress:
            return
        tqdm.write(f"llm-gateway bench: {message}", file=sys.stderr)

    def warn(self, message: str) -> None:
        tqdm.write(f"llm-gateway bench: {message}", file=sys.stderr)

    async def measure(
        self, protocol: Client, context: Context, start_s: float | None = None
    ) -> None:
        o = self.options
        try:
            result = await sweep(
                protocol,
                context,
                self.workload,
                o.concurrency,
                rounds=o.rounds,
                minimum=o.min_requests,
                progress=self.bar,
                limit_s=o.request_timeout,
            )
        except Exception as e:
            result = _failed(protocol, e)
            self.warn(f"{protocol.label}: {e}")
        result.start_s = start_s
        self.targets.append(result)

    async def guarded(self, protocols: list[Client], work: Callable[[], Awaitable[None]]) -> None:
        """Run `work`; if it fails, report the targets it had not measured, with the error."""
        done = len(self.targets)
        try:
            await work()
        except Exception as e:
            measured = {t.name for t in self.targets[done:]}
            self.targets += [_failed(p, e) for p in protocols if p.name not in measured]
            self.warn(f"{', '.join(p.label for p in protocols)}: {e}")

    def resolved(self) -> EngineSettings:
        """The engine settings with the dtype the gateway would choose here."""
        return self.options.engine_settings(self.defaults.dtype)

    async def ceiling(self, engine: VllmEngine | None, model: str) -> None:
        """vLLM's AsyncLLM used directly: the shared engine's when given (the test suite's),
        else one built here with the gateway's CPU defaults and shut down afterwards."""
        if engine is not None:
            context = Context(self.session, llm=engine.llm)
            await self.measure(INPROCESS, context)
            await self.measure(INPROCESS_LOGPROBS, context)
            return
        from gateway_bench.ceiling import start_llm  # imports vLLM: only when this target runs

        self.say("starting vLLM in-process")
        began = perf_counter()
        llm = await start_llm(self.resolved(), model, self.defaults.environment)
        start_s = round(perf_counter() - began, 1)
        try:
            context = Context(self.session, llm=llm)
            await self.measure(INPROCESS, context, start_s)
            await self.measure(INPROCESS_LOGPROBS, context)
        finally:
            llm.shutdown()

    @asynccontextmanager
    async def _vllm(
        self, model: str, out: Path, *, defaults: bool = False
    ) -> AsyncIterator[targets.Endpoint]:
        """vLLM's server with the gateway's CPU defaults, or (`defaults`) with vLLM's own."""
        o = self.options
        name = served_model_name(o.engine_settings())
        if o.vllm_url:
            url = o.vllm_url.rstrip("/")
            yield targets.Endpoint(url, model=await targets.served_model(self.session, url))
            return
        dtype, port = None if defaults else self.defaults.dtype, targets.free_port()
        env = {} if defaults else self.defaults.environment
        command = targets.vllm_server_command(o.engine_settings(), model, name, port, dtype)
        log = out / ("vllm-server-defaults.log" if defaults else "vllm-server.log")
        async with targets.server(command, env, port, log, o.start_timeout, name) as endpoint:
            yield endpoint

    async def vllm_server(self, model: str, out: Path) -> None:
        async with self._vllm(model, out) as endpoint:
            pids = () if endpoint.pid is None else (endpoint.pid,)
            context = Context(self.session, endpoint.url, model=endpoint.model, pids=pids)
            await self.measure(VLLM_SERVER, context, endpoint.start_s)
            await self.measure(VLLM_SERVER_LOGPROBS, context)
            await self.measure(VLLM_SERVER_CHAT, context)

    async def vllm_server_defaults(self, model: str, out: Path) -> None:
        async with self._vllm(model, out, defaults=True) as endpoint:
            pids = () if endpoint.pid is None else (endpoint.pid,)
            context = Context(self.session, endpoint.url, model=endpoint.model, pids=pids)
            await self.measure(VLLM_SERVER_DEFAULTS, context, endpoint.start_s)

    @asynccontextmanager
    async def _gateway(
        self, provided: targets.Endpoint | None, out: Path
    ) -> AsyncIterator[targets.Endpoint]:
        o = self.options
        if provided is not None:
            yield provided
            return
        if o.gateway_url:
            yield targets.Endpoint(o.gateway_url.rstrip("/"), o.gateway_pid)
            return
        async with targets.started_gateway(o, out) as endpoint:  # it applies its CPU defaults
            yield endpoint

    async def gateway(self, provided: targets.Endpoint | None, out: Path) -> None:
        o = self.options
        async with self._gateway(provided, out) as endpoint:
            pids = () if endpoint.pid is None else (endpoint.pid,)
            context = Context(self.session, endpoint.url, pids=pids)
            if o.connections:
                self.say(f"{o.idle_connections} idle WebSockets, then {o.streams} streams")
                try:
                    self.connections = await connection_scale(
                        context,
                        self.workload,
                        pid=endpoint.pid,
                        idle=o.idle_connections,
                        streams=o.streams,
                        output_tokens=o.stream_tokens,
                        limit_s=o.request_timeout,
                    )
                except Exception as e:
                    self.warn(f"connection scale not measured: {type(e).__name__}: {e}")
            start_s = endpoint.start_s
            for protocol in (p for p in GATEWAY_CLIENTS if p.name in o.protocols):
                await self.measure(protocol, context, start_s)
                start_s = None  # the engine started once, for the first protocol
            if o.continuation:
                try:
                    self.continuation = await continuation_bench(
                        context,
                        self.workload,
                        lengths=o.continuation_lengths,
                        repetitions=o.continuation_repetitions,
                        generated=o.continuation_generated,
                        new_tokens=o.continuation_new_tokens,
                        limit_s=o.request_timeout,
                        progress=self.bar,
                    )
                except Exception as e:
                    self.warn(f"continuation not measured: {type(e).__name__}: {e}")


def _vllm_defaults(options: BenchOptions) -> bool:
    """Whether the run measures vLLM's server with its own defaults: only one it starts."""
    return options.vllm_server and options.vllm_server_defaults and not options.vllm_url


def _engine_description(options: BenchOptions) -> EngineDescription:
    settings = options.engine_settings()
    return EngineDescription(
        model=options.model or f"{served_model_name(settings)} (embedded)",
        max_model_len=settings.max_model_len,
        kv_cache_gib=settings.kv_cache_gib,
        enforce_eager=settings.enforce_eager,
        enable_prefix_caching=settings.enable_prefix_caching,
        dtype=settings.dtype,
    )


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
    host = await asyncio.to_thread(machine.describe, options.dtype)
    out = options.out_dir()
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    targets.raise_file_limit(options.idle_connections + options.streams + _FD_MARGIN)
    needs_model = (options.ceiling and engine is None) or (
        options.vllm_server and not options.vllm_url
    )
    needs_model = needs_model or (options.gateway and gateway is None and not options.gateway_url)
    needs_model = needs_model or engine is None  # the workload needs its tokenizer
    model = await asyncio.to_thread(targets.model_dir, options) if needs_model else ""
    tokenizer = (
        engine.tokenizer
        if engine is not None
        else await asyncio.to_thread(targets.tokenizer, model)
    )
    workload = Workload.from_tokenizer(
        tokenizer,
        seed=options.seed,
        prompt_tokens=options.prompt_tokens,
        output_tokens=options.output_tokens,
    )
    connector = pooled_connector()
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None)
    ) as session:
        run = _Run(options, workload, session, host.defaults)
        try:
            if options.ceiling:
                ceilings = [INPROCESS, INPROCESS_LOGPROBS]
                await run.guarded(ceilings, lambda: run.ceiling(engine, model))
            if options.vllm_server:
                servers = [VLLM_SERVER, VLLM_SERVER_LOGPROBS, VLLM_SERVER_CHAT]
                await run.guarded(servers, lambda: run.vllm_server(model, out))
            if _vllm_defaults(options):
                defaults = [VLLM_SERVER_DEFAULTS]
                await run.guarded(defaults, lambda: run.vllm_server_defaults(model, out))
            if options.gateway:
                chosen = [p for p in GATEWAY_CLIENTS if p.name in options.protocols]
                await run.guarded(chosen, lambda: run.gateway(gateway, out))
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
        chart.draw(result, out / report.CHART)
    except Exception as e:  # a report without its chart is still worth writing
        drawn = False
        tqdm.write(f"llm-gateway bench: no chart: {e}", file=sys.stderr)
    report.write(result, out, drawn)
    return result, out


async def _run(options: BenchOptions, command: str) -> tuple[str, Path, bool]:
    result, out = await run_benchmark(options, command=command)
    return report.markdown(result, chart=None), out, True


SCENARIO = Scenario(
    "sweep",
    "Load-test vLLM in-process, vLLM's OpenAI server and every streaming protocol of the "
    "gateway on the same engine settings (and vLLM's server once more with its own defaults), "
    "and write a report.",
    BenchOptions,
    QUICK,
    _run,
    HELP,
    _check,
)


def parse(argv: Sequence[str]) -> BenchOptions:
    return SCENARIO.parse(argv)
