"""`llm-gateway bench replicas`: what engine replicas on Ray cost and buy (docs/BENCHMARKS.md,
"Engine replicas")."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from pathlib import Path
from typing import Literal

import msgspec

from gateway_bench import machine, targets
from gateway_bench.continuation import Turns, turns
from gateway_bench.machine import Machine
from gateway_bench.metrics import median
from gateway_bench.options import Options, Positive, Scenario, begin
from gateway_bench.report import Report, Section, Table, cell, write
from gateway_bench.runner import GATEWAY_CLIENTS, run_step
from gateway_bench.scrape import scrape
from gateway_bench.worker import Context, Worker, session
from gateway_bench.workload import Workload

RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
# `ray start --block` on SIGTERM first drains its node, for up to 30 s: the gateway is gone by
# then, and Ray's processes, ended with it (one process group), leave the drain waiting out
# its limit for an answer. 0: no drain, Ray's own immediate teardown.
RAY_START_ENV = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
_FROM_CACHE = 0.5  # share of a continuation's prompt found in the prefix cache: a hit
_PROMPT_COUNTS = ("gateway_prompt_tokens_total", "gateway_prompt_tokens_cached_total")


class ReplicaOptions(Options, frozen=True, kw_only=True):
    concurrency: Positive = 32
    rounds: Positive = 4
    repeats: Positive = 1  # throughput pairs (in-process, then one replica), one after the other
    prompt_tokens: int = 128
    output_tokens: int = 64
    history: int = 1536
    generated: int = 64
    new_tokens: int = 16
    repetitions: int = 8
    parts: list[Literal["throughput", "continuation"]] = msgspec.field(
        default_factory=lambda: ["throughput", "continuation"]
    )
    enforce_eager: bool = True  # the setting: replicas in eager mode
    ray_address: str = ""  # an existing cluster for the replicas; "" = one of its own per target
    out: str = "docs/bench/replicas"


QUICK = ReplicaOptions(
    concurrency=2,
    rounds=1,
    prompt_tokens=16,
    output_tokens=4,
    history=320,  # past two of the CPU backend's 128-token KV blocks: a hit finds some
    generated=8,
    new_tokens=2,
    repetitions=1,
    quick=True,
)


class Throughput(msgspec.Struct):
    target: str
    tok_s: float
    failed: int
    # where a ratio below 1 comes from: slower engine steps (ITL) or a later first token
    ttft_p50_ms: float | None = None
    itl_p50_ms: float | None = None
    frontend_cpu_ms_per_token: float | None = None  # the gateway process's own (cpu.py)


class Continuation(msgspec.Struct):
    routing: str
    continuation_ttft_ms: float | None
    fresh_ttft_ms: float | None
    from_cache: int  # continuations that found >= half their prompt in the prefix cache
    measured: int
    cached_share: float  # of all continuations' prompt tokens, found in the cache
    failed: int

    @property
    def ratio(self) -> float | None:
        c, f = self.continuation_ttft_ms, self.fresh_ttft_ms
        return None if c is None or not f else round(c / f, 3)


class ReplicaReport(msgspec.Struct, kw_only=True):
    command: str
    machine: Machine
    options: ReplicaOptions
    throughput: list[Throughput]
    continuation: list[Continuation]


def ray_start(port: int, temp: str, cpus: int) -> tuple[list[str], dict[str, str]]:
    """`ray start --head --block` on loopback (`temp`: its directory, a short path: Ray's socket
    paths have a limit), and its environment: the bench's clusters and the tests' one."""
    ray = Path(sys.executable).with_name("ray")
    args = [str(ray), "start", "--head", "--block", f"--port={port}", f"--temp-dir={temp}"]
    args += ["--node-ip-address=127.0.0.1", f"--num-cpus={cpus}", "--include-dashboard=false"]
    args += ["--disable-usage-stats"]
    return args, {**os.environ, **RAY_ENV, **RAY_START_ENV}


@asynccontextmanager
async def _ray_cluster(cpus: int, log: Path) -> AsyncIterator[str]:
    """`ray start --head --block` on loopback, in a process group of its own, ended after."""
    port = targets.free_port()
    temp = tempfile.mkdtemp(prefix="rb-", dir="/tmp")
    args, env = ray_start(port, temp, cpus)
    try:
        async with targets.process_group(args, env, log) as process:
            while not await _listening(port):
                if process.returncode is not None:
                    raise RuntimeError(f"ray start exited; see {log}")
                await asyncio.sleep(0.2)
            yield f"127.0.0.1:{port}"
    finally:
        await asyncio.to_thread(shutil.rmtree, temp, True)


@asynccontextmanager
async def _replicas_of_its_own(address: str, replicas: int) -> AsyncIterator[str]:
    """An existing cluster for one target: no replicas on it before (the target's gateway
    creates its own), its replicas removed after, as the end of a cluster of its own would
    remove them. Ray joined from this process (the first time only)."""
    await asyncio.to_thread(_replicas_absent, address, replicas)
    try:
        yield address
    finally:
        from gateway.engine.replicas import remove_replicas

        await asyncio.to_thread(remove_replicas, replicas)


def _replicas_absent(address: str, replicas: int) -> None:
    for name, value in RAY_ENV.items():  # as the gateways get them; read when Ray is imported
        os.environ.setdefault(name, value)
    import ray

    from gateway.engine.replicas import NAMESPACE, replica_names

    if not ray.is_initialized():  # as the gateway joins (gateway/engine/replicas.py)
        ray.init(
            address=address,
            namespace=NAMESPACE,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    cpus = ray.cluster_resources().get("CPU", 0)  # type: ignore[no-untyped-call]
    if cpus < replicas:
        raise RuntimeError(f"the Ray cluster at {address} has {cpus} CPUs, {replicas} wanted")
    running = []
    for name in replica_names(replicas):
        with suppress(ValueError):  # ValueError: no such actor
            ray.get_actor(name, namespace=NAMESPACE)
            running.append(name)
    if running:
        raise RuntimeError(
            f"{', '.join(running)} already run at {address}: a gateway would use them, not "
            "create the replicas its target asks for"
        )


async def _listening(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True


@asynccontextmanager
async def _gateway(
    name: str, options: ReplicaOptions, extra: dict[str, str], out: Path, running: str = ""
) -> AsyncIterator[Context]:
    """The target's gateway, started; or the one `running` at that URL (measured, not stopped)."""
    profiles = options.profiles(out / name)
    async with AsyncExitStack() as stack:
        client_session = await stack.enter_async_context(session())
        if running:
            targets.say(f"replicas: {name}: the gateway running at {running}")
            yield targets.Endpoint(running).context(client_session, profiles)
            return
        env, replicas = dict(extra), int(extra.get("ENGINE_REPLICAS", "0"))
        if replicas:
            if options.ray_address:
                cluster = _replicas_of_its_own(options.ray_address, replicas)
            else:
                cluster = _ray_cluster(max(replicas, 2), out / f"{name}-ray.log")
            env |= RAY_ENV | {"RAY_ADDRESS": await stack.enter_async_context(cluster)}
        dtype = machine.cpu_defaults(options.dtype).dtype
        started = targets.started_gateway(options, out, name, env, dtype)
        yield (await stack.enter_async_context(started)).context(client_session, profiles)


async def _throughput(
    name: str, options: ReplicaOptions, workload: Workload, out: Path, running: str = ""
) -> Throughput:
    extra = {"ENGINE_REPLICAS": "1"} if name == "one-replica" else {}
    async with _gateway(name, options, extra, out, running) as context:
        c, tokens, limit = options.concurrency, options.output_tokens, options.request_timeout
        ws = GATEWAY_CLIENTS[0]  # WS /ws
        await run_step(ws, context, workload.requests(name, "warm-up", c, tokens), c, limit_s=limit)
        requests = workload.requests(name, "measure", c * options.rounds, tokens)
        step = await run_step(ws, context, requests, c, limit_s=limit, profile="measure")
        f = step.figures(c)
        tok_s = round(f.tokens / step.wall_s, 1)
        return Throughput(
            name, tok_s, f.errors, f.ttft_p50_ms, f.itl_p50_ms, f.frontend_cpu_ms_per_token
        )


async def _continuation(
    routing: str, options: ReplicaOptions, workload: Workload, out: Path
) -> Continuation:
    extra = {"ENGINE_REPLICAS": "2", "REPLICA_ROUTING": routing}
    measured: list[Turns] = []
    from_cache, failed, prompted, cached_total = 0, 0, 0.0, 0.0
    async with _gateway(f"continuation-{routing}", options, extra, out) as context:

        @asynccontextmanager
        async def counted() -> AsyncIterator[None]:
            """The continuation's prompt tokens, and those found in the prefix cache."""
            nonlocal from_cache, prompted, cached_total
            before = await scrape(context.session, context.base_url)
            yield
            after = await scrape(context.session, context.base_url)
            total, cached = (after.get(n, 0.0) - before.get(n, 0.0) for n in _PROMPT_COUNTS)
            prompted, cached_total = prompted + total, cached_total + cached
            from_cache += cached >= _FROM_CACHE * total

        worker = Worker(context)
        lengths = (options.history, options.generated, options.new_tokens)
        try:
            for rep in range(options.repetitions):
                words = workload.words_for(
                    f"{routing}-{rep}", rep, options.history - options.generated
                )
                words = workload.salted(words, f"{workload.run}:{routing}:{rep}")
                ids = (
                    workload.request_id(routing, rep),
                    workload.request_id("fresh", routing, rep),
                    "",
                )
                try:
                    limit = options.request_timeout
                    measured.append(
                        await turns(worker, workload, words, ids, lengths, limit, counted)
                    )
                except Exception as e:
                    failed += 1
                    targets.say(f"replicas: a repetition failed: {e}")
        finally:
            await worker.close()
    return Continuation(
        routing=routing,
        continuation_ttft_ms=median([t.continued_ms for t in measured]),
        fresh_ttft_ms=median([t.fresh_ms for t in measured]),
        from_cache=from_cache,
        measured=len(measured),
        cached_share=round(cached_total / prompted, 3) if prompted else 0.0,
        failed=failed,
    )


def report_of(report: ReplicaReport) -> Report:
    sections = []
    if report.throughput:
        columns = ["target", "tok/s", "/ in-process (its pair)", "TTFT p50 ms", "ITL p50 ms"]
        table = Table([*columns, "failed", "frontend CPU ms/token"])
        ratios, base = [], None
        for t in report.throughput:
            if t.target == "in-process":
                base = t.tok_s
            ratio = t.tok_s / base if base else None
            if t.target != "in-process" and ratio is not None:
                ratios.append(ratio)
            shown = "-" if ratio is None else f"{ratio:.2f}x"
            latency = [cell(t.ttft_p50_ms), cell(t.itl_p50_ms)]
            table.rows.append(
                [t.target, t.tok_s, shown, *latency, t.failed, cell(t.frontend_cpu_ms_per_token, 3)]
            )
        text = []
        if len(ratios) > 1:
            ratios.sort()
            text.append(
                f"One replica / in-process, median of {len(ratios)} pairs: "
                f"**{statistics.median(ratios):.2f}x** (from {ratios[0]:.2f} to {ratios[-1]:.2f})"
            )
        sections += [Section(table=table), Section(text=text)]
    if report.continuation:
        columns = ["routing (2 replicas)", "continuation TTFT p50", "fresh TTFT p50"]
        columns += ["continuation / fresh", "continuations from cache"]
        table = Table([*columns, "cached share of their prompt tokens", "failed"])
        for c in report.continuation:
            ttft = [f"{c.continuation_ttft_ms} ms", f"{c.fresh_ttft_ms} ms", c.ratio]
            cached = [f"{c.from_cache}/{c.measured}", f"{c.cached_share:.1%}"]
            table.rows.append([c.routing, *ttft, *cached, c.failed])
        sections.append(Section(table=table))
    return Report("llm-gateway bench replicas", report.command, report.machine, sections)


async def run_replicas(
    options: ReplicaOptions, command: str, in_process_url: str = ""
) -> ReplicaReport:
    """The report of `options`' parts. `in_process_url`: a gateway with its engine in-process
    already running there (the tests' own server, on their settings), measured as the
    in-process target instead of one started; the targets with replicas are always started."""
    out, host = await begin(options)
    model = await asyncio.to_thread(targets.model_dir, options)
    options = msgspec.structs.replace(options, model=model)
    tokenizer = await asyncio.to_thread(targets.tokenizer, model)
    workload = Workload.from_tokenizer(
        tokenizer,
        seed=options.seed,
        prompt_tokens=(options.prompt_tokens, options.prompt_tokens),
        output_tokens=options.output_tokens,
    )
    throughput: list[Throughput] = []
    if "throughput" in options.parts:
        for _ in range(options.repeats):
            for name, url in (("in-process", in_process_url), ("one-replica", "")):
                throughput.append(await _throughput(name, options, workload, out, url))
    continuation = []
    if "continuation" in options.parts:
        for routing in ("affinity", "load"):
            continuation.append(await _continuation(routing, options, workload, out))
    report = ReplicaReport(
        command=command,
        machine=host,
        options=options,
        throughput=throughput,
        continuation=continuation,
    )
    await asyncio.to_thread(write, report, report_of(report), out)
    return report


async def _run(options: ReplicaOptions, command: str) -> tuple[str, Path, bool]:
    report = await run_replicas(options, command)
    return report_of(report).markdown(), Path(options.out), True


SCENARIO = Scenario(
    "replicas",
    "What engine replicas on Ray cost and buy: throughput in-process against one replica, "
    "continuation routed by key against by load.",
    ReplicaOptions,
    QUICK,
    _run,
)
