"""`llm-gateway bench constrained`: what an output constraint costs (issue 32; docs/BENCHMARKS.md,
"Output constraints"). `measure_variants` and `variants_markdown` are also the adapters
scenario's."""

from __future__ import annotations

import asyncio
import statistics
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from time import perf_counter
from typing import Any

import aiohttp
import msgspec

from gateway_bench import machine, targets
from gateway_bench.options import Options, Positive, Scenario
from gateway_bench.results import Machine, write_report
from gateway_bench.worker import pooled_connector

_MIN_CHARS = 400  # more characters than `output_tokens` tokens spell: no answer completes
PROMPT = "Write a long story about a lighthouse keeper and the sea."
_LONG = True  # `min_tokens` set to `output_tokens`: the answer cannot end sooner


def _json_schema(story: dict[str, Any]) -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {"title": {"type": "string"}, "story": story},
        "required": ["title", "story"],
    }
    return {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "story", "schema": schema},
        }
    }


_TOOL = {
    "type": "function",
    "function": {
        "name": "record_answer",
        "description": "Record the answer",
        "parameters": {
            "type": "object",
            "properties": {
                "answer": {"type": "string", "maxLength": 200},
                "confidence": {"type": "number"},
            },
            "required": ["answer", "confidence"],
            "additionalProperties": False,
        },
    },
}
VARIANTS: dict[str, dict[str, Any]] = {
    "unconstrained": {"ignore_eos": True},
    "json_schema": _json_schema({"type": "string"}),
    "regex": {"structured_outputs": {"regex": "[A-Za-z ,.]+"}, "min_tokens": _LONG},
    "json_schema_counted": _json_schema({"type": "string", "minLength": _MIN_CHARS}),
    "regex_counted": {"structured_outputs": {"regex": f"[A-Za-z ,.]{{{_MIN_CHARS},}}"}},
    # A forced tool call: its arguments held to the function's parameters (tool calls: the
    # gateway's grammar of the tools' schema, docs/OPENAI.md); one call, as a small model
    # repeats calls until `max_tokens` when several are allowed.
    "required_tool": {"tools": [_TOOL], "tool_choice": "required", "parallel_tool_calls": False},
    "named_tool": {
        "tools": [_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "record_answer"}},
    },
}
GOAL_VARIANTS = ("json_schema", "regex", "required_tool")
BASELINE = "unconstrained"
GOAL_AT, GOAL_RATIO = 32, 0.8


class VariantOptions(Options, frozen=True, kw_only=True):
    """What measuring variants side by side asks (this scenario's, the adapters')."""

    concurrency: list[Positive] = msgspec.field(default_factory=lambda: [1, 32])
    rounds: Positive = 1  # requests per client, back to back
    # Every variant measured this many times in turn, each ratio taken within its repeat (the
    # machine's load drifts between repeats); the report gives the medians.
    repeats: Positive = 3
    output_tokens: Positive = 64


class ConstrainedOptions(VariantOptions, frozen=True, kw_only=True):
    variants: list[str] = msgspec.field(default_factory=lambda: list(VARIANTS))
    out: str = "docs/bench/constrained"


QUICK = ConstrainedOptions(concurrency=[1, 2], rounds=1, repeats=1, output_tokens=4, quick=True)


class Row(msgspec.Struct):
    concurrency: int
    variant: str
    tok_s: float
    tokens: int
    failed: int
    ratio: float | None = None  # to the variant it is compared with, in its repeat (the median)


class ConstrainedReport(msgspec.Struct, kw_only=True):
    command: str
    machine: Machine
    options: ConstrainedOptions
    rows: list[Row]


def _check(options: ConstrainedOptions) -> str | None:
    unknown = [v for v in options.variants if v not in VARIANTS]
    if unknown or BASELINE not in options.variants:
        return f"--variants: from {', '.join(VARIANTS)}, {BASELINE} among them"
    return None


def body(variant: str, options: ConstrainedOptions, model: str) -> dict[str, Any]:
    request = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": options.output_tokens,
        "temperature": 0,
        **VARIANTS[variant],
    }
    if request.get("min_tokens") is _LONG:
        request["min_tokens"] = options.output_tokens
    return request


class _Usage(msgspec.Struct):
    completion_tokens: int


class _Answer(msgspec.Struct):
    usage: _Usage


async def _one(session: aiohttp.ClientSession, url: str, request: dict[str, Any]) -> int:
    async with session.post(url + "/v1/chat/completions", json=request) as response:
        data = await response.read()
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {data[:300]!r}")
    return msgspec.json.decode(data, type=_Answer).usage.completion_tokens


async def measure(
    session: aiohttp.ClientSession, url: str, request: dict[str, Any], clients: int, rounds: int
) -> tuple[float, int, int]:
    """tok/s, tokens and failures of `clients` clients sending `rounds` requests each."""
    failed = 0

    async def client() -> int:
        nonlocal failed
        tokens = 0
        for _ in range(rounds):
            try:
                tokens += await _one(session, url, request)
            except (RuntimeError, aiohttp.ClientError) as e:
                failed += 1
                print(f"bench: a request failed: {e}", file=sys.stderr)
        return tokens

    began = perf_counter()
    counts = await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = perf_counter() - began
    return round(sum(counts) / elapsed, 1), sum(counts), failed


async def measure_variants(
    options: VariantOptions,
    variants: Sequence[str],
    request: Callable[[str], tuple[str, dict[str, Any]]],
    ratio_to: Callable[[str], str | None],
) -> list[Row]:
    """Each variant's (`request(variant)`: its URL and body) Row at each concurrency: its
    median tok/s over the repeats, and its median ratio to `ratio_to(variant)` within each."""
    timeout = aiohttp.ClientTimeout(total=None)
    rows: list[Row] = []
    async with aiohttp.ClientSession(timeout=timeout, connector=pooled_connector()) as session:
        for variant in variants:  # warm: each grammar compiled once, each adapter loaded
            await measure(session, *request(variant), 1, 1)
        for clients in options.concurrency:
            runs: dict[str, list[tuple[float, int, int]]] = {v: [] for v in variants}
            ratios: dict[str, list[float]] = {v: [] for v in variants}
            for _ in range(options.repeats):  # each repeat every variant, one after the other
                for variant in variants:
                    run = await measure(session, *request(variant), clients, options.rounds)
                    print(f"bench: {clients} clients, {variant}: {run[0]} tok/s", file=sys.stderr)
                    runs[variant].append(run)
                for variant in variants:
                    other = ratio_to(variant)
                    if other is not None and runs[other][-1][0]:
                        ratios[variant].append(runs[variant][-1][0] / runs[other][-1][0])
            for variant in variants:
                measured, ratio = runs[variant], ratios[variant]
                rows.append(
                    Row(
                        clients,
                        variant,
                        round(statistics.median(r[0] for r in measured), 1),
                        sum(r[1] for r in measured),
                        sum(r[2] for r in measured),
                        round(statistics.median(ratio), 3) if ratio else None,
                    )
                )
    return rows


StartGateway = Callable[[], AbstractAsyncContextManager[targets.Endpoint]]


async def run_constrained(
    options: ConstrainedOptions, command: str, start: StartGateway | None = None
) -> tuple[ConstrainedReport, Path]:
    """Every variant at every concurrency, on the gateway `start()` gives (by default one
    started for the run)."""
    out = Path(options.out)
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    targets.raise_file_limit(4 * max(options.concurrency) + 256)
    host = await asyncio.to_thread(machine.describe, options.dtype)
    async with start() if start else targets.started_gateway(options, out) as endpoint:
        rows = await measure_variants(
            options,
            options.variants,
            lambda variant: (endpoint.url, body(variant, options, endpoint.model)),
            lambda _: BASELINE,
        )
    host.load_end = machine.load()
    report = ConstrainedReport(command=command, machine=host, options=options, rows=rows)
    await asyncio.to_thread(write_report, report, markdown(report), out)
    return report, out


def variants_markdown(
    title: str,
    command: str,
    host: Machine,
    rows: list[Row],
    header: str,
    suffix: Callable[[str], str] = lambda _: "",
    goal: str = "",
) -> str:
    """The rows as a table: the ratio column's `header`, its cells `Nx` and the variant's
    `suffix` (what the ratio is to); `goal`, the verdict, below."""
    lines = [f"# {title}", "", f"`{command}`", "", host.summary, ""]
    lines += [f"| concurrency | variant | tok/s | {header} | tokens | failed |", "|---" * 6 + "|"]
    for row in rows:
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}x{suffix(row.variant)}"
        cells = [row.concurrency, row.variant, row.tok_s, ratio, row.tokens, row.failed]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join([*lines, *(["", goal] if goal else [])]) + "\n"


def markdown(report: ConstrainedReport) -> str:
    goal = [r for r in report.rows if r.concurrency == GOAL_AT and r.variant in GOAL_VARIANTS]
    met = all(r.ratio is not None and r.ratio >= GOAL_RATIO for r in goal)
    verdict = f"Goal: >= {GOAL_RATIO}x at {GOAL_AT} ({', '.join(GOAL_VARIANTS)}): "
    return variants_markdown(
        "Output constraints: tok/s against the same request unconstrained",
        report.command,
        report.machine,
        report.rows,
        "x unconstrained",
        goal=verdict + ("met." if met else "not met.") if goal else "",
    )


async def _run(options: ConstrainedOptions, command: str) -> tuple[str, Path, bool]:
    report, out = await run_constrained(options, command)
    return markdown(report), out, True


SCENARIO = Scenario(
    "constrained",
    "What an output constraint costs (issue 32): tok/s against the same request unconstrained.",
    ConstrainedOptions,
    QUICK,
    _run,
    check=_check,
)


def parse(argv: Sequence[str]) -> ConstrainedOptions:
    return SCENARIO.parse(argv)
