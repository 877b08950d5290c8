"""Variants of one chat request measured side by side (the constrained and adapters
scenarios): each variant's tok/s at each concurrency, its ratio to the variant it is compared
with, and their report."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import msgspec

from gateway_bench import clients
from gateway_bench.machine import Machine
from gateway_bench.options import Options, Positive
from gateway_bench.report import Goal, Report, Section, Table
from gateway_bench.results import StepResult
from gateway_bench.runner import Client, repeated, run_step
from gateway_bench.targets import say
from gateway_bench.worker import Context
from gateway_bench.workload import Request

PROMPT = "Write a long story about a lighthouse keeper and the sea."
CHAT = Client("chat", "POST /v1/chat/completions", clients.chat_whole, "gateway", "reported")


class VariantOptions(Options, frozen=True, kw_only=True):
    concurrency: list[Positive] = msgspec.field(default_factory=lambda: [1, 32])
    rounds: Positive = 1  # requests per client, back to back
    # Every variant measured this many times in turn, each ratio taken within its repeat (the
    # machine's load drifts between repeats): the report gives the medians.
    repeats: Positive = 3
    output_tokens: Positive = 64


class Row(msgspec.Struct):
    concurrency: int
    variant: str
    tok_s: float
    tokens: int
    failed: int
    ratio: float | None = None  # to the variant it is compared with, in its repeat (the median)
    frontend_cpu_ms_per_token: float | None = None  # the server's own (cpu.py), the median


# A variant's server (its context) and what its request adds to the chat body.
Target = Callable[[str], tuple[Context, dict[str, Any]]]


async def measure_variants(
    options: VariantOptions,
    variants: Sequence[str],
    target: Target,
    ratio_to: Callable[[str], str | None],
) -> list[Row]:
    """Each variant's Row at each concurrency: its median tok/s over the repeats, and its
    median ratio to `ratio_to(variant)` within each repeat."""

    def requests(variant: str, count: int) -> list[Request]:
        body = target(variant)[1]
        return [Request(variant, PROMPT, options.output_tokens, 0, body)] * count

    for variant in variants:  # warm: each grammar compiled once, each adapter loaded
        await run_step(CHAT, target(variant)[0], requests(variant, 1), 1)

    async def measure(variant: str, concurrency: int) -> StepResult:
        context, count = target(variant)[0], concurrency * options.rounds
        name = f"{variant.replace(' ', '').replace(',', '-')}-c{concurrency}"
        step = await run_step(CHAT, context, requests(variant, count), concurrency, profile=name)
        figures = step.figures(concurrency)
        say(f"{concurrency} clients, {variant}: {figures.tokens_per_s} tok/s")
        if figures.first_error:
            say(f"{figures.errors} requests failed, the first: {figures.first_error}")
        return figures

    rows: list[Row] = []
    for concurrency in options.concurrency:
        each = partial(measure, concurrency=concurrency)
        for variant, (steps, ratio) in (
            await repeated(variants, options.repeats, each, ratio_to)
        ).items():
            cpu = [s.frontend_cpu_ms_per_token for s in steps if s.frontend_cpu_ms_per_token]
            tok_s = round(statistics.median(s.tokens_per_s for s in steps), 1)
            tokens, failed = sum(s.tokens for s in steps), sum(s.errors for s in steps)
            median_cpu = round(statistics.median(cpu), 3) if cpu else None
            rows.append(Row(concurrency, variant, tok_s, tokens, failed, ratio, median_cpu))
    return rows


def variants_report(
    title: str,
    command: str,
    host: Machine,
    rows: list[Row],
    header: str,
    goals: list[Goal],
    suffix: Callable[[str], str] = lambda _: "",
) -> Report:
    """The rows as a table: the ratio column's `header`, its cells `Nx` and the variant's
    `suffix` (what the ratio is to); the goals below."""
    columns = ["concurrency", "variant", "tok/s", header, "tokens", "failed"]
    table = Table([*columns, "frontend CPU ms/token"])
    for row in rows:
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}x{suffix(row.variant)}"
        cpu = "-" if row.frontend_cpu_ms_per_token is None else row.frontend_cpu_ms_per_token
        table.rows.append([row.concurrency, row.variant, row.tok_s, ratio, row.tokens])
        table.rows[-1] += [row.failed, cpu]
    return Report(title, command, host, [Section(table=table, goals=goals)])


def ratio_goal(name: str, rows: list[Row], at: int, least: float) -> Goal:
    """Every row of `rows` at concurrency `at` with a ratio of at least `least`."""
    chosen = [r for r in rows if r.concurrency == at]
    passed = all(r.ratio is not None and r.ratio >= least for r in chosen) if chosen else None
    return Goal(name, "", "", passed)
