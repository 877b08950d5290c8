"""A server's GET /metrics as sums by sample name: the one parser of every scenario, and the
one "scrape until" loop (`until`).

`counts_of` reads the engine's own counts: the gateway's `gateway_engine_*` gauges or vLLM's
server's `vllm:num_preemptions_total` and `vllm:num_requests_running` / `_waiting`. Both count
a preemption when the preempted request resumes, so a count is complete only once the engine
has emptied (`drained`).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
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


async def until(
    session: aiohttp.ClientSession,
    url: str,
    done: Callable[[dict[str, float]], bool],
    limit_s: float,
    interval_s: float = 0.1,
) -> dict[str, float]:
    """The sums once `done(sums)`, or as they are after `limit_s`."""
    deadline = perf_counter() + limit_s
    while True:
        sums = await scrape(session, url)
        if done(sums) or perf_counter() > deadline:
            return sums
        await asyncio.sleep(interval_s)


class EngineCounts(msgspec.Struct, frozen=True):
    preemptions: int | None  # None: the server does not export it
    running: int | None
    waiting: int | None

    @property
    def idle(self) -> bool:
        return self.running == 0 and not self.waiting


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
    counts = counts_of(await until(session, url, _idle_or_silent, limit_s, 0.05))
    return counts if counts.idle else None


def _idle_or_silent(sums: dict[str, float]) -> bool:
    counts = counts_of(sums)
    return counts.idle or counts.running is None
