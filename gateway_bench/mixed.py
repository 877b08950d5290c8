"""`llm-gateway bench --scenario mixed`: a person's chat under a saturating batch load.

For each regime (saturation: every batch client inside the engine; overload: twice as many
batch clients as the engine runs at once) and each target (vLLM's OpenAI server, the gateway
with FCFS, the gateway with priorities), one server is started and measured (or the server
a caller of `run_mixed` hands in):

1. idle: interactive requests one after another, alone: the idle TTFT;
2. load: `batch_clients` clients send batch requests back to back; once the engine is full,
   an interactive request starts every `chat_interval_s` (each on its own), and the batch
   tokens that arrive meanwhile give the batch tok/s.

Interactive requests are what a chat UI sends: WS `/generate` on the gateway, streamed
`/v1/chat/completions` on vLLM's server; batch requests are `/invocations` (jsonlines) on the
gateway and streamed `/v1/completions` on vLLM's server. Figures go to `report.json`,
`report.md` and `ttft.png` under `--out`; docs/BENCHMARKS.md explains them.
"""

from __future__ import annotations

import asyncio
import random
import shlex
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

import aiohttp
import msgspec

from gateway.config.settings import EngineSettings, served_model_name
from gateway_bench import machine, targets
from gateway_bench.clients import chat_completions, control_ws, invocations, vllm_completions
from gateway_bench.metrics import Record
from gateway_bench.mixed_report import MixedReport, RegimeResult, TargetResult, write_report
from gateway_bench.scenario_options import parse_options
from gateway_bench.worker import Context, Worker
from gateway_bench.workload import Request

Client = Callable[[Worker, Request], Awaitable[Record]]
# A target's server for a regime, ready to measure: (target name, regime) -> its endpoint.
StartTarget = Callable[[str, str], AbstractAsyncContextManager[targets.Endpoint]]
_WORDS = ("river", "stone", "light", "music", "garden", "winter", "market", "story", "harbor")


class MixedOptions(msgspec.Struct, kw_only=True):
    batch_clients: int = 64
    batch_tokens: int = 128
    chat_tokens: int = 64
    chat_interval_s: float = 0.5
    chat_requests: int = 40
    idle_requests: int = 8
    prompt_words: int = 64
    overload_running: int = 32  # the engine's running limit in the overload regime
    bulk_max_running: str = "auto"  # the priority gateway's BULK_MAX_RUNNING
    regimes: list[str] = msgspec.field(default_factory=lambda: ["saturation", "overload"])
    targets: list[str] = msgspec.field(
        default_factory=lambda: ["vllm-server", "gateway-fcfs", "gateway-priority"]
    )
    model: str = ""
    dtype: str = "auto"
    enforce_eager: bool = False
    start_timeout: float = 900.0
    seed: int = 0
    out: str = "docs/bench/mixed"


QUICK = {
    "batch_clients": 4,
    "batch_tokens": 16,
    "chat_tokens": 8,
    "chat_interval_s": 0.2,
    "chat_requests": 3,
    "idle_requests": 2,
    "prompt_words": 16,
    "overload_running": 2,
    "enforce_eager": True,
}


@dataclass(frozen=True)
class Target:
    name: str
    interactive: Client
    batch: Client
    is_vllm: bool


TARGETS = {
    "vllm-server": Target("vllm-server", chat_completions, vllm_completions, True),
    "gateway-fcfs": Target("gateway-fcfs", control_ws, invocations, False),
    "gateway-priority": Target("gateway-priority", control_ws, invocations, False),
}


def parse(argv: Sequence[str]) -> MixedOptions:
    options = parse_options("mixed", MixedOptions, QUICK, argv)
    unknown = set(options.targets) - set(TARGETS) | set(options.regimes) - {
        "saturation",
        "overload",
    }
    if unknown:
        raise SystemExit(f"unknown target or regime: {', '.join(sorted(unknown))}")
    return options


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


async def _interactive(target: Target, context: Context, request: Request) -> Record:
    worker = Worker(context)  # a person: a connection of their own
    try:
        return await target.interactive(worker, request)
    finally:
        await worker.close()


def _ttft(record: Record) -> float | None:
    return None if record.first is None else record.first - record.sent


async def _measure(
    target: Target, context: Context, options: MixedOptions, running_limit: int
) -> TargetResult:
    requests = Requests(options, target.name)
    idle: list[float] = []
    for _ in range(options.idle_requests):
        record = await _interactive(target, context, requests.make("chat", options.chat_tokens))
        if (ttft := _ttft(record)) is not None:
            idle.append(ttft)

    batch_records: list[Record] = []
    batch_failed = 0
    started = asyncio.Event()
    first_tokens = 0
    stop = asyncio.Event()
    full = min(options.batch_clients, running_limit)

    async def batch_client() -> None:
        nonlocal first_tokens, batch_failed
        worker = Worker(context)
        try:
            while not stop.is_set():
                request = requests.make("batch", options.batch_tokens)
                try:
                    record = await target.batch(worker, request)
                except Exception as e:
                    batch_failed += 1
                    print(f"mixed: a batch request failed: {e}", file=sys.stderr)
                    await worker.close()
                    continue
                batch_records.append(record)
                if not started.is_set():
                    first_tokens += 1
                    if first_tokens >= full:
                        started.set()
        finally:
            await worker.close()

    clients = [asyncio.create_task(batch_client()) for _ in range(options.batch_clients)]
    try:
        await started.wait()  # each running slot has served a whole batch request
        window_start = perf_counter()
        chats: list[asyncio.Task[Record]] = []
        for _ in range(options.chat_requests):
            request = requests.make("chat", options.chat_tokens)
            chats.append(asyncio.create_task(_interactive(target, context, request)))
            await asyncio.sleep(options.chat_interval_s)
        loaded = await asyncio.gather(*chats)
        window_end = perf_counter()
    finally:
        stop.set()  # each batch client ends after its current request: its tokens count
        if sys.exc_info()[0] is not None:
            for task in clients:
                task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
    series = [
        (round(r.sent - window_start, 3), round(t, 4))
        for r in loaded
        if (t := _ttft(r)) is not None
    ]
    tokens = sum(_tokens_within(r, window_start, window_end) for r in batch_records)
    return TargetResult.of(
        target.name,
        idle_ttft=idle,
        loaded_ttft=[t for _, t in series],
        series=series,
        batch_tok_s=tokens / (window_end - window_start),
        interactive_failed=sum(1 for r in loaded if r.first is None),
        batch_failed=batch_failed,
    )


def _tokens_within(record: Record, start: float, end: float) -> float:
    """The tokens of a batch request that arrived between start and end (by its reads)."""
    if not record.arrivals or not record.tokens:
        return 0.0
    inside = sum(1 for t in record.arrivals if start <= t <= end)
    return record.tokens * inside / len(record.arrivals)


def _engine(options: MixedOptions, dtype: str) -> EngineSettings:
    chosen = {"MODEL": options.model, "DTYPE": dtype, "ENFORCE_EAGER": options.enforce_eager}
    return msgspec.convert({**chosen, "SEED": options.seed}, EngineSettings)  # upper: its names


@asynccontextmanager
async def started_target(
    name: str, regime: str, options: MixedOptions, model: str, out: Path
) -> AsyncIterator[targets.Endpoint]:
    """The target `name` started for `regime` (its own server and engine), stopped after."""
    target = TARGETS[name]
    defaults = machine.cpu_defaults(options.dtype)
    settings = _engine(options, defaults.dtype)
    overload = regime == "overload"
    port = targets.free_port()
    log = out / f"{name}-{regime}.log"
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
        if overload:
            env["MAX_RUNNING_REQUESTS"] = str(options.overload_running)
    print(f"mixed: {name}, {regime}: starting on port {port}", file=sys.stderr)
    async with targets.server(command, env, port, log, options.start_timeout, served) as endpoint:
        yield endpoint


async def _run_target(
    name: str, regime: str, options: MixedOptions, endpoint: targets.Endpoint
) -> TargetResult:
    target = TARGETS[name]
    running_limit = options.overload_running if regime == "overload" else options.batch_clients
    timeout = aiohttp.ClientTimeout(total=None)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        context = Context(session, endpoint.url, model=endpoint.model if target.is_vllm else "")
        return await _measure(target, context, options, running_limit)


async def run_mixed(
    options: MixedOptions, command: str, start: StartTarget | None = None
) -> tuple[MixedReport, Path]:
    """Every regime's targets, each measured on the server `start(name, regime)` gives; by
    default `started_target`, a server and engine of its own set for the regime."""
    out = Path(options.out)
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    model = options.model or await asyncio.to_thread(default_model)
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


def default_model() -> str:
    from gateway.engine.default_model import prepare_default_model

    return str(prepare_default_model())


def main(argv: Sequence[str]) -> int:
    options = parse(argv)
    command = shlex.join(["llm-gateway", "bench", *argv])
    report, out = asyncio.run(run_mixed(options, command))
    from gateway_bench.mixed_report import markdown

    print(markdown(report))
    print(f"\nllm-gateway bench --scenario mixed: report written to {out}/", file=sys.stderr)
    return 0
