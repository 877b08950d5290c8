"""What the soak reads and judges: each request's outcome at its client, the gateway's
`/metrics` and memory while it runs, the scrapes no client present explains
(docs/BENCHMARKS.md, "Soak": "Nothing outlives its client"), the figures, goals and report."""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from time import perf_counter
from typing import Any

import aiohttp
import msgspec
import psutil

from gateway_bench.machine import Machine
from gateway_bench.metrics import ERROR, FINISHED, RATE_LIMITED, REFUSED, Record, ms_at, percentile
from gateway_bench.report import Goal, Report, Section
from gateway_bench.scrape import metric_sums
from gateway_bench.soak_amplification import Amplification, amplification_goals

BASELINE, CONTENDED = "baseline", "contended"
TTFT_RATIO_GOAL = 1.25  # the main key's TTFT p50 while the limited key sends, over without
RSS_GOAL = 0.05
AMPLIFICATION_GOAL = 2.0  # another key's TTFT p50 under the largest asks, over idle (issue 31)
ENGINE_REQUESTS = "gateway_engine_requests"
_ACCEPTED, _ABORTS = "gateway_prompts_accepted_total", "gateway_engine_aborts_total"
_TERMINAL = "gateway_terminal_events_total"
_MB = 1 << 20


class Outcome(Record, kw_only=True):
    """What a request's client saw (metrics.Record), tagged with who sent it and when."""

    index: int
    protocol: str
    streamed: bool  # TTFT is the first text's time, not the whole answer's
    key: str  # "main" or "limited"
    phase: str  # "baseline" or "contended": whether the limited key was sending
    invalid: bool
    left_at: float | None = None  # the client left (closed its connection) then

    @property
    def left(self) -> bool:
        return self.left_at is not None


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

    @classmethod
    def of(cls, sums: dict[str, float]) -> Counters:
        kinds = sorted(k for k in sums if k.startswith(_TERMINAL + ":"))
        terminal = {k.partition(":")[2]: int(sums[k]) for k in kinds}
        accepted, aborts = int(sums.get(_ACCEPTED, 0.0)), int(sums.get(_ABORTS, 0.0))
        return cls(accepted, terminal, aborts, int(sums.get(ENGINE_REQUESTS, 0.0)))

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

    @property
    def settled(self) -> bool:
        """Every accepted prompt counted out, and the engine holding nothing."""
        return self.accepted == self.terminal_total and self.engine_requests == 0


class Watch:
    """The gateway while the soak runs: `/metrics` (the engine's requests) and the process's
    resident memory with the count of requests `done()` when it was read."""

    def __init__(
        self, session: aiohttp.ClientSession, url: str, pid: int | None, done: Callable[[], int]
    ) -> None:
        self._session, self._url, self._done = session, url + "/metrics", done
        self._process = None if pid is None else psutil.Process(pid)
        self.scrapes: list[Scrape] = []
        self.rss: list[tuple[int, int]] = []  # (requests done, RSS bytes)

    async def run(self, stop: asyncio.Event, scrape_s: float, rss_s: float) -> None:
        """Each read at its interval until `stop`."""
        reads = [(self._scrape, scrape_s)] + ([(self._read_rss, rss_s)] if self._process else [])
        await asyncio.gather(*(_every(read, interval, stop) for read, interval in reads))

    async def _scrape(self) -> None:
        sent = perf_counter()
        with suppress(aiohttp.ClientError, ValueError):
            async with self._session.get(self._url) as r:
                text = await r.text()
            answered = perf_counter()
            requests = Counters.of(metric_sums(text)).engine_requests
            self.scrapes.append(Scrape(sent, answered, requests))

    async def _read_rss(self) -> None:
        if self._process is not None:
            self.rss.append((self._done(), int(self._process.memory_info().rss)))

    def rss_mb(self, low: int, high: int) -> float | None:
        """The mean RSS of the samples read while `low` <= requests done < `high`, in MB."""
        chosen = [rss for done, rss in self.rss if low <= done < high]
        return round(sum(chosen) / len(chosen) / _MB, 1) if chosen else None


async def _every(
    read: Callable[[], Awaitable[None]], interval_s: float, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        await read()
        with suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)


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


class Clients(msgspec.Struct, kw_only=True):
    """What the clients counted."""

    requests: int
    prompts: int
    by_key: dict[str, int]
    by_protocol: dict[str, int]
    terminals: dict[str, int]  # by kind, over every prompt whose client stayed
    left: int
    left_prompts: int
    invalid: int
    invalid_refused: int  # with a 4xx or an in-band error naming the field
    status_5xx: int
    cut: int  # answers that ended without a terminal
    duplicated: int  # prompts with more than one terminal
    unexpected: int  # valid prompts of the main key that did not finish, or any error
    first_unexpected: str | None


class Figures(msgspec.Struct, kw_only=True):
    ttft_p50_ms: dict[str, float | None]  # the main key's streamed requests, by phase
    ttft_count: dict[str, int]
    limited_sent: int
    limited_finished: int
    limited_rate_limited: int
    scrapes: int
    unexplained_scrapes: int
    worst_unexplained: str | None
    # While the engine held requests: clients present minus its requests (what a request
    # left behind could hide under), median and least.
    margin_p50: float | None
    margin_min: int | None
    engine_idle_after_s: float | None  # from the last client's end to an idle engine
    rss_first_mb: float | None
    rss_last_mb: float | None
    rss_samples: int
    # The gateway process's own CPU while the plan ran (cpu.py), per token of its answers.
    frontend_cpu_ms_per_token: float | None = None


class SoakReport(msgspec.Struct, kw_only=True):
    command: str
    started_at: str
    duration_s: float
    measured_s: float
    quick: bool
    machine: Machine
    options: dict[str, object]
    clients: Clients
    server: Counters  # the measured requests' counters (after minus before)
    settle_s: float  # from the last client's end until accepted == terminal, engine idle
    figures: Figures
    goals: list[Goal]
    amplification: Amplification | None = None


def count_clients(outcomes: Sequence[Outcome]) -> Clients:
    stayed = [o for o in outcomes if not o.left]
    terminals = Counter(kind for o in stayed for kind in o.terminals)
    unexpected = [o for o in stayed if _unexpected(o)]
    invalid = [o for o in outcomes if o.invalid and not o.left]
    return Clients(
        requests=len(outcomes),
        prompts=sum(o.prompts for o in outcomes),
        by_key=dict(Counter(o.key for o in outcomes)),
        by_protocol=dict(sorted(Counter(o.protocol for o in outcomes).items())),
        terminals=dict(sorted(terminals.items())),
        left=sum(o.left for o in outcomes),
        left_prompts=sum(o.prompts for o in outcomes if o.left),
        invalid=len(invalid),
        invalid_refused=sum(_refused(o) and o.named_field for o in invalid),
        status_5xx=sum(o.status is not None and o.status >= 500 for o in outcomes),
        cut=sum(o.cut for o in stayed),
        duplicated=sum(len(o.terminals) > o.prompts for o in stayed),
        unexpected=len(unexpected),
        first_unexpected=_describe(unexpected[0]) if unexpected else None,
    )


def _unexpected(o: Outcome) -> bool:
    if ERROR in o.terminals or o.cut or (o.status or 0) >= 500:
        return True
    if o.invalid:
        return not _refused(o)
    allowed = {FINISHED, RATE_LIMITED} if o.key == "limited" else {FINISHED}
    return not set(o.terminals) <= allowed


def _refused(o: Outcome) -> bool:
    return len(o.terminals) == o.prompts and set(o.terminals) == {REFUSED}


def _describe(o: Outcome) -> str:
    what = "invalid " if o.invalid else ""
    return f"{what}{o.protocol} ({o.key} key): {o.terminals or 'no terminal'}, {o.message}"


def ttft_by_phase(outcomes: Sequence[Outcome]) -> tuple[dict[str, float | None], dict[str, int]]:
    """The main key's streamed, finished requests: TTFT p50 (ms) with and without the limited
    key sending."""
    p50: dict[str, float | None] = {}
    counts: dict[str, int] = {}
    for phase in (BASELINE, CONTENDED):
        ttft = [
            t
            for o in outcomes
            if (t := o.ttft_s) is not None
            and o.phase == phase
            and o.key == "main"
            and o.streamed
            and not o.left
            and not o.invalid
        ]
        p50[phase] = ms_at(ttft, 50)
        counts[phase] = len(ttft)
    return p50, counts


def figures(
    outcomes: Sequence[Outcome], watch: Watch, began: float, last_end: float, options: Any
) -> Figures:
    """The figures of the plan's `outcomes` (sent from `began` to `last_end`) and what `watch`
    read meanwhile; `options`: the soak's (its grace and RSS window)."""
    grace = options.grace_s
    ends = [o.end or o.sent if o.left_at is None else o.left_at + grace for o in outcomes]
    presences = [Presence(o.sent, end, o.prompts) for o, end in zip(outcomes, ends, strict=True)]
    margin = margins(watch.scrapes, presences)
    found = [s for s, m in zip(watch.scrapes, margin, strict=True) if m < 0]
    worst = max(found, key=lambda s: s.engine_requests, default=None)
    busy = [m for s, m in zip(watch.scrapes, margin, strict=True) if s.engine_requests]
    p50, counts = ttft_by_phase(outcomes)
    limited = [o for o in outcomes if o.key == "limited"]
    total = len(outcomes)
    window = min(options.rss_window, max(1, total // 2))
    return Figures(
        ttft_p50_ms=p50,
        ttft_count=counts,
        limited_sent=len(limited),
        limited_finished=sum(o.terminals.count(FINISHED) for o in limited),
        limited_rate_limited=sum(o.terminals.count(RATE_LIMITED) for o in limited),
        scrapes=len(watch.scrapes),
        unexplained_scrapes=len(found),
        worst_unexplained=None
        if worst is None
        else f"{worst.engine_requests} engine requests at {worst.sent - began:.1f} s",
        margin_p50=percentile([float(m) for m in busy], 50),
        margin_min=min(busy, default=None),
        engine_idle_after_s=_idle_after(watch.scrapes, last_end),
        rss_first_mb=watch.rss_mb(0, window),
        rss_last_mb=watch.rss_mb(total - window, total + 1),
        rss_samples=len(watch.rss),
    )


def _idle_after(scrapes: Sequence[Scrape], last_end: float) -> float | None:
    """From the last client's end to the first scrape sent after it that found the engine
    idle, provided none after that found it busy again."""
    after = [s for s in scrapes if s.sent >= last_end]
    idle = next((i for i, s in enumerate(after) if s.engine_requests == 0), None)
    if idle is None or any(s.engine_requests for s in after[idle:]):
        return None
    return round(max(0.0, after[idle].answered - last_end), 3)


def evaluate(
    report_clients: Clients,
    server: Counters,
    figures: Figures,
    amplification: Amplification | None = None,
    quick: bool = False,
) -> list[Goal]:
    c, f = report_clients, figures
    accepted_low = sum(c.terminals.get(k, 0) for k in (FINISHED, RATE_LIMITED, ERROR))
    accepted_high = accepted_low + c.terminals.get(REFUSED, 0) + c.left_prompts
    finished = server.terminal.get(FINISHED, 0)
    client_finished = c.terminals.get(FINISHED, 0)
    goals = [
        Goal(
            "No server error",
            "zero 5xx and zero in-band server errors, cut answers or unexpected outcomes",
            f"{c.status_5xx} 5xx, {c.terminals.get(ERROR, 0)} errors, {c.cut} cut, "
            f"{c.unexpected} unexpected"
            + (f" (first: {c.first_unexpected})" if c.first_unexpected else ""),
            c.status_5xx == 0 and c.unexpected == 0 and c.cut == 0,
        ),
        Goal(
            "One terminal per prompt, at the clients",
            "every prompt whose client stayed got exactly one terminal; invalid input refused "
            "naming the field",
            f"{c.prompts - c.left_prompts} prompts stayed, {sum(c.terminals.values())} "
            f"terminals, {c.duplicated} duplicated; {c.invalid_refused} of {c.invalid} invalid "
            "refused naming the field",
            c.duplicated == 0 and c.cut == 0 and c.invalid_refused == c.invalid,
        ),
        Goal(
            "One terminal per prompt, in /metrics",
            "gateway_prompts_accepted_total = sum of gateway_terminal_events_total; the "
            "clients' finished and accepted prompts within what leaving clients allow",
            f"accepted {server.accepted}, terminal {server.terminal_total} "
            f"({_counts(server.terminal)}); clients: {client_finished} finished, "
            f"accepted between {accepted_low} and {accepted_high}",
            server.accepted == server.terminal_total
            and accepted_low <= server.accepted <= accepted_high
            and client_finished <= finished <= client_finished + c.left_prompts,
        ),
        Goal(
            "Nothing outlives its client",
            "no scrape of gateway_engine_requests above the prompts of clients waiting or gone "
            "less than 1 s before; the engine idle within 1 s of the last client",
            f"{f.unexplained_scrapes} of {f.scrapes} scrapes above"
            + (f" (worst: {f.worst_unexplained})" if f.worst_unexplained else "")
            + f" (margin while busy: median {f.margin_p50}, least {f.margin_min})"
            + f"; {server.engine_aborts} engine aborts for {c.left} clients that left; idle "
            + (f"{f.engine_idle_after_s:.2f} s" if f.engine_idle_after_s is not None else "never")
            + " after the last client",
            f.unexplained_scrapes == 0
            and f.engine_idle_after_s is not None
            and f.engine_idle_after_s <= 1.0,
        ),
        _ttft_goal(f),
        _rss_goal(f),
    ]
    return goals + amplification_goals(amplification, quick)


def _counts(counts: dict[str, int]) -> str:
    """Each name's count, but none of 0."""
    return ", ".join(f"{name} {n}" for name, n in counts.items() if n)


def _ttft_goal(f: Figures) -> Goal:
    base, busy = f.ttft_p50_ms.get(BASELINE), f.ttft_p50_ms.get(CONTENDED)
    measured = (
        f"main key TTFT p50 {busy} ms while the limited key sent ({f.ttft_count[CONTENDED]} "
        f"requests) vs {base} ms otherwise ({f.ttft_count[BASELINE]}); the limited key: "
        f"{f.limited_sent} sent, {f.limited_finished} finished, {f.limited_rate_limited} "
        "rate limited"
    )
    passed = None if base is None or busy is None else busy <= base * TTFT_RATIO_GOAL
    if base and busy:
        measured += f"; ratio {busy / base:.2f}"
    requirement = (
        f"the other key's TTFT p50 at most {TTFT_RATIO_GOAL} x its own without the limited key"
    )
    return Goal("The other key unaffected", requirement, measured, passed)


def _rss_goal(f: Figures) -> Goal:
    first, last = f.rss_first_mb, f.rss_last_mb
    measured = f"first {first} MB, last {last} MB ({f.rss_samples} samples)"
    passed = None
    if first and last:
        measured += f", {100 * (last / first - 1):+.1f} %"
        passed = abs(last / first - 1) <= RSS_GOAL
    return Goal(
        "Memory flat",
        f"the gateway process's RSS over the last requests within {RSS_GOAL:.0%} of the first's",
        measured,
        passed,
    )


def soak_report(report: SoakReport) -> Report:
    m, c, s, f = report.machine, report.clients, report.server, report.figures
    cpu = "-" if f.frontend_cpu_ms_per_token is None else f"{f.frontend_cpu_ms_per_token} ms"
    intro = [
        f"- Started {report.started_at}, {report.duration_s:.0f} s in all, "
        f"{report.measured_s:.0f} s measured",
        f"- CPU: {m.cpu}, {m.logical_cores} logical cores; load average {m.load_start} at the "
        f"start, {m.load_end} at the end (the machine is shared: other work ran meanwhile)",
        f"- Requests: {c.requests} ({_counts(c.by_key)}), {c.prompts} prompts; "
        f"{c.left} clients left mid-request, {c.invalid} invalid",
        f"- By protocol: {_counts(c.by_protocol)}",
        f"- Terminals at the clients: {_counts(c.terminals)}",
        f"- /metrics: {s.accepted} accepted, {s.terminal_total} terminal ({_counts(s.terminal)}), "
        f"{s.engine_aborts} engine aborts; settled {report.settle_s:.2f} s after the last client",
        f"- Frontend CPU (the gateway process's own, cpu.py) per token answered: {cpu}",
    ]
    title = "llm-gateway bench soak" + (" (quick mode)" if report.quick else "")
    return Report(title, report.command, m, [Section(goals=report.goals)], intro)
