"""`llm-gateway bench tracing`: what OpenTelemetry tracing costs (issue 61; docs/BENCHMARKS.md,
"Tracing"): two gateways on the same engine settings, started side by side for the run, one
with tracing off (no OTLP endpoint: nothing of OpenTelemetry imported) and one exporting every
request's trace over OTLP/HTTP to a receiver on loopback (this process's), measured in turn
within each repeat (variants.py): each one's tok/s and frontend CPU per token, the traced
one's ratio to the untraced one, and the CPU a traced request costs. With `--baseline` a third
gateway runs beside them from another checkout (the tree before tracing was built): the
untraced one's ratio to it is what tracing off costs."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec

from gateway_bench import machine, targets
from gateway_bench.machine import Machine
from gateway_bench.options import Positive, Scenario, begin
from gateway_bench.report import Goal, Report, Section, Table, write
from gateway_bench.variants import Row, VariantOptions, measure_variants, variants_report
from gateway_bench.worker import Context, session

OFF, ON, BEFORE = "tracing off", "tracing on", "before tracing"
GOAL_AT, GOAL_RATIO = 8, 0.95  # the traced gateway's tok/s at least this of the untraced's


class TracingOptions(VariantOptions, frozen=True, kw_only=True):
    concurrency: list[Positive] = msgspec.field(default_factory=lambda: [1, 8])
    out: str = "docs/bench/tracing"
    # a checkout of the gateway (a git worktree of a commit before tracing) run as a third
    # gateway, on this venv: `llm-gateway serve` imported from there
    baseline: str = ""


QUICK = TracingOptions(concurrency=[1, 2], rounds=1, repeats=1, output_tokens=4, quick=True)


class Exported(msgspec.Struct):
    """What the receiver took in: OTLP export requests and their bytes (protobuf)."""

    requests: int = 0
    bytes: int = 0


class Cost(msgspec.Struct):
    """At one concurrency: the traced gateway's frontend CPU per request beyond the untraced
    one's (ms/token difference x tokens per request)."""

    concurrency: int
    cpu_ms_per_request: float | None


class TracingReport(msgspec.Struct, kw_only=True):
    command: str
    machine: Machine
    options: TracingOptions
    rows: list[Row]
    costs: list[Cost]
    exported: Exported


@contextmanager
def receiver() -> Iterator[tuple[str, Exported]]:
    """An OTLP/HTTP traces receiver on loopback that keeps count and answers an empty
    ExportTraceServiceResponse (what a collector answers a whole success with)."""
    exported = Exported()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock:
                exported.requests += 1
                exported.bytes += len(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", exported
    finally:
        server.shutdown()
        server.server_close()


def costs(rows: list[Row], output_tokens: int) -> list[Cost]:
    each: list[Cost] = []
    for concurrency in sorted({r.concurrency for r in rows}):
        by = {r.variant: r for r in rows if r.concurrency == concurrency}
        off, on = by[OFF].frontend_cpu_ms_per_token, by[ON].frontend_cpu_ms_per_token
        extra = None if off is None or on is None else round((on - off) * output_tokens, 3)
        each.append(Cost(concurrency, extra))
    return each


def baseline_launch(options: TracingOptions, port: int) -> targets.Launch:
    """The gateway of the `baseline` checkout: its `gateway.cli` first on the path."""
    launch = targets.gateway_launch(options, port)
    command = [sys.executable, "-m", "gateway.cli", *launch.command[1:]]
    path = os.pathsep.join(p for p in (options.baseline, os.environ.get("PYTHONPATH")) if p)
    return targets.Launch(command, {**launch.env, "PYTHONPATH": path}, launch.served)


def compared_to(variant: str, baseline: bool) -> str | None:
    if variant == ON:
        return OFF
    return BEFORE if variant == OFF and baseline else None


async def run_tracing(options: TracingOptions, command: str) -> tuple[TracingReport, Path]:
    out, host = await begin(options, 4 * max(options.concurrency) + 256)
    baseline = bool(options.baseline)
    variants = [BEFORE, OFF, ON] if baseline else [OFF, ON]
    with receiver() as (url, exported):
        traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_SERVICE_NAME": "llm-gateway-bench"}
        async with AsyncExitStack() as stack:
            client_session = await stack.enter_async_context(session())
            servers = {
                OFF: targets.started_gateway(options, out, "gateway-untraced"),
                ON: targets.started_gateway(options, out, "gateway-traced", traced),
            }
            if baseline:
                launch = lambda port: baseline_launch(options, port)  # noqa: E731
                servers[BEFORE] = targets.started(options, out, "gateway-before", launch)
            profiles = options.profiles(out)
            contexts: dict[str, Context] = {}
            for variant in variants:
                at = await stack.enter_async_context(servers[variant])
                contexts[variant] = at.context(client_session, profiles, at.model)
            rows = await measure_variants(
                options,
                variants,
                lambda v: (contexts[v], {"ignore_eos": True}),
                lambda v: compared_to(v, baseline),
            )
    host.load_end = machine.load()
    result = TracingReport(
        command=command,
        machine=host,
        options=options,
        rows=rows,
        costs=costs(rows, options.output_tokens),
        exported=exported,
    )
    await asyncio.to_thread(write, result, report(result), out)
    return result, out


def _goal(rows: list[Row], variant: str, name: str) -> Goal:
    chosen = [r for r in rows if r.concurrency == GOAL_AT and r.variant == variant]
    passed = all(r.ratio is not None and r.ratio >= GOAL_RATIO for r in chosen) if chosen else None
    return Goal(name, "", "", passed)


def report(result: TracingReport) -> Report:
    goals = [_goal(result.rows, ON, f"traced tok/s >= {GOAL_RATIO}x untraced at {GOAL_AT}")]
    column = "x untraced"
    if any(r.variant == BEFORE for r in result.rows):
        off = f"untraced tok/s >= {GOAL_RATIO}x the tree before tracing at {GOAL_AT}"
        goals.append(_goal(result.rows, OFF, off))
        column = "ratio (on: x off; off: x before tracing)"
    base = variants_report(
        "Tracing: tok/s and frontend CPU, traced against untraced",
        result.command,
        result.machine,
        result.rows,
        column,
        goals,
    )
    table = Table(["concurrency", "traced CPU ms per request beyond untraced"])
    table.rows = [
        [c.concurrency, "-" if c.cpu_ms_per_request is None else c.cpu_ms_per_request]
        for c in result.costs
    ]
    exported = result.exported
    text = [f"The receiver took {exported.requests} OTLP export requests, {exported.bytes} bytes."]
    base.sections.append(Section("Cost per traced request", text, table))
    return base


async def _run(options: TracingOptions, command: str) -> tuple[str, Path, bool]:
    result, out = await run_tracing(options, command)
    return report(result).markdown(), out, True


SCENARIO = Scenario(
    "tracing",
    "What OpenTelemetry tracing costs (issue 61): a traced gateway against an untraced one.",
    TracingOptions,
    QUICK,
    _run,
)
