"""`llm-gateway bench constrained`: what an output constraint costs (issue 32; docs/BENCHMARKS.md,
"Output constraints"): each constrained chat request's tok/s against the same request
unconstrained (variants.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import msgspec

from gateway_bench import machine, targets
from gateway_bench.machine import Machine
from gateway_bench.options import Scenario, begin
from gateway_bench.report import Report, write
from gateway_bench.variants import (
    Row,
    VariantOptions,
    measure_variants,
    ratio_goal,
    variants_report,
)
from gateway_bench.worker import session

_MIN_CHARS = 400  # more characters than `output_tokens` tokens spell: no answer completes
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
# What each variant adds to the chat request (every one greedy, `output_tokens` at most).
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
    # The unconstrained request with the tool offered, the choice left to the model: `auto`,
    # held to the gateway's grammar of free text or the tools' calls (tool_grammars.py).
    "auto": {"ignore_eos": True, "tools": [_TOOL]},
}
GOAL_VARIANTS = ("json_schema", "regex", "required_tool")
BASELINE = "unconstrained"
GOAL_AT, GOAL_RATIO, AUTO_RATIO = 32, 0.8, 0.85


class ConstrainedOptions(VariantOptions, frozen=True, kw_only=True):
    variants: list[str] = msgspec.field(default_factory=lambda: list(VARIANTS))
    out: str = "docs/bench/constrained"


QUICK = ConstrainedOptions(concurrency=[1, 2], rounds=1, repeats=1, output_tokens=4, quick=True)


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


def body(variant: str, options: ConstrainedOptions) -> dict[str, Any]:
    """What `variant` adds to the chat request; vLLM's ignore_eos off but where it says."""
    added = {"ignore_eos": False, **VARIANTS[variant]}
    if added.get("min_tokens") is _LONG:
        added["min_tokens"] = options.output_tokens
    return added


StartGateway = Callable[[], AbstractAsyncContextManager[targets.Endpoint]]


async def run_constrained(
    options: ConstrainedOptions, command: str, start: StartGateway | None = None
) -> tuple[ConstrainedReport, Path]:
    """Every variant at every concurrency, on the gateway `start()` gives (by default one
    started for the run)."""
    out, host = await begin(options, 4 * max(options.concurrency) + 256)
    async with (
        session() as client_session,
        start() if start else targets.started_gateway(options, out) as endpoint,
    ):
        context = endpoint.context(client_session, options.profiles(out), endpoint.model)
        rows = await measure_variants(
            options, options.variants, lambda v: (context, body(v, options)), lambda _: BASELINE
        )
    host.load_end = machine.load()
    result = ConstrainedReport(command=command, machine=host, options=options, rows=rows)
    await asyncio.to_thread(write, result, report(result), out)
    return result, out


def report(result: ConstrainedReport) -> Report:
    return variants_report(
        "Output constraints: tok/s against the same request unconstrained",
        result.command,
        result.machine,
        result.rows,
        "x unconstrained",
        [
            ratio_goal(
                f"tok/s >= {GOAL_RATIO}x unconstrained at {GOAL_AT} ({', '.join(GOAL_VARIANTS)})",
                [r for r in result.rows if r.variant in GOAL_VARIANTS],
                GOAL_AT,
                GOAL_RATIO,
            ),
            ratio_goal(
                f"auto >= {AUTO_RATIO}x unconstrained tok/s at {GOAL_AT}",
                [r for r in result.rows if r.variant == "auto"],
                GOAL_AT,
                AUTO_RATIO,
            ),
        ],
    )


async def _run(options: ConstrainedOptions, command: str) -> tuple[str, Path, bool]:
    result, out = await run_constrained(options, command)
    return report(result).markdown(), out, True


SCENARIO = Scenario(
    "constrained",
    "What an output constraint costs (issue 32): tok/s against the same request unconstrained.",
    ConstrainedOptions,
    QUICK,
    _run,
    check=_check,
)
