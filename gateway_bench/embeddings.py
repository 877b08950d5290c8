"""`llm-gateway bench embeddings` (issue 45; docs/BENCHMARKS.md, "Embeddings"): the same texts
to OpenAI's embeddings route of the gateway, vLLM's server (`--runner pooling`) and infinity-emb,
one at a time, and to sentence-transformers in process; a chat's TTFT under embedding load."""

from __future__ import annotations

import asyncio
import itertools
import random
import shutil
import statistics
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from functools import partial
from pathlib import Path
from time import perf_counter
from typing import Literal, get_args

import aiohttp
import msgspec

from gateway.config.settings import DEFAULT_EMBEDDING_MODEL_NAME, Settings
from gateway_bench import clients, machine, targets
from gateway_bench.cpu import CpuMeter, CpuUse
from gateway_bench.machine import Machine
from gateway_bench.metrics import BenchError, percentile
from gateway_bench.options import Options, Positive, Scenario, begin
from gateway_bench.report import Goal, Report, Section, Table, cell, ratio, write
from gateway_bench.worker import JSON_HEADERS, Worker, session
from gateway_bench.workload import Request

Target = Literal[
    "gateway", "vllm-server", "vllm-server-defaults", "infinity-emb", "sentence-transformers"
]
TARGETS: tuple[Target, ...] = get_args(Target)
GATEWAY, VLLM, VLLM_DEFAULTS, INFINITY, IN_PROCESS = TARGETS
NAME = DEFAULT_EMBEDDING_MODEL_NAME  # every server serves the model under this name
GOAL_AT, TTFT_RATIO = (32, 32), 2.0  # (concurrency, inputs): the goals' cell and the chats' load
Start = Callable[[], AbstractAsyncContextManager[targets.Endpoint]]


class EmbeddingsOptions(Options, frozen=True, kw_only=True):
    concurrency: list[Positive] = msgspec.field(default_factory=lambda: [1, 8, 32])
    inputs: list[Positive] = msgspec.field(default_factory=lambda: [1, 32])  # per request
    requests: Positive = 24  # per cell: max(requests, concurrency)
    cell_seconds: float = 40.0  # no request is sent after this: a slow target's cell is cut
    text_tokens: tuple[Positive, Positive] = (100, 200)  # special tokens included
    targets: list[Target] = msgspec.field(default_factory=lambda: list(TARGETS))
    infinity_emb: str = "infinity_emb"  # the program; the target is skipped when it is absent
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


class EmbeddingsReport(msgspec.Struct, kw_only=True):
    command: str
    machine: Machine
    options: EmbeddingsOptions
    model_dir: str
    cells: list[Cell] = msgspec.field(default_factory=list)
    start_s: dict[str, float] = msgspec.field(default_factory=dict)  # each server's start-up
    chat_idle_ms: list[float] = msgspec.field(default_factory=list)  # the gateway's chat TTFTs
    chat_loaded_ms: list[float] = msgspec.field(default_factory=list)  # under embedding load
    notes: list[str] = msgspec.field(default_factory=list)


class _Answer(msgspec.Struct):
    data: list[msgspec.Raw]  # one a vector: counted, not read


def texts(model_dir: str, span: tuple[int, int], seed: int, count: int = 1024) -> list[str]:
    """Seeded texts of `span` tokens, whole words the tokenizer holds as one token each: the
    pool every target's requests cycle through in the same order."""
    vocabulary = targets.tokenizer(model_dir).get_vocab()
    words = sorted(w for w in vocabulary if w.isascii() and w.isalpha() and 3 <= len(w) <= 8)
    rng, special = random.Random(seed), 2  # [CLS] and [SEP]
    return [" ".join(rng.choices(words, k=rng.randint(*span) - special)) for _ in range(count)]


def batch(pool: Sequence[str], index: int, inputs: int) -> list[str]:
    return [pool[(index * inputs + k) % len(pool)] for k in range(inputs)]


class _Load:
    """Clients sending requests of `inputs` texts back to back to `url`, and what they saw."""

    def __init__(
        self, pool: Sequence[str], client: aiohttp.ClientSession | None, url: str, limit_s: float
    ) -> None:
        self.pool, self.client, self.url, self.limit_s = pool, client, url, limit_s
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.answered = asyncio.Event()  # set by the first answer

    async def one(self, index: int, inputs: int) -> None:
        body = {"model": NAME, "input": batch(self.pool, index, inputs), "encoding_format": "float"}
        assert self.client is not None, "a load without a server"
        sent = perf_counter()
        try:
            data = msgspec.json.encode(body)
            posted = self.client.post(self.url, data=data, headers=JSON_HEADERS)
            async with asyncio.timeout(self.limit_s), posted as r:
                raw = await r.read()
                if r.status != 200 or len(msgspec.json.decode(raw, type=_Answer).data) != inputs:
                    raise BenchError(f"HTTP {r.status}: {raw[:300].decode(errors='replace')}")
        except (aiohttp.ClientError, TimeoutError, BenchError, msgspec.DecodeError) as e:
            self.failures.append(str(e) or type(e).__name__)
        else:
            self.latencies.append(perf_counter() - sent)
        self.answered.set()

    async def run(self, concurrency: int, inputs: int, count: int, deadline: float) -> None:
        numbers = itertools.count()

        async def client() -> None:
            while perf_counter() < deadline and (index := next(numbers)) < count:
                await self.one(index, inputs)

        await asyncio.gather(*(client() for _ in range(concurrency)))

    # own: the process measured is a frontend (infinity-emb and this one run the model too)
    def cell(self, target: str, c: int, inputs: int, wall: float, cpu: CpuUse, own: bool) -> Cell:
        done, n, times = len(self.latencies), len(self.failures), self.latencies
        rate, error = round(done * inputs / wall, 2), self.failures[0] if n else None
        frontend = cpu.per_token_ms(done * inputs) if own else None
        p50, p99 = (
            round(1000 * (percentile(times, q) or 0), 1) if done else None for q in (50, 99)
        )
        return Cell(target, c, inputs, done + n, n, rate, p50, p99, frontend, cpu.other_pct, error)


async def measure_server(
    target: str, at: targets.Endpoint, path: str, pool: Sequence[str], options: EmbeddingsOptions
) -> list[Cell]:
    """Each (inputs, concurrency) cell, after a warm-up that waits for the route to answer."""
    cells, limit, deadline = [], options.request_timeout, perf_counter() + options.start_timeout
    async with session() as client:
        warm = _Load(pool, client, at.url + path, limit)
        while not warm.latencies and perf_counter() < deadline:
            await warm.run(2, max(options.inputs), 2, float("inf"))
        pids = () if at.pid is None else (at.pid,)
        for inputs, c in itertools.product(options.inputs, options.concurrency):
            load, meter = _Load(pool, client, warm.url, limit), await CpuMeter.start(pids)
            began = perf_counter()
            await load.run(c, inputs, max(options.requests, c), began + options.cell_seconds)
            wall, cpu = perf_counter() - began, await meter.stop()
            cells.append(load.cell(target, c, inputs, wall, cpu, own=target != INFINITY))
            targets.say(f"{target} c={c} inputs={inputs}: {cells[-1].texts_per_s} texts/s")
    return cells


async def _chats(worker: Worker, count: int, gap: float = 0.0) -> list[float]:
    ask, ttfts = partial(clients.send, clients.chat_completions, worker), []
    for _ in range(count):
        ttfts.append(round((await ask(Request("chat", "Name three colours.", 8, 0))).ttft_ms(), 1))
        await asyncio.sleep(gap)
    return ttfts


async def chat_ttft(at: targets.Endpoint, result: EmbeddingsReport, pool: Sequence[str]) -> None:
    """Chats one at a time, idle, then a second apart under GOAL_AT's load once it answers."""
    async with session() as client:
        worker = Worker(at.context(client, model=at.model))
        await _chats(worker, 1)  # warm-up
        result.chat_idle_ms = await _chats(worker, result.options.chats)
        load = _Load(pool, client, at.url + "/v1/embeddings", result.options.request_timeout)
        saturating = asyncio.create_task(load.run(*GOAL_AT, 1 << 62, float("inf")))
        try:
            await load.answered.wait()
            result.chat_loaded_ms = await _chats(worker, result.options.chats, gap=1.0)
        finally:
            saturating.cancel()
            await asyncio.gather(saturating, return_exceptions=True)


def launch(target: str, program: str, model_dir: str, port: int, seed: int) -> targets.Launch:
    """infinity-emb, or vLLM's server on pooling_engine.py's settings (VLLM_DEFAULTS: vLLM's)."""
    where = ["--host", "127.0.0.1", "--port", str(port)]
    if target == INFINITY:
        command = [program, "v2", "--model-id", model_dir, "--served-model-name", NAME, *where]
        command += ["--engine", "torch", "--device", "cpu", "--no-vector-disk-cache"]
        return targets.Launch([*command, "--log-level", "warning"], {}, NAME)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir]
    command += ["--runner", "pooling", "--served-model-name", NAME, "--seed", str(seed)]
    command += [*where, "--uvicorn-log-level", "warning"]
    settings, defaults = Settings(), machine.cpu_defaults(Settings().embedding_dtype)
    # Even at vLLM's defaults: without a size its CPU worker needs 0.92 of the memory free
    command += ["--kv-cache-memory-bytes", str(int(settings.embedding_kv_cache_gib * targets.GIB))]
    if target == VLLM_DEFAULTS:
        return targets.Launch(command, {}, NAME)
    command += ["--dtype", defaults.dtype, "--enforce-eager", "--scheduling-policy", "priority"]
    command += ["--max-num-batched-tokens", str(settings.embedding_max_num_batched_tokens)]
    command += ["--max-num-seqs", str(settings.embedding_max_num_seqs)]
    return targets.Launch(command, dict(defaults.environment), NAME)


async def sentence_transformers(
    model_dir: str, pool: Sequence[str], options: EmbeddingsOptions
) -> list[Cell]:
    """sentence-transformers in this process, one caller, `batch_size` texts a batch."""
    from sentence_transformers import SentenceTransformer

    model = await asyncio.to_thread(SentenceTransformer, model_dir, device="cpu")
    encode = partial(model.encode, batch_size=options.batch_size)
    await asyncio.to_thread(encode, batch(pool, 0, options.batch_size))  # warm-up
    cells = []
    for inputs in options.inputs:
        timed, meter, began = _Load(pool, None, "", 0.0), await CpuMeter.start(()), perf_counter()
        for index in range(options.requests):
            if (sent := perf_counter()) > began + options.cell_seconds:
                break
            await asyncio.to_thread(encode, batch(pool, index, inputs))
            timed.latencies.append(perf_counter() - sent)
        wall, cpu = perf_counter() - began, await meter.stop()
        cells.append(timed.cell(IN_PROCESS, 1, inputs, wall, cpu, own=False))
    return cells


async def _measure(
    target: str, result: EmbeddingsReport, pool: Sequence[str], out: Path, start: Start | None
) -> None:
    """One target's cells (and the gateway's chat TTFT) into `result`; its server stopped after."""
    options, model_dir = result.options, result.model_dir
    if target == IN_PROCESS:
        result.cells += await sentence_transformers(model_dir, pool, options)
        return
    program = shutil.which(options.infinity_emb) if target == INFINITY else ""
    if program is None:
        result.notes.append(f"{INFINITY}: skipped, `{options.infinity_emb}` not found")
        return
    if target == GATEWAY:
        env = {"EMBEDDING_MODEL": "default"}
        server = start() if start else targets.started_gateway(options, out, env=env)
    else:
        launched = partial(launch, target, program, model_dir, seed=options.seed)
        server = targets.started(options, out, target, launched)
    async with server as endpoint:
        if endpoint.start_s is not None:
            result.start_s[target] = endpoint.start_s
        path = "/embeddings" if target == INFINITY else "/v1/embeddings"
        result.cells += await measure_server(target, endpoint, path, pool, options)
        if target == GATEWAY:
            await chat_ttft(endpoint, result, pool)


async def run_embeddings(
    options: EmbeddingsOptions, command: str, start: Start | None = None
) -> tuple[EmbeddingsReport, Path]:
    """Every target in turn; `start`: the gateway (by default one with EMBEDDING_MODEL=default)."""
    from gateway.engine.pooling_engine import default_embedding_model

    out, host = await begin(options, 4 * max(options.concurrency, default=32) + 256, "embeddings-")
    model_dir = str(await asyncio.to_thread(default_embedding_model))
    pool = await asyncio.to_thread(texts, model_dir, options.text_tokens, options.seed)
    result = EmbeddingsReport(command=command, machine=host, options=options, model_dir=model_dir)
    for target in (t for t in TARGETS if t in options.targets):
        try:
            await _measure(target, result, pool, out, start)
        except (RuntimeError, TimeoutError, BenchError, OSError) as e:
            result.notes.append(f"{target}: failed: {str(e).splitlines()[0]} (see its log)")
            targets.say(f"{target} failed: {e}")
    host.load_end = machine.load()
    await asyncio.to_thread(write, result, report(result), out)
    return result, out


def _rate(result: EmbeddingsReport, target: str, at: tuple[int, int] = GOAL_AT) -> float | None:
    rates = {(c.target, c.concurrency, c.inputs): c.texts_per_s for c in result.cells}
    return rates.get((target, *at))


def _at_least(name: str, measured: float | None, reference: float | None) -> Goal:
    shown = f"{cell(measured)} / {cell(reference)} texts/s = {ratio(measured, reference)}x"
    passed = None if measured is None or not reference else measured >= reference
    return Goal(name, ">= 1.0x", shown, passed)


def goals(result: EmbeddingsReport) -> list[Goal]:
    at, gateway = f"c={GOAL_AT[0]} x {GOAL_AT[1]} inputs", _rate(result, GATEWAY)
    chats = (result.chat_idle_ms, result.chat_loaded_ms)
    idle, loaded = (statistics.median(ms) if ms else None for ms in chats)
    passed = None if loaded is None or not idle else loaded <= TTFT_RATIO * idle
    shown = f"p50 {cell(loaded)} / {cell(idle)} ms = {ratio(loaded, idle)}x"
    ttft = f"chat TTFT under embedding load <= {TTFT_RATIO:g}x idle"
    return [
        _at_least(f"gateway >= 1.0x {VLLM} (same settings), {at}", gateway, _rate(result, VLLM)),
        _at_least(f"gateway >= {INFINITY}'s texts/s, {at}", gateway, _rate(result, INFINITY)),
        Goal(ttft, f"<= {TTFT_RATIO:g}x", shown, passed),
    ]


COLUMNS = ["target", "concurrency", "inputs", "requests", "texts/s", f"x {VLLM}", "p50 ms"]
COLUMNS += ["p99 ms", "frontend CPU ms/text", "other CPU %", "failed"]


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

    def row(c: Cell) -> list[object]:
        versus = ratio(c.texts_per_s, _rate(result, VLLM, (c.concurrency, c.inputs)))
        head = [c.target, c.concurrency, c.inputs, c.requests, cell(c.texts_per_s), versus]
        tail = [cell(c.p50_ms), cell(c.p99_ms), cell(c.frontend_ms_per_text, 3)]
        return [*head, *tail, cell(c.other_cpu_pct), c.failed]

    rows = [row(c) for c in result.cells]
    sections = [Section("Texts per second and latency", notes, Table(COLUMNS, rows))]
    sections.append(Section("Goals", goals=goals(result)))
    return Report("Embeddings: texts per second and latency", result.command, host, sections, intro)


async def _run(options: EmbeddingsOptions, command: str) -> tuple[str, Path, bool]:
    result, out = await run_embeddings(options, command)
    return report(result).markdown(), out, all(g.passed is not False for g in goals(result))


SUMMARY = "Embeddings: texts/s and latency (gateway, vLLM, infinity-emb); chat TTFT under load"
HELP = {"targets": f"from {', '.join(TARGETS)}"}
_check = lambda options: "--profile: not measured here" if options.profile else None  # noqa: E731
SCENARIO = Scenario("embeddings", SUMMARY, EmbeddingsOptions, QUICK, _run, help=HELP, check=_check)
parse = SCENARIO.parse  # this scenario's flags alone (the tests')
