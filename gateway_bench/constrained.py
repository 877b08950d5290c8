"""`llm-gateway bench --scenario constrained`: what an output constraint costs (issue 32).

One gateway (its own server and engine, started for the run) answers the same chat request on
`/v1/chat/completions` (not streamed: the answer's usage counts its tokens) in each variant:
unconstrained (its end of sequence ignored: every answer is `output_tokens` long), held to a
JSON schema (`response_format` json_schema: a title and a story, strings of any length; the
answer ends where the model closes the object, its tokens counted), held to a regular
expression (vLLM's `structured_outputs`: `[A-Za-z ,.]+` with `min_tokens` at `output_tokens`,
so the model cannot end it sooner), and the same two with counted repetitions
(`minLength`, `{n,}`): xgrammar checks a counted repetition's tokens at every step, which costs
far more per token than an open one; and a forced tool call (`tools` with `tool_choice`
`required`, and a named function), its arguments held to the function's schema.

At each concurrency, `concurrency` clients send `rounds` requests back to back, each variant
in turn, `repeats` times (one request of each first, alone: a grammar is compiled once, then
cached); the report gives each variant's median tok/s and its median ratio to the
unconstrained run of the same repeat (the machine's load drifts between repeats), side by
side; `tokens` are all its answers' tokens. The goal (docs/BENCHMARKS.md): >= 0.8x at 32,
for `json_schema`, `regex` and `required_tool`.

A variant is one entry of `VARIANTS`: the body fields it adds to the request.
"""

from __future__ import annotations

import asyncio
import shlex
import statistics
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from time import perf_counter
from typing import Any

import aiohttp
import msgspec

from gateway.config.settings import EngineSettings, served_model_name
from gateway_bench import machine, targets
from gateway_bench.mixed import default_model
from gateway_bench.results import Machine, write_report
from gateway_bench.scenario_options import TargetOptions, parse_options
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


class ConstrainedOptions(TargetOptions, kw_only=True):
    concurrency: list[int] = msgspec.field(default_factory=lambda: [1, 32])
    rounds: int = 1  # requests per client, back to back
    # Every variant measured this many times in turn, each ratio taken within its repeat (the
    # machine's load drifts between repeats); the report gives the medians.
    repeats: int = 3
    output_tokens: int = 64
    variants: list[str] = msgspec.field(default_factory=lambda: list(VARIANTS))
    out: str = "docs/bench/constrained"


QUICK = {"concurrency": [1, 2], "rounds": 1, "repeats": 1, "output_tokens": 4}


class Row(msgspec.Struct):
    concurrency: int
    variant: str
    tok_s: float
    tokens: int
    failed: int
    ratio: float | None = None  # to the unconstrained run of its repeat (the median)


class ConstrainedReport(msgspec.Struct, kw_only=True):
    command: str
    machine: Machine
    options: ConstrainedOptions
    rows: list[Row]


def parse(argv: Sequence[str]) -> ConstrainedOptions:
    options = parse_options("constrained", ConstrainedOptions, QUICK, argv)
    unknown = [v for v in options.variants if v not in VARIANTS]
    if unknown or BASELINE not in options.variants:
        raise SystemExit(f"--variants: from {', '.join(VARIANTS)}, {BASELINE} among them")
    return options


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
                print(f"constrained: a request failed: {e}", file=sys.stderr)
        return tokens

    began = perf_counter()
    counts = await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = perf_counter() - began
    return round(sum(counts) / elapsed, 1), sum(counts), failed


async def measure_all(options: ConstrainedOptions, url: str, model: str) -> list[Row]:
    timeout = aiohttp.ClientTimeout(total=None)
    connector = pooled_connector()
    rows: list[Row] = []
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        for variant in options.variants:  # warm: each grammar compiled once, before timing
            await _one(session, url, body(variant, options, model))
        for clients in options.concurrency:
            runs: dict[str, list[tuple[float, int, int]]] = {v: [] for v in options.variants}
            ratios: dict[str, list[float]] = {v: [] for v in options.variants}
            for _ in range(options.repeats):  # each repeat every variant, one after the other
                for variant in options.variants:
                    request = body(variant, options, model)
                    run = await measure(session, url, request, clients, options.rounds)
                    print(
                        f"constrained: {clients} clients, {variant}: {run[0]} tok/s",
                        file=sys.stderr,
                    )
                    runs[variant].append(run)
                base = runs[BASELINE][-1][0]
                for variant in options.variants:
                    ratios[variant].append(runs[variant][-1][0] / base if base else 0.0)
            for variant in options.variants:
                measured = runs[variant]
                rows.append(
                    Row(
                        clients,
                        variant,
                        round(statistics.median(r[0] for r in measured), 1),
                        sum(r[1] for r in measured),
                        sum(r[2] for r in measured),
                        round(statistics.median(ratios[variant]), 3),
                    )
                )
    return rows


def _engine(options: ConstrainedOptions, dtype: str) -> EngineSettings:
    chosen = {"MODEL": options.model, "DTYPE": dtype, "ENFORCE_EAGER": options.enforce_eager}
    return msgspec.convert({**chosen, "SEED": options.seed}, EngineSettings)  # upper: its names


@asynccontextmanager
async def started_gateway(
    options: ConstrainedOptions, out: Path
) -> AsyncIterator[targets.Endpoint]:
    """A gateway and its engine, for this run, stopped after it."""
    model = options.model or await asyncio.to_thread(default_model)
    defaults = machine.cpu_defaults(options.dtype)
    settings = _engine(msgspec.structs.replace(options, model=model), defaults.dtype)
    port = targets.free_port()
    env = targets.gateway_environment(settings)
    command = targets.gateway_command(port)
    print(f"constrained: starting the gateway on port {port}", file=sys.stderr)
    log = out / "gateway.log"
    served = served_model_name(settings)
    async with targets.server(command, env, port, log, options.start_timeout, served) as endpoint:
        yield endpoint


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
    async with start() if start else started_gateway(options, out) as endpoint:
        rows = await measure_all(options, endpoint.url, endpoint.model)
    host.load_end = machine.load()
    report = ConstrainedReport(command=command, machine=host, options=options, rows=rows)
    await asyncio.to_thread(write_report, report, markdown(report), out)
    return report, out


def markdown(report: ConstrainedReport) -> str:
    lines = [
        "# Output constraints: tok/s against the same request unconstrained",
        "",
        f"`{report.command}`",
        "",
        report.machine.summary,
        "",
        "| concurrency | variant | tok/s | x unconstrained | tokens | failed |",
        "|---|---|---|---|---|---|",
    ]
    for row in report.rows:
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}x"
        lines.append(
            f"| {row.concurrency} | {row.variant} | {row.tok_s} | {ratio} | {row.tokens} "
            f"| {row.failed} |"
        )
    goal = [r for r in report.rows if r.concurrency == GOAL_AT and r.variant in GOAL_VARIANTS]
    if goal:
        met = all(r.ratio is not None and r.ratio >= GOAL_RATIO for r in goal)
        verdict = "met" if met else "not met"
        lines += [
            "",
            f"Goal: >= {GOAL_RATIO}x at {GOAL_AT} ({', '.join(GOAL_VARIANTS)}): {verdict}.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    options = parse(argv)
    command = shlex.join(["llm-gateway", "bench", *argv])
    report, out = asyncio.run(run_constrained(options, command))
    print(markdown(report))
    print(f"\nllm-gateway bench --scenario constrained: report written to {out}/", file=sys.stderr)
    return 0
