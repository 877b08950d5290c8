"""The soak's amplification parts (issues 31 and 43): another key's TTFT while one key asks for
the most engine sequences it may, then sends the hostile probe's constraints (docs/BENCHMARKS.md,
"Soak": the goals' table; docs/BENCHMARKS-HISTORY.md, "Amplification by constraints")."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import re
from collections.abc import Awaitable, Callable
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event as EventType
from time import perf_counter
from typing import Any

import aiohttp
import msgspec

from gateway_bench.clients import completions
from gateway_bench.metrics import Record, median
from gateway_bench.report import Goal
from gateway_bench.worker import Context, Worker
from gateway_bench.workload import Request

AMPLIFICATION_GOAL = 2.0  # another key's TTFT p50 under the largest asks, over idle (issue 31)
_RATE_LIMITED_PAUSE_S = 0.05  # a refused client asks again at once, as a greedy one would


def _probes() -> list[tuple[str, Any]]:
    words = "|".join(f"w7x{i}" for i in range(50_000))
    properties = {f"p{i}": {"type": "string"} for i in range(10_000)}
    return [
        ("regex", words),
        ("json", {"type": "object", "properties": properties}),
        ("json", {"type": "string", "enum": [f"value{i}" for i in range(100_000)]}),
    ]


class ConstraintLoad(msgspec.Struct, kw_only=True):
    contended_ttft_p50_ms: float | None  # the main key's, while the probes were sent
    chats: int
    chat_failures: int
    probes: int  # the limited key's requests carrying a probe's constraint
    refused_naming_field: int  # of those, a 4xx naming the field and a MAX_ setting
    server_errors: int


class _ProbeTally(msgspec.Struct):
    probes: int = 0
    refused: int = 0
    server_errors: int = 0


async def _probe(
    url: str, headers: dict[str, str], prompt: str, askers: int, stop: EventType, started: EventType
) -> _ProbeTally:
    """`askers` clients sending the probes in turn, back to back, until `stop`."""
    encoded = [
        (name, {"prompt": prompt, "max_tokens": 2, "structured_outputs": {name: value}})
        for name, value in _probes()
    ]
    bodies = [(name, msgspec.json.encode(body)) for name, body in encoded]
    tally = _ProbeTally()

    async def prober(session: aiohttp.ClientSession) -> None:
        turn = 0
        while not stop.is_set():
            name, body = bodies[turn % len(bodies)]
            turn += 1
            async with session.post(url, data=body, headers=headers) as r:
                text = (await r.read()).decode(errors="replace")
            started.set()
            tally.probes += 1
            tally.server_errors += r.status >= 500
            named = f"structured_outputs.{name}" in text and "MAX_" in text
            tally.refused += r.status in (400, 422) and named

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        await asyncio.gather(*(prober(session) for _ in range(askers)))
    return tally


def _probe_process(
    url: str,
    headers: dict[str, str],
    prompt: str,
    askers: int,
    stop: EventType,
    started: EventType,
    results: Queue[bytes],
) -> None:
    """The probing key's clients, in a process of their own at the lowest CPU priority: a
    hostile caller's own work (building and sending megabyte bodies) is its machine's, not the
    server's, and on a 2-core loopback run it would otherwise take a core from the engine."""
    os.nice(19)
    results.put(
        msgspec.json.encode(asyncio.run(_probe(url, headers, prompt, askers, stop, started)))
    )


async def measure_constraint_load(
    limited: Context, askers: int, chats: Callable[[], Awaitable[list[float | None]]], prompt: str
) -> ConstraintLoad:
    """`chats()` measures the main key's chats once the probes are coming; the probes run until
    the chats are done."""
    spawn = multiprocessing.get_context("spawn")
    stop, started, results = spawn.Event(), spawn.Event(), spawn.Queue()
    url = limited.base_url + "/v1/completions"
    process = spawn.Process(
        target=_probe_process,
        args=(url, limited.headers(), prompt, askers, stop, started, results),
        daemon=True,
    )
    process.start()
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(None, started.wait)
        contended = await chats()
    finally:
        stop.set()
        raw = await loop.run_in_executor(None, results.get)
        await loop.run_in_executor(None, process.join)
    tally = msgspec.json.decode(raw, type=_ProbeTally)
    return ConstraintLoad(
        contended_ttft_p50_ms=_p50(contended),
        chats=len(contended),
        chat_failures=sum(v is None for v in contended),
        probes=tally.probes,
        refused_naming_field=tally.refused,
        server_errors=tally.server_errors,
    )


class Amplification(msgspec.Struct, kw_only=True):
    sequences: int  # what each of the limited key's largest asks requests (its concurrent limit)
    idle_ttft_p50_ms: float | None
    contended_ttft_p50_ms: float | None
    chats: int  # the main key's chats measured in each phase
    chat_failures: int
    asks: int  # the limited key's requests at its largest ask
    asks_finished: int
    asks_rate_limited: int
    over_asks: int  # requests asking one sequence more than the limit
    over_refused_naming_field: int  # of those, a 4xx naming n / num_beams
    server_errors: int  # any 5xx, either key
    constraints: ConstraintLoad | None = None  # the main key's chats beside the probe's shapes

    @property
    def ratio(self) -> float | None:
        return self._ratio(self.contended_ttft_p50_ms)

    @property
    def constraint_ratio(self) -> float | None:
        return self._ratio(self.constraints.contended_ttft_p50_ms if self.constraints else None)

    def _ratio(self, contended: float | None) -> float | None:
        if self.idle_ttft_p50_ms is None or contended is None:
            return None
        return round(contended / self.idle_ttft_p50_ms, 2)


def concurrent_limit(limits: str) -> int:
    """`concurrent=N` of a keys-file limits text; 1 when it sets none (a single sequence)."""
    found = re.search(r"\bconcurrent=(\d+)", limits)
    return max(1, int(found.group(1))) if found else 1


class _Tally:
    def __init__(self) -> None:
        self.asks = self.finished = self.rate_limited = 0
        self.over = self.over_named = self.server_errors = 0
        self.running = asyncio.Event()  # a largest ask has finished: they are in the engine


async def _chat_ttft(client: Context, prompt: str, tokens: int) -> float | None:
    """A streamed /v1/completions chat's first text, in ms; None when it did not answer."""
    worker, record = Worker(client), Record(perf_counter())
    try:
        await completions(worker, Request("amplification", prompt, tokens, 0), record)
    finally:
        await worker.close()
    return None if record.failure() is not None else record.ttft_ms()


def _ask(prompt: str, sequences: int, tokens: int, beams: bool) -> tuple[str, dict[str, Any]]:
    if beams:
        parameters = {"num_beams": sequences, "max_new_tokens": tokens, "do_sample": False}
        return "/invocations", {"inputs": prompt, "parameters": parameters}
    return "/v1/completions", {
        "prompt": prompt,
        "n": sequences,
        "max_tokens": tokens,
        "temperature": 1.0,
    }


async def _asker(
    client: Context,
    prompt: str,
    sequences: int,
    tokens: int,
    stop: asyncio.Event,
    tally: _Tally,
    turn: int,
) -> None:
    """From `turn` on (3 x the asker's index: each asker's first ask is one too many, the
    askers' first ones `n` and `num_beams` by turns)."""
    while not stop.is_set():
        turn += 1
        over = turn % 3 == 1  # every third ask is one too many: n and num_beams by turns
        path, body = _ask(prompt, sequences + over, tokens, beams=turn % 2 == 0)
        async with client.session.post(
            client.base_url + path, data=msgspec.json.encode(body), headers=client.headers()
        ) as r:
            text = (await r.read()).decode(errors="replace")
        if r.status >= 500:
            tally.server_errors += 1
        if over:
            tally.over += 1
            field = "num_beams" if path == "/invocations" else '"n"'
            tally.over_named += r.status in (400, 422, 424, 429) and field in text
            continue
        tally.asks += 1
        if r.status == 200:
            tally.finished += 1
            tally.running.set()
        elif r.status == 429:
            tally.rate_limited += 1
            await asyncio.sleep(_RATE_LIMITED_PAUSE_S)


async def _chats(client: Context, prompt: str, count: int, tokens: int) -> list[float | None]:
    return [await _chat_ttft(client, prompt, tokens) for _ in range(count)]


def _p50(values: list[float | None]) -> float | None:
    return median([v for v in values if v is not None])


async def measure_amplification(
    main: Context,
    limited: Context,
    prompt: str,
    *,
    chats: int,
    askers: int,
    limits: str,
    tokens: tuple[int, int],
) -> Amplification:
    """The main key's `chats` alone, while the `limited` key's `askers` ask for their most
    sequences (its `limits` allow), then while they send the probe's constraints; `tokens`: a
    chat's and an ask's."""
    (chat_tokens, ask_tokens), sequences = tokens, concurrent_limit(limits)
    idle = await _chats(main, prompt, chats, chat_tokens)
    stop, tally = asyncio.Event(), _Tally()
    asking = [
        asyncio.create_task(_asker(limited, prompt, sequences, ask_tokens, stop, tally, 3 * i))
        for i in range(askers)
    ]
    try:
        running = asyncio.create_task(tally.running.wait())
        await asyncio.wait({running, *asking}, return_when=asyncio.FIRST_COMPLETED)
        running.cancel()
        contended = await _chats(main, prompt, chats, chat_tokens)
    finally:
        stop.set()
        await asyncio.gather(*asking)
    constraints = await measure_constraint_load(
        limited, sequences, lambda: _chats(main, prompt, chats, chat_tokens), prompt
    )
    return Amplification(
        sequences=sequences,
        idle_ttft_p50_ms=_p50(idle),
        contended_ttft_p50_ms=_p50(contended),
        chats=chats,
        chat_failures=sum(v is None for v in idle + contended),
        asks=tally.asks,
        asks_finished=tally.finished,
        asks_rate_limited=tally.rate_limited,
        over_asks=tally.over,
        over_refused_naming_field=tally.over_named,
        server_errors=tally.server_errors,
        constraints=constraints,
    )


def amplification_goal(a: Amplification, quick: bool) -> Goal:
    """Judged on a full run only: a quick run's few chats make its ratio chance."""
    measured = (
        f"the main key's TTFT p50 {a.contended_ttft_p50_ms} ms while the limited key asked for "
        f"{a.sequences} sequences a request vs {a.idle_ttft_p50_ms} ms idle ({a.chats} chats "
        f"each, {a.chat_failures} failed); ratio {a.ratio}; the limited key: {a.asks} largest "
        f"asks, {a.asks_finished} finished, {a.asks_rate_limited} rate limited; "
        f"{a.over_refused_naming_field} of {a.over_asks} asks of one sequence more refused "
        f"naming the field; {a.server_errors} 5xx"
    )
    sound = (
        a.server_errors == 0
        and a.chat_failures == 0
        and a.asks_finished > 0
        and a.over_refused_naming_field == a.over_asks
    )
    passed = sound and (None if quick or a.ratio is None else a.ratio <= AMPLIFICATION_GOAL)
    requirement = (
        f"another key's TTFT p50 at most {AMPLIFICATION_GOAL:g} x its idle one while a key runs "
        "at its limit with the largest n and num_beams it may ask; one more refused, naming "
        "the field"
    )
    return Goal("No amplification by sequences", requirement, measured, passed)


def constraint_goal(a: Amplification, c: ConstraintLoad, quick: bool) -> Goal:
    """Judged on a full run only, as the amplification by sequences."""
    measured = (
        f"the main key's TTFT p50 {c.contended_ttft_p50_ms} ms while the limited key sent the "
        f"probe's constraints vs {a.idle_ttft_p50_ms} ms idle ({c.chats} chats, "
        f"{c.chat_failures} failed); ratio {a.constraint_ratio}; {c.refused_naming_field} of "
        f"{c.probes} constraints refused naming the field and the limit; {c.server_errors} 5xx"
    )
    sound = (
        c.server_errors == 0
        and c.chat_failures == 0
        and c.probes > 0
        and c.refused_naming_field == c.probes
    )
    ratio = a.constraint_ratio
    passed = sound and (None if quick or ratio is None else ratio <= AMPLIFICATION_GOAL)
    requirement = (
        f"another key's TTFT p50 at most {AMPLIFICATION_GOAL:g} x its idle one while a key sends "
        "a 50,000-word regex, a 10,000-property schema and a 100,000-value enum at its limit; "
        "each refused at once, naming the field and the limit"
    )
    return Goal("No amplification by constraints", requirement, measured, passed)


def amplification_goals(a: Amplification | None, quick: bool) -> list[Goal]:
    if a is None:
        return []
    by_constraints = [] if a.constraints is None else [constraint_goal(a, a.constraints, quick)]
    return [amplification_goal(a, quick), *by_constraints]
