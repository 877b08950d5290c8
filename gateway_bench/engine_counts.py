"""A server's GET /metrics as sums by sample name: the one parser of every scenario.

`parse_counts` reads the engine's own counts: the gateway's `gateway_engine_*` gauges or vLLM's
server's `vllm:num_preemptions_total` and `vllm:num_requests_running` / `_waiting`. Both count
a preemption when the preempted request resumes, so a count is complete only once the engine
has emptied (`drained`).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from time import perf_counter

import aiohttp
import msgspec
from prometheus_client.parser import text_string_to_metric_families


def metric_sums(text: str) -> dict[str, float]:
    """Each sample name's values summed over its label sets; a sample with a `kind` label also
    under `name:kind`."""
    found: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name] += sample.value
            if (kind := sample.labels.get("kind")) is not None:
                found[f"{sample.name}:{kind}"] += sample.value
    return dict(found)


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as response:
        response.raise_for_status()
        return metric_sums(await response.text())


class EngineCounts(msgspec.Struct, frozen=True):
    preemptions: int | None  # None: the server does not export it
    running: int | None
    waiting: int | None

    @property
    def idle(self) -> bool:
        return self.running == 0 and not self.waiting


def parse_counts(text: str) -> EngineCounts:
    return counts_of(metric_sums(text))


def counts_of(sums: dict[str, float]) -> EngineCounts:
    def count(gateway: str, vllm: str) -> int | None:
        found = [sums[name] for name in (gateway, vllm) if name in sums]
        return int(sum(found)) if found else None

    return EngineCounts(
        count("gateway_engine_preemptions", "vllm:num_preemptions_total"),
        count("gateway_engine_running", "vllm:num_requests_running"),
        count("gateway_engine_waiting", "vllm:num_requests_waiting"),
    )


async def drained(session: aiohttp.ClientSession, url: str, limit_s: float) -> EngineCounts | None:
    """The counts once the engine runs and holds nothing; None if it still does after
    `limit_s` (or never says what it runs)."""
    deadline = perf_counter() + limit_s
    while True:
        counts = counts_of(await scrape(session, url))
        if counts.idle:
            return counts
        if counts.running is None or perf_counter() > deadline:
            return None
        await asyncio.sleep(0.05)
