"""The soak's figures from its outcomes and scrapes, its goals, and its Markdown report."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import msgspec

from gateway_bench.machine import Machine
from gateway_bench.metrics import ERROR, FINISHED, RATE_LIMITED, REFUSED, percentile
from gateway_bench.report import Goal, Report, Section
from gateway_bench.soak_amplification import Amplification, ConstraintLoad
from gateway_bench.soak_run import BASELINE, BY_NAME, CONTENDED, Outcome
from gateway_bench.soak_watch import Counters, Scrape

TTFT_RATIO_GOAL = 1.25  # the main key's TTFT p50 while the limited key sends, over without
RSS_GOAL = 0.05
AMPLIFICATION_GOAL = 2.0  # another key's TTFT p50 under the largest asks, over idle (issue 31)
_MB = 1 << 20


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
            and BY_NAME[o.protocol].streamed
            and not o.left
            and not o.invalid
        ]
        value = percentile(ttft, 50)
        p50[phase] = None if value is None else round(value * 1000, 1)
        counts[phase] = len(ttft)
    return p50, counts


def describe_scrape(scrape: Scrape, began: float) -> str:
    return f"{scrape.engine_requests} engine requests at {scrape.sent - began:.1f} s"


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
            f"({_kinds(server.terminal)}); clients: {client_finished} finished, "
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
    if amplification is not None:
        goals.append(amplification_goal(amplification, quick))
        if amplification.constraints is not None:
            goals.append(constraint_goal(amplification, amplification.constraints, quick))
    return goals


def _kinds(terminal: dict[str, int]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in terminal.items() if n)


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
        f"- /metrics: {s.accepted} accepted, {s.terminal_total} terminal ({_kinds(s.terminal)}), "
        f"{s.engine_aborts} engine aborts; settled {report.settle_s:.2f} s after the last client",
        f"- Frontend CPU (the gateway process's own, cpu.py) per token answered: {cpu}",
    ]
    title = "llm-gateway bench soak" + (" (quick mode)" if report.quick else "")
    return Report(title, report.command, m, [Section(goals=report.goals)], intro)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in counts.items())
