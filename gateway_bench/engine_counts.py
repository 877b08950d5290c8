"""The engine's own counts from a server's GET /metrics: the gateway's or vLLM's server's.

The gateway exports its engine's scheduler figures as `gateway_engine_*` gauges; vLLM's
server exports `vllm:num_preemptions` (a counter: `_total`, labelled by engine and model)
and `vllm:num_requests_running` / `_waiting`. Both count a preemption when the preempted
request resumes, so a count is complete only once the engine has emptied (`drained`).
"""

from __future__ import annotations

import asyncio
from time import perf_counter

import aiohttp
import msgspec
from prometheus_client.parser import text_string_to_metric_families

_NAMES = {
    "gateway_engine_preemptions": "preemptions",
    "vllm:num_preemptions_total": "preemptions",
    "gateway_engine_running": "running",
    "vllm:num_requests_running": "running",
    "gateway_engine_waiting": "waiting",
    "vllm:num_requests_waiting": "waiting",
}


class EngineCounts(msgspec.Struct, frozen=True):
    preemptions: int | None  # None: the server does not export it
    running: int | None
    waiting: int | None

    @property
    def idle(self) -> bool:
        return self.running == 0 and not self.waiting


def parse_counts(text: str) -> EngineCounts:
    """The figures summed over their label sets (one engine each, on these servers)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (field := _NAMES.get(sample.name)) is not None:
                found[field] = found.get(field, 0.0) + sample.value
    figures = {field: int(value) for field, value in found.items()}
    return EngineCounts(figures.get("preemptions"), figures.get("running"), figures.get("waiting"))


async def engine_counts(session: aiohttp.ClientSession, url: str) -> EngineCounts:
    async with session.get(url + "/metrics") as response:
        response.raise_for_status()
        return parse_counts(await response.text())


async def drained(session: aiohttp.ClientSession, url: str, limit_s: float) -> EngineCounts | None:
    """The counts once the engine runs and holds nothing; None if it still does after
    `limit_s` (or never says what it runs)."""
    deadline = perf_counter() + limit_s
    while True:
        counts = await engine_counts(session, url)
        if counts.idle:
            return counts
        if counts.running is None or perf_counter() > deadline:
            return None
        await asyncio.sleep(0.05)
