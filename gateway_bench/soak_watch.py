"""What the soak reads from the gateway while it runs: `/metrics` and the process's memory, and
the scrapes no client present explains (docs/BENCHMARKS.md, "Soak": "Nothing outlives its
client")."""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import Callable, Sequence
from contextlib import suppress
from time import perf_counter

import aiohttp
import msgspec
import psutil

from gateway_bench import engine_counts
from gateway_bench.engine_counts import metric_sums

ENGINE_REQUESTS = "gateway_engine_requests"
_ACCEPTED, _ABORTS = "gateway_prompts_accepted_total", "gateway_engine_aborts_total"
_TERMINAL = "gateway_terminal_events_total"


class Scrape(msgspec.Struct, frozen=True):
    sent: float
    answered: float
    engine_requests: int


class Counters(msgspec.Struct, frozen=True):
    """The accounting counters of one scrape, summed over protocols."""

    accepted: int
    terminal: dict[str, int]  # by kind: finished, rate_limited, client_gone...
    engine_aborts: int
    engine_requests: int

    def minus(self, before: Counters) -> Counters:
        kinds = self.terminal.keys() | before.terminal.keys()
        return Counters(
            self.accepted - before.accepted,
            {k: self.terminal.get(k, 0) - before.terminal.get(k, 0) for k in sorted(kinds)},
            self.engine_aborts - before.engine_aborts,
            self.engine_requests,
        )

    @property
    def terminal_total(self) -> int:
        return sum(self.terminal.values())


def parse_counters(text: str) -> Counters:
    return counters_of(metric_sums(text))


def counters_of(sums: dict[str, float]) -> Counters:
    kinds = sorted(k for k in sums if k.startswith(_TERMINAL + ":"))
    terminal = {k.partition(":")[2]: int(sums[k]) for k in kinds}
    accepted, aborts = sums.get(_ACCEPTED, 0.0), sums.get(_ABORTS, 0.0)
    return Counters(int(accepted), terminal, int(aborts), int(sums.get(ENGINE_REQUESTS, 0.0)))


async def settled(session: aiohttp.ClientSession, base_url: str, limit_s: float) -> Counters:
    """The counters once every accepted prompt is counted out and the engine holds nothing, or
    as they are after `limit_s`."""
    deadline = perf_counter() + limit_s
    while True:
        now = counters_of(await engine_counts.scrape(session, base_url))
        done = now.accepted == now.terminal_total and now.engine_requests == 0
        if done or perf_counter() > deadline:
            return now
        await asyncio.sleep(0.1)


class MetricsWatch:
    def __init__(self, session: aiohttp.ClientSession, base_url: str, interval: float) -> None:
        self._session = session
        self._url = base_url + "/metrics"
        self._interval = interval
        self.scrapes: list[Scrape] = []
        self.errors = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            sent = perf_counter()
            try:
                async with self._session.get(self._url) as r:
                    text = await r.text()
                self.scrapes.append(
                    Scrape(sent, perf_counter(), parse_counters(text).engine_requests)
                )
            except (aiohttp.ClientError, ValueError):
                self.errors += 1
            with suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval)


class RssWatch:
    """The process's resident memory, each with the count of requests done when it was read."""

    def __init__(self, pid: int, done: Callable[[], int], interval: float) -> None:
        self._process = psutil.Process(pid)
        self._done = done
        self._interval = interval
        self.samples: list[tuple[int, int]] = []  # (requests done, RSS bytes)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.samples.append((self._done(), int(self._process.memory_info().rss)))
            with suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval)

    def mean_between(self, low: int, high: int) -> float | None:
        """The mean RSS of the samples read while `low` <= requests done < `high`."""
        chosen = [rss for done, rss in self.samples if low <= done < high]
        return sum(chosen) / len(chosen) if chosen else None


class Presence(msgspec.Struct, frozen=True):
    """A client's prompts, present from `start` to `end`: its answer's end, or its leaving
    plus the grace."""

    start: float
    end: float
    prompts: int


def margins(scrapes: Sequence[Scrape], presences: Sequence[Presence]) -> list[int]:
    """For each scrape, the prompts of the clients present at any moment of it (from its
    sending to its answer) minus the engine's requests: below 0, a request nobody explains."""
    starts = sorted(presences, key=lambda p: p.start)
    ends = sorted(presences, key=lambda p: p.end)
    start_times = [p.start for p in starts]
    end_times = [p.end for p in ends]
    started = [0, *itertools.accumulate(p.prompts for p in starts)]
    ended = [0, *itertools.accumulate(p.prompts for p in ends)]
    found: list[int] = []
    for scrape in scrapes:
        # Present at some moment of the scrape: started by its answer, not ended before it went.
        present = started[bisect.bisect_right(start_times, scrape.answered)]
        present -= ended[bisect.bisect_left(end_times, scrape.sent)]
        found.append(present - scrape.engine_requests)
    return found


def unexplained(scrapes: Sequence[Scrape], presences: Sequence[Presence]) -> list[Scrape]:
    """The scrapes where the engine held more requests than the clients present explain."""
    return [s for s, m in zip(scrapes, margins(scrapes, presences), strict=True) if m < 0]
