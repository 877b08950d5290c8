"""`llm-gateway bench embeddings` (issue 45; docs/BENCHMARKS.md, "Embeddings"): the same texts
sent to OpenAI's embeddings route of the gateway, of vLLM's own server (`--runner pooling`,
with the gateway's engine settings for embeddings, then with vLLM's defaults) and of
infinity-emb, one server at a time, and encoded by sentence-transformers in process; then a
chat's TTFT on the gateway, idle and while embeddings saturate it."""

from __future__ import annotations

import asyncio
import itertools
import random
import shutil
import statistics
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from time import perf_counter

import aiohttp
import msgspec

from gateway.config.settings import DEFAULT_EMBEDDING_MODEL_NAME, Settings
from gateway_bench import clients, machine, targets
from gateway_bench.cpu import CpuMeter, CpuUse
from gateway_bench.machine import Machine
from gateway_bench.metrics import BenchError, percentile
from gateway_bench.options import Options, Positive, Scenario
from gateway_bench.report import Goal, Report, Section, Table, cell, ratio, write
from gateway_bench.worker import JSON_HEADERS, Worker, pooled_connector
from gateway_bench.workload import Request

GATEWAY, VLLM, VLLM_DEFAULTS = "gateway", "vllm-server", "vllm-server-defaults"
INFINITY, IN_PROCESS = "infinity-emb", "sentence-transformers"
TARGETS = (GATEWAY, VLLM, VLLM_DEFAULTS, INFINITY, IN_PROCESS)
NAME = DEFAULT_EMBEDDING_MODEL_NAME  # every server serves the model under this name
GOAL_AT = (32, 32)  # (concurrency, inputs per request): the throughput goals and the chats' load
TTFT_RATIO = 2.0
_POOL = 1024  # distinct texts, cycled: every target gets the same sequence
_FOREVER = 1e18
StartGateway = Callable[[], AbstractAsyncContextManager[targets.Endpoint]]


class EmbeddingsOptions(Options, frozen=True, kw_only=True):
    concurrency: list[Positive] = msgspec.field(default_factory=lambda: [1, 8, 32])
    inputs: list[Positive] = msgspec.field(default_factory=lambda: [1, 32])  # per request
    requests: Positive = 24  # per cell: max(requests, concurrency)
    cell_seconds: float = 40.0  # no request is sent after this: a slow target's cell is cut
    text_tokens: tuple[Positive, Positive] = (100, 200)  # special tokens included
    targets: list[str] = msgspec.field(default_factory=lambda: list(TARGETS))
    infinity_emb: str = "infinity_emb"
    batch_size: Positive = 32  # sentence-transformers'
    chats: Positive = 5  # chats one at a time, idle and then under embedding load


QUICK = EmbeddingsOptions(
    concurrency=[1, 8], requests=4, cell_seconds=10.0, chats=2, enforce_eager=True, quick=True
)


class Cell(msgspec.Struct):
    target: str
    concurrency: int
    inputs: int
    requests: int
    failed: int
    texts_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    frontend_ms_per_text: float | None  # the serving process's own CPU (cpu.py)
    other_cpu_pct: float | None
    first_error: str | None


class ChatTtft(msgspec.Struct):
    idle_ms: list[float]
    loaded_ms: list[float]
    load_texts_per_s: float  # what the saturating load got meanwhile


class EmbeddingsReport(msgspec.Struct, kw_only=True):
    command: str
    machine: Machine
    options: EmbeddingsOptions
    model_dir: str
    cells: list[Cell] = msgspec.field(default_factory=list)
    start_s: dict[str, float] = msgspec.field(default_factory=dict)  # each server's start-up
    chat: ChatTtft | None = None
    notes: list[str] = msgspec.field(default_factory=list)


class _Item(msgspec.Struct):
    index: int


class _Answer(msgspec.Struct):
    data: list[_Item]


_ANSWER = msgspec.json.Decoder(_Answer)


def texts(model_dir: str, span: tuple[int, int], seed: int) -> list[str]:
    """Seeded texts of `span` tokens: whole words the tokenizer holds as one token each."""
    vocabulary = targets.tokenizer(model_dir).get_vocab()
    words = sorted(w for w in vocabulary if w.isascii() and w.isalpha() and 3 <= len(w) <= 8)
    rng, special = random.Random(seed), 2  # [CLS] and [SEP]
    return [" ".join(rng.choices(words, k=rng.randint(*span) - special)) for _ in range(_POOL)]


def batch(pool: Sequence[str], index: int, inputs: int) -> list[str]:
    return [pool[(index * inputs + k) % len(pool)] for k in range(inputs)]


class _Load:
    """Clients sending requests of `inputs` texts back to back, and what they saw."""

    def __init__(self, pool: Sequence[str], session: aiohttp.ClientSession | None = None) -> None:
        self.pool, self.session, self.url = pool, session, ""
        self.latencies: list[float] = []
        self.failures: list[str] = []

    async def one(self, index: int, inputs: int) -> None:
        body = {"model": NAME, "input": batch(self.pool, index, inputs), "encoding_format": "float"}
        assert self.session is not None, "a load without a server"
        sent = perf_counter()
        try:
            data = msgspec.json.encode(body)
            async with self.session.post(self.url, data=data, headers=JSON_HEADERS) as r:
                raw = await r.read()
                if r.status != 200:
                    raise BenchError(f"HTTP {r.status}: {raw[:300].decode(errors='replace')}")
                if (got := len(_ANSWER.decode(raw).data)) != inputs:
                    raise BenchError(f"{got} vectors for {inputs} inputs")
        except (aiohttp.ClientError, TimeoutError, BenchError, msgspec.DecodeError) as e:
            self.failures.append(str(e) or type(e).__name__)
            return
        self.latencies.append(perf_counter() - sent)

    async def run(self, concurrency: int, inputs: int, count: int, deadline: float) -> None:
        numbers = itertools.count()

        async def client() -> None:
            while perf_counter() < deadline and (index := next(numbers)) < count:
                await self.one(index, inputs)

        await asyncio.gather(*(client() for _ in range(concurrency)))

    def cell(self, target: str, c: int, inputs: int, wall: float, cpu: CpuUse | None) -> Cell:
        done, n, times = len(self.latencies), len(self.failures), self.latencies
        rate, error = round(done * inputs / wall, 2), self.failures[0] if n else None
        frontend = None if cpu is None else cpu.per_token_ms(done * inputs)
        other, p50, p99 = cpu and cpu.other_pct, *(_ms(percentile(times, q)) for q in (50, 99))
        return Cell(target, c, inputs, done + n, n, rate, p50, p99, frontend, other, error)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


async def measure_server(
    target: str, at: targets.Endpoint, path: str, pool: Sequence[str], options: EmbeddingsOptions
) -> list[Cell]:
    """Every (inputs, concurrency) cell on a running server, after a warm-up that also waits
    for the route to answer (a gateway's embedding engine may be ready after its /health)."""
    timeout, cells = aiohttp.ClientTimeout(total=options.request_timeout), []
    async with aiohttp.ClientSession(timeout=timeout, connector=pooled_connector()) as session:
        warm, deadline = _Load(pool, session), perf_counter() + options.start_timeout
        warm.url = at.url + path
        while not warm.latencies and perf_counter() < deadline:
            await warm.run(2, max(options.inputs), 2, _FOREVER)
        for inputs, c in itertools.product(options.inputs, options.concurrency):
            load = _Load(pool, session)
            load.url = warm.url
            meter = await CpuMeter.start(() if at.pid is None else (at.pid,))
            began = perf_counter()
            await load.run(c, inputs, max(options.requests, c), began + options.cell_seconds)
            wall, cpu = perf_counter() - began, await meter.stop()
            # infinity-emb runs its model in its server process: no frontend's figure
            cells.append(load.cell(target, c, inputs, wall, None if target == INFINITY else cpu))
            targets.say(f"{target} c={c} inputs={inputs}: {cells[-1].texts_per_s} texts/s")
    return cells


async def _chats(worker: Worker, count: int) -> list[float]:
    requests = [Request(f"chat-{i}", "Name three colours.", 8, 0) for i in range(count)]
    return [
        round((await clients.send(clients.chat_completions, worker, r)).ttft_ms(), 1)
        for r in requests
    ]


async def chat_ttft(
    at: targets.Endpoint, pool: Sequence[str], options: EmbeddingsOptions
) -> ChatTtft:
    """Streamed chats one at a time, idle, then while GOAL_AT's embedding requests saturate."""
    timeout = aiohttp.ClientTimeout(total=options.request_timeout)
    async with aiohttp.ClientSession(timeout=timeout, connector=pooled_connector()) as session:
        worker = Worker(at.context(session, model=at.model))
        await _chats(worker, 1)  # warm-up
        idle, load = await _chats(worker, options.chats), _Load(pool, session)
        load.url, began = at.url + "/v1/embeddings", perf_counter()
        saturating = asyncio.create_task(load.run(*GOAL_AT, 1 << 62, _FOREVER))
        await asyncio.sleep(2.0)  # every client's first request is in the engine
        try:
            loaded = await _chats(worker, options.chats)
        finally:
            saturating.cancel()
            await asyncio.gather(saturating, return_exceptions=True)
        rate = len(load.latencies) * GOAL_AT[1] / (perf_counter() - began)
    return ChatTtft(idle, loaded, round(rate, 2))


def vllm_launch(model_dir: str, port: int, options: Options, own_defaults: bool) -> targets.Launch:
    """vLLM's server, `--runner pooling`, with the gateway's embedding engine settings
    (gateway/engine/pooling_engine.py) or, `own_defaults`, with vLLM's."""
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir]
    command += ["--runner", "pooling", "--served-model-name", NAME, "--seed", str(options.seed)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--uvicorn-log-level", "warning"]
    if own_defaults:
        return targets.Launch(command, {}, NAME)
    settings = Settings()
    defaults = machine.cpu_defaults(settings.embedding_dtype)
    command += ["--dtype", defaults.dtype, "--enforce-eager", "--scheduling-policy", "priority"]
    command += ["--max-num-batched-tokens", str(settings.embedding_max_num_batched_tokens)]
    command += ["--max-num-seqs", str(settings.embedding_max_num_seqs)]
    command += ["--kv-cache-memory-bytes", str(int(settings.embedding_kv_cache_gib * targets.GIB))]
    return targets.Launch(command, dict(defaults.environment), NAME)


def infinity_launch(program: str, model_dir: str, port: int) -> targets.Launch:
    command = [program, "v2", "--model-id", model_dir, "--served-model-name", NAME]
    command += ["--engine", "torch", "--device", "cpu", "--no-vector-disk-cache"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    return targets.Launch(command, {}, NAME)


async def sentence_transformers(
    model_dir: str, pool: Sequence[str], options: EmbeddingsOptions
) -> list[Cell]:
    """sentence-transformers in this process, one caller, `batch_size` texts a batch."""
    from sentence_transformers import SentenceTransformer

    model = await asyncio.to_thread(SentenceTransformer, model_dir, device="cpu")

    def encode(index: int, inputs: int) -> None:
        model.encode(batch(pool, index, inputs), batch_size=options.batch_size)

    await asyncio.to_thread(encode, 0, options.batch_size)  # warm-up
    cells = []
    for inputs in options.inputs:
        timings, meter, began = _Load(pool), await CpuMeter.start(()), perf_counter()
        for index in range(options.requests):
            if perf_counter() > began + options.cell_seconds:
                break
            sent = perf_counter()
            await asyncio.to_thread(encode, index, inputs)
            timings.latencies.append(perf_counter() - sent)
        wall, cpu = perf_counter() - began, await meter.stop()
        cells.append(timings.cell(IN_PROCESS, 1, inputs, wall, cpu))
        cells[-1].frontend_ms_per_text = None  # the model runs in it too: no frontend's figure
    return cells


def default_model_dir() -> str:
    from gateway.engine.pooling_engine import default_embedding_model

    return str(default_embedding_model())


def _server(
    target: str, result: EmbeddingsReport, out: Path, start: StartGateway | None
) -> tuple[AbstractAsyncContextManager[targets.Endpoint], str] | None:
    """The target's server and its embeddings route; None: skipped (a note says why)."""
    options, model_dir = result.options, result.model_dir
    if target == GATEWAY:
        env = {"EMBEDDING_MODEL": "default"}
        return (
            start() if start else targets.started_gateway(options, out, env=env)
        ), "/v1/embeddings"
    if target == INFINITY:
        if (program := shutil.which(options.infinity_emb)) is None:
            result.notes.append(f"{INFINITY}: skipped, `{options.infinity_emb}` not found")
            return None
        launch = lambda port: infinity_launch(program, model_dir, port)  # noqa: E731
        return targets.started(options, out, target, launch), "/embeddings"
    launch = lambda port: vllm_launch(model_dir, port, options, target == VLLM_DEFAULTS)  # noqa: E731
    return targets.started(options, out, target, launch), "/v1/embeddings"


async def _measure(
    target: str,
    result: EmbeddingsReport,
    pool: Sequence[str],
    out: Path,
    start: StartGateway | None,
) -> None:
    """One target's cells (and the gateway's chat TTFT) into `result`; its server stopped."""
    if target == IN_PROCESS:
        result.cells += await sentence_transformers(result.model_dir, pool, result.options)
        return
    if (server := _server(target, result, out, start)) is None:
        return
    async with server[0] as endpoint:
        if endpoint.start_s is not None:
            result.start_s[target] = endpoint.start_s
        result.cells += await measure_server(target, endpoint, server[1], pool, result.options)
        if target == GATEWAY:
            result.chat = await chat_ttft(endpoint, pool, result.options)


async def run_embeddings(
    options: EmbeddingsOptions, command: str, start: StartGateway | None = None
) -> tuple[EmbeddingsReport, Path]:
    """Every target in turn, one server at a time; `start`: the gateway to measure (by default
    one started for the run, with EMBEDDING_MODEL=default)."""
    out = options.out_dir("embeddings-")
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    host = await asyncio.to_thread(machine.describe, options.dtype)
    model_dir = await asyncio.to_thread(default_model_dir)
    pool = await asyncio.to_thread(texts, model_dir, options.text_tokens, options.seed)
    result = EmbeddingsReport(command=command, machine=host, options=options, model_dir=model_dir)
    for target in (t for t in TARGETS if t in options.targets):
        try:
            await _measure(target, result, pool, out, start)
        except (RuntimeError, TimeoutError, BenchError, OSError) as e:
            result.notes.append(f"{target}: failed: {e}")
            targets.say(f"{target} failed: {e}")
    host.load_end = machine.load()
    await asyncio.to_thread(write, result, report(result), out)
    return result, out


def _rate(result: EmbeddingsReport, target: str, at: tuple[int, int] = GOAL_AT) -> float | None:
    rates = [
        c.texts_per_s for c in result.cells if (c.target, c.concurrency, c.inputs) == (target, *at)
    ]
    return rates[0] if rates else None


def _at_least(name: str, measured: float | None, reference: float | None) -> Goal:
    shown = f"{cell(measured)} / {cell(reference)} texts/s = {ratio(measured, reference)}x"
    return Goal(
        name, ">= 1.0x", shown, None if measured is None or not reference else measured >= reference
    )


def _median(values: Sequence[float] | None) -> float | None:
    return statistics.median(values) if values else None


def goals(result: EmbeddingsReport) -> list[Goal]:
    at, gateway, chat = f"c={GOAL_AT[0]} x {GOAL_AT[1]} inputs", _rate(result, GATEWAY), result.chat
    idle, loaded = _median(chat.idle_ms if chat else []), _median(chat.loaded_ms if chat else [])
    passed = None if loaded is None or not idle else loaded <= TTFT_RATIO * idle
    shown = f"p50 {cell(loaded)} / {cell(idle)} ms = {ratio(loaded, idle)}x"
    return [
        _at_least(f"gateway >= 1.0x {VLLM} (same settings), {at}", gateway, _rate(result, VLLM)),
        _at_least(f"gateway >= {INFINITY}'s texts/s, {at}", gateway, _rate(result, INFINITY)),
        Goal(
            f"chat TTFT under embedding load <= {TTFT_RATIO:g}x idle",
            f"<= {TTFT_RATIO:g}x",
            shown,
            passed,
        ),
    ]


COLUMNS = ["target", "concurrency", "inputs", "requests", "texts/s", f"x {VLLM}", "p50 ms"]
COLUMNS += ["p99 ms", "frontend CPU ms/text", "other CPU %", "failed"]


def _row(c: Cell, result: EmbeddingsReport) -> list[object]:
    versus = ratio(c.texts_per_s, _rate(result, VLLM, (c.concurrency, c.inputs)))
    head = [c.target, c.concurrency, c.inputs, c.requests, cell(c.texts_per_s), versus]
    frontend = cell(c.frontend_ms_per_text, 3)
    return [*head, cell(c.p50_ms), cell(c.p99_ms), frontend, cell(c.other_cpu_pct), c.failed]


def _chat_section(chat: ChatTtft) -> Section:
    rows: list[list[object]] = [
        [name, len(ms), cell(_median(ms)), cell(max(ms, default=None))]
        for name, ms in (("idle", chat.idle_ms), ("under embedding load", chat.loaded_ms))
    ]
    load = f"{GOAL_AT[0]} clients x {GOAL_AT[1]} inputs, {cell(chat.load_texts_per_s)} texts/s"
    text = [f"Streamed chats one at a time on the gateway; the load: {load} meanwhile."]
    columns = ["chats", "requests", "TTFT p50 ms", "TTFT max ms"]
    return Section("Chat TTFT under embedding load", text, Table(columns, rows))


def report(result: EmbeddingsReport) -> Report:
    options, host = result.options, result.machine
    starts = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in result.start_s.items())
    intro = [
        f"{host.summary} Load at the end {host.load_end} (a shared machine: see other CPU).",
        f"Model: {NAME} ({result.model_dir}); texts of {'-'.join(map(str, options.text_tokens))} "
        f"tokens, the same for every target; requests per cell: max({options.requests}, "
        f"concurrency), none sent after {options.cell_seconds:g} s. Start-up: {starts or '-'}. "
        f"Embedding dtype ({GATEWAY}, {VLLM}): {machine.cpu_defaults('auto').dtype}.",
    ]
    failed = [f"{c.target} c={c.concurrency} x {c.inputs}: {c.first_error}" for c in result.cells]
    notes = [f"- {n}" for n in [*result.notes, *failed] if not n.endswith(": None")]
    rows = [_row(c, result) for c in result.cells]
    sections = [Section("Texts per second and latency", notes, Table(COLUMNS, rows))]
    sections += [] if result.chat is None else [_chat_section(result.chat)]
    sections.append(Section("Goals", goals=goals(result)))
    return Report("Embeddings: texts per second and latency", result.command, host, sections, intro)


def markdown(result: EmbeddingsReport) -> str:
    return report(result).markdown()


def _check(options: EmbeddingsOptions) -> str | None:
    unknown = [t for t in options.targets if t not in TARGETS]
    return f"--targets: from {', '.join(TARGETS)}" if unknown else None


async def _run(options: EmbeddingsOptions, command: str) -> tuple[str, Path, bool]:
    result, out = await run_embeddings(options, command)
    return markdown(result), out, all(g.passed is not False for g in goals(result))


SCENARIO = Scenario(
    "embeddings",
    "Embeddings (issue 45): texts/s and latency of the gateway, vLLM's server, infinity-emb "
    "and sentence-transformers; a chat's TTFT under embedding load.",
    EmbeddingsOptions,
    QUICK,
    _run,
    help={"targets": f"from {', '.join(TARGETS)}", "infinity_emb": "skipped when absent"},
    check=_check,
)
parse = SCENARIO.parse  # this scenario's flags alone (the tests')
