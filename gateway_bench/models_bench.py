"""`llm-gateway bench models` (issue 57; docs/BENCHMARKS.md, "Several models"): one gateway
serving the shipped SmolLM2 under four names from a MODELS_FILE, MAX_LOADED_MODELS=2 with the
default model pinned, started by the bench as a subprocess so its processes' memory can be read.

In order: a model not loaded, its first chat's first token, against starting vLLM's own server
on the same model and settings and its first token (the figure a vLLM user has today); the
default model's chat TTFT idle and while another model loads; two unpinned models alternating
in the one place left (each request a swap: one unloaded, the other loaded); and the memory of
the gateway and every process under it before and after `cycles` loads and unloads of a
`keep_alive = 0` model. The report is gateway_bench/models_report.py's.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from time import perf_counter

import aiohttp
import msgspec
import psutil
from prometheus_client.parser import text_string_to_metric_families

from gateway_bench import clients, machine, targets
from gateway_bench.metrics import BenchError, Record, start
from gateway_bench.models_report import (
    DEFAULT,
    FIRST,
    GATEWAY,
    PROMPT,
    QUICK,
    SECOND,
    VLLM,
    ZERO,
    ColdLoad,
    Memory,
    ModelLoads,
    ModelsOptions,
    ModelsReport,
    Swap,
    goals,
    report,
)
from gateway_bench.options import Scenario, begin
from gateway_bench.report import write
from gateway_bench.worker import Context, Worker, session
from gateway_bench.workload import Request

MIB = 1 << 20


def models_file(model_dir: str) -> str:
    """The same model under four names: the default pinned, two that only an eviction unloads,
    one unloaded as soon as its prompt ends."""
    table = f'source = "{model_dir}"\n'
    return (
        f'default = "{DEFAULT}"\n\n[models.{DEFAULT}]\n{table}\n'
        f'[models."{FIRST}"]\n{table}keep_alive = -1\n\n'
        f'[models."{SECOND}"]\n{table}keep_alive = -1\n\n'
        f'[models."{ZERO}"]\n{table}keep_alive = 0\n'
    )


class _Samples:
    """The gateway's gateway_model_* samples, by (sample, model, outcome or reason)."""

    def __init__(self, text: str) -> None:
        self.values: dict[tuple[str, str, str], float] = defaultdict(float)
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.startswith("gateway_model") and not s.name.endswith("_bucket"):
                    kind = s.labels.get("outcome", s.labels.get("reason", ""))
                    self.values[(s.name, s.labels.get("model", ""), kind)] += s.value

    def total(self, name: str, model: str | None = None, kind: str | None = None) -> float:
        return sum(
            v
            for (n, m, k), v in self.values.items()
            if n == name and model in (None, m) and kind in (None, k)
        )

    @property
    def loads(self) -> int:
        return int(self.total("gateway_model_loads_total", kind="loaded"))

    @property
    def unloads(self) -> int:
        return int(self.total("gateway_model_unloads_total"))

    @property
    def load_s(self) -> float:
        return self.total("gateway_model_load_seconds_sum")


class _Listed(msgspec.Struct):
    id: str
    state: str = ""


class _Listing(msgspec.Struct):
    data: list[_Listed]


class _Gateway:
    """The running gateway as the scenarios use it: chats by model, /metrics, states, memory."""

    def __init__(self, at: targets.Endpoint, client: aiohttp.ClientSession, o: ModelsOptions):
        self.at, self.client, self.options = at, client, o

    def worker(self, model: str) -> Worker:
        return Worker(Context(self.client, self.at.url, model))

    def request(self) -> Request:
        return Request("chat", PROMPT, self.options.max_tokens, 0)

    async def chat(self, model: str) -> Record:
        return await clients.send(clients.chat_completions, self.worker(model), self.request())

    async def samples(self) -> _Samples:
        async with self.client.get(self.at.url + "/metrics") as response:
            response.raise_for_status()
            return _Samples(await response.text())

    async def states(self) -> dict[str, str]:
        async with self.client.get(self.at.url + "/v1/models") as response:
            response.raise_for_status()
            listing = msgspec.json.decode(await response.read(), type=_Listing)
        return {m.id: m.state for m in listing.data}

    async def wait_state(self, model: str, state: str) -> None:
        deadline = perf_counter() + self.options.start_timeout
        while (await self.states()).get(model) != state:
            if perf_counter() > deadline:
                raise BenchError(f"{model} was not {state} after {self.options.start_timeout} s")
            await asyncio.sleep(0.2)

    async def memory(self, when: str) -> Memory:
        counts = await self.samples()
        assert self.at.pid is not None, "a gateway the bench started"
        processes, own, rss, uss, by_name = await asyncio.to_thread(tree_memory, self.at.pid)
        return Memory(
            when,
            counts.loads,
            counts.unloads,
            processes,
            round(own / MIB, 1),
            round(rss / MIB, 1),
            round(uss / MIB, 1),
            by_name,
        )

    async def settle(self, processes: int) -> bool:
        """Wait until no more processes run under the gateway than `processes` (an unloaded
        engine's exit); False if they still do after the start timeout."""
        deadline = perf_counter() + self.options.start_timeout
        assert self.at.pid is not None, "a gateway the bench started"
        while (await asyncio.to_thread(tree_memory, self.at.pid))[0] > processes:
            if perf_counter() > deadline:
                return False
            await asyncio.sleep(0.5)
        return True


def tree_memory(pid: int) -> tuple[int, int, int, int, dict[str, float]]:
    """(processes, the process' own RSS, RSS and USS summed over it and its descendants, RSS
    MiB by process name); a zombie is not counted."""
    root = psutil.Process(pid)
    count, own, rss, uss = 0, 0, 0, 0
    by_name: dict[str, float] = defaultdict(float)
    for process in [root, *root.children(recursive=True)]:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                continue  # exited, holding no memory (vLLM's EngineCore, until reaped)
            info = process.memory_full_info()
            name = "gateway" if process.pid == pid else process.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # gone meanwhile
        count, rss, uss = count + 1, rss + info.rss, uss + info.uss
        own = info.rss if process.pid == pid else own
        by_name[name] += info.rss / MIB
    return count, own, rss, uss, {name: round(mib, 1) for name, mib in sorted(by_name.items())}


def _latency(record: Record) -> float:
    return round(record.end - record.sent, 2)


def _ttft(record: Record) -> float:
    return round(record.ttft_ms() / 1000, 2)


async def vllm_cold_load(options: ModelsOptions, out: Path, model_dir: str) -> ColdLoad:
    """vLLM's server started on the model, then its first chat and the next one."""
    launch = lambda port: targets.vllm_launch(options, model_dir, port)  # noqa: E731
    async with targets.started(options, out, VLLM, launch) as at, session() as client:
        worker = Worker(at.context(client, model=at.model))
        request = Request("chat", PROMPT, options.max_tokens, 0)
        first = await clients.send(clients.chat_completions, worker, request)
        after = await clients.send(clients.chat_completions, worker, request)
    targets.say(f"{VLLM}: ready in {at.start_s} s, first token {_ttft(first)} s after")
    return ColdLoad(VLLM, at.start_s, _ttft(first), None, round(after.ttft_ms(), 1))


async def cold_load(gw: _Gateway, result: ModelsReport) -> None:
    """FIRST, not loaded: its first chat (its load), then the next."""
    before = await gw.samples()
    first = await gw.chat(FIRST)
    load_s = round((await gw.samples()).load_s - before.load_s, 2)
    after = await gw.chat(FIRST)
    result.cold.append(
        ColdLoad(GATEWAY, gw.at.start_s, _ttft(first), load_s, round(after.ttft_ms(), 1))
    )
    targets.say(f"gateway: {FIRST}'s first token {_ttft(first)} s after its request")


async def beside_a_load(gw: _Gateway, result: ModelsReport) -> None:
    """The default model's chats idle, then `gap` apart from the moment a request for SECOND
    waits for its load (FIRST evicted for it) to that request's first token."""
    result.idle_ms = [round((await gw.chat(DEFAULT)).ttft_ms(), 1) for _ in range(gw.options.chats)]
    record = start()
    loading = asyncio.create_task(clients.chat_completions(gw.worker(SECOND), gw.request(), record))
    try:
        while not loading.done():  # until the gateway holds the request for the load
            if (await gw.samples()).total("gateway_model_load_waiting"):
                break
            await asyncio.sleep(0.05)
        while record.first is None and not loading.done():
            chat = await gw.chat(DEFAULT)
            if record.first is None or (chat.first or 0) <= record.first:
                result.loading_ms.append(round(chat.ttft_ms(), 1))
            await asyncio.sleep(gw.options.gap)
        await loading
    finally:
        loading.cancel()
    if (failure := record.failure()) is not None:
        raise BenchError(f"{SECOND}'s load: {failure}")
    result.beside_load_s = _ttft(record)
    targets.say(f"{DEFAULT} TTFT idle {result.idle_ms}, beside a load {result.loading_ms} ms")


async def alternate(gw: _Gateway, result: ModelsReport) -> None:
    """FIRST and SECOND in turn (SECOND is loaded): each request unloads one, loads the other."""
    for index in range(gw.options.swaps):
        model = (FIRST, SECOND)[index % 2]
        before = await gw.samples()
        record = await gw.chat(model)
        after = await gw.samples()
        evicted = after.total("gateway_model_unloads_total", kind="evicted")
        evicted -= before.total("gateway_model_unloads_total", kind="evicted")
        load_s = round(after.load_s - before.load_s, 2)
        result.swaps.append(Swap(model, _ttft(record), _latency(record), load_s, int(evicted)))
        targets.say(f"swap {index + 1}: {model} in {_latency(record)} s (load {load_s} s)")


async def cycles(gw: _Gateway, result: ModelsReport, baseline: Memory) -> None:
    """ZERO's requests one after another, each waiting for its unload: one warm cycle, then
    `cycles` loads and unloads; the memory after the first and after the last, once its
    processes are gone."""
    for index in range(gw.options.cycles + 1):
        record = await gw.chat(ZERO)
        result.cycles_s.append(_latency(record))
        await gw.wait_state(ZERO, "unloaded")
        targets.say(f"cycle {index + 1}: {ZERO} loaded, answered, unloaded")
        if index == 0:
            await gw.settle(baseline.processes)
            result.memory.append(await gw.memory(f"after {ZERO}'s first load and unload"))
    if not await gw.settle(baseline.processes):
        result.notes.append("more processes under the gateway at the end than at the start")
    after = f"after {gw.options.cycles} more loads and unloads of {ZERO}"
    result.memory.append(await gw.memory(after))


def per_model(samples: _Samples) -> list[ModelLoads]:
    rows = []
    for model in (DEFAULT, FIRST, SECOND, ZERO):
        unloads = {
            reason: int(samples.total("gateway_model_unloads_total", model, reason))
            for reason in ("idle", "evicted", "admin")
        }
        loads = int(samples.total("gateway_model_loads_total", model, "loaded"))
        seconds = round(samples.total("gateway_model_load_seconds_sum", model), 2)
        rows.append(ModelLoads(model, loads, seconds, unloads))
    return rows


async def measure_gateway(at: targets.Endpoint, result: ModelsReport) -> None:
    async with session() as client:
        gw = _Gateway(at, client, result.options)
        for _ in range(2):  # warm-up: the default model's first requests
            await gw.chat(DEFAULT)
        baseline = await gw.memory("start: the default model loaded, nothing else yet")
        result.memory.append(baseline)
        await cold_load(gw, result)
        await beside_a_load(gw, result)
        await alternate(gw, result)
        await cycles(gw, result, baseline)
        result.per_model = per_model(await gw.samples())


async def run_models(options: ModelsOptions, command: str) -> tuple[ModelsReport, Path]:
    """vLLM's server (its cold start), then the gateway on the MODELS_FILE, each stopped after."""
    out, host = await begin(options, 1024, "models-")
    model_dir = await asyncio.to_thread(targets.model_dir, options)
    text = models_file(model_dir)
    path = out / "models.toml"
    await asyncio.to_thread(path.write_text, text)
    result = ModelsReport(
        command=command, machine=host, options=options, model_dir=model_dir, models_file=text
    )
    errors = (RuntimeError, TimeoutError, BenchError, OSError, aiohttp.ClientError)
    if options.vllm_server:
        try:
            result.cold.append(await vllm_cold_load(options, out, model_dir))
        except errors as e:
            result.notes.append(f"{VLLM}: failed: {str(e).splitlines()[0]} (see its log)")
    env = {"MODELS_FILE": str(path), "MAX_LOADED_MODELS": "2"}
    try:
        gateway = targets.started_gateway(options, out, env=env, dtype=host.defaults.dtype)
        async with gateway as at:
            await measure_gateway(at, result)
    except errors as e:
        result.notes.append(f"{GATEWAY}: failed: {str(e).splitlines()[0]} (see gateway.log)")
        targets.say(f"gateway failed: {e}")
    host.load_end = machine.load()
    await asyncio.to_thread(write, result, report(result), out)
    return result, out


async def _run(options: ModelsOptions, command: str) -> tuple[str, Path, bool]:
    result, out = await run_models(options, command)
    return report(result).markdown(), out, all(g.passed is not False for g in goals(result))


SUMMARY = "Several models: cold load vs vLLM's server, TTFT beside a load, swaps, memory"
HELP = {
    "chats": "the default model's chats idle (beside a load: one every --gap seconds)",
    "swaps": "requests alternating between two models with room for one",
    "cycles": "loads and unloads of the keep_alive = 0 model before the memory is read again",
    "vllm_server": "start vLLM's server for the cold load's reference",
}
_check = lambda options: "--profile: not measured here" if options.profile else None  # noqa: E731
SCENARIO = Scenario("models", SUMMARY, ModelsOptions, QUICK, _run, help=HELP, check=_check)
parse = SCENARIO.parse  # this scenario's flags alone (the tests')
