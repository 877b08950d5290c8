"""The mixed scenario's options and `--quick` preset, its figures (per regime, target and chat
shape), the ratios between targets, issue 30's goals and the report."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

import msgspec

from gateway_bench import chart
from gateway_bench.machine import Machine
from gateway_bench.options import Options
from gateway_bench.report import Goal, Report, Section, Table, write

ShapeName = Literal["steady", "sporadic", "burst"]
Regime = Literal["saturation", "overload"]
TargetName = Literal["vllm-server", "gateway-fcfs", "gateway-priority"]
SHAPES, REGIMES, TARGETS = get_args(ShapeName), get_args(Regime), get_args(TargetName)


class MixedOptions(Options, frozen=True, kw_only=True):
    # The batch load: clients that send batch requests back to back.
    batch_clients: int = 64
    batch_tokens: int = 128  # a batch request's mean max_tokens
    # Each batch request's max_tokens is drawn (seeded) in batch_tokens x [1 - s, 1 + s]: the
    # clients drift apart instead of all finishing, and resending, in the same step.
    batch_tokens_spread: float = 0.5
    # Chats alone on the idle engine: the idle TTFT.
    idle_requests: int = 8
    # steady: a long chat every chat_interval_s, whether the previous one ended or not.
    chat_tokens: int = 64
    chat_interval_s: float = 0.5
    chat_requests: int = 40
    # sporadic and burst: short chats.
    short_chat_tokens: int = 8
    # sporadic: one chat at a time, the next after the previous one ended plus a gap drawn
    # (seeded) from an exponential of this mean, never below the floor.
    sporadic_chats: int = 20
    sporadic_gap_mean_s: float = 1.5
    sporadic_gap_min_s: float = 0.25
    # burst: burst_size chats at once, `bursts` times, burst_gap_s after each burst ended.
    burst_size: int = 20
    bursts: int = 3
    burst_gap_s: float = 5.0
    shapes: list[ShapeName] = msgspec.field(default_factory=lambda: list(SHAPES))
    prompt_words: int = 64
    overload_running: int = 32  # the engine's running limit in the overload regime
    bulk_max_running: str = "auto"  # the priority gateway's BULK_MAX_RUNNING
    interactive_step_tokens: str = "auto"  # the priority gateway's INTERACTIVE_STEP_TOKENS
    drain_timeout_s: float = 300.0  # after a shape, the longest wait for the engine to empty
    regimes: list[Regime] = msgspec.field(default_factory=lambda: list(REGIMES))
    targets: list[TargetName] = msgspec.field(default_factory=lambda: list(TARGETS))
    out: str = "docs/bench/mixed"


QUICK = MixedOptions(
    batch_clients=4,
    batch_tokens=16,
    idle_requests=2,
    chat_tokens=8,
    chat_interval_s=0.2,
    chat_requests=3,
    sporadic_chats=3,
    sporadic_gap_mean_s=0.2,
    sporadic_gap_min_s=0.05,
    burst_size=3,
    bursts=2,
    burst_gap_s=0.3,
    prompt_words=16,
    overload_running=2,
    enforce_eager=True,
    quick=True,
)


# Issue 30's goals, judged for the priority gateway at saturation, per shape.
TO_IDLE_P50 = 2.0  # chat TTFT p50 / the idle reference (the idle burst's for burst)
TO_VLLM_P50 = 0.5  # chat TTFT p50 / vLLM's server's
TO_IDLE_P99 = 5.0  # chat TTFT p99 / the idle reference's p50
BATCH_KEPT = {"sporadic": 0.9, "steady": 0.75}  # batch tok/s / the FCFS gateway's
PREEMPTIONS_PER_CHAT = 4.0


class ShapeResult(msgspec.Struct, kw_only=True):
    shape: str
    chats: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    batch_tok_s: float
    preemptions: int | None  # the engine's, from before the batch load to its drain
    preemptions_per_chat: float | None
    interactive_failed: int
    batch_failed: int
    series: list[tuple[float, float]]  # (seconds into the load, TTFT in seconds)
    # The server's own CPU during the batch load (cpu.py), per token of the batch and the chats.
    frontend_cpu_ms_per_token: float | None = None


class TargetResult(msgspec.Struct, kw_only=True):
    target: str
    idle_ttft_p50_ms: float | None  # one chat alone on the idle engine
    idle_burst_p50_ms: float | None  # a burst on the idle engine (None: no burst shape)
    shapes: list[ShapeResult]

    def shape(self, name: str) -> ShapeResult | None:
        return next((s for s in self.shapes if s.shape == name), None)

    def idle_for(self, shape: str) -> float | None:
        """The idle reference of a shape's chats: the idle burst's p50 for bursts."""
        return self.idle_burst_p50_ms if shape == "burst" else self.idle_ttft_p50_ms


class RegimeResult(msgspec.Struct):
    regime: str
    targets: list[TargetResult]

    def get(self, name: str) -> TargetResult | None:
        return next((t for t in self.targets if t.target == name), None)

    def shape(self, target: str, shape: str) -> ShapeResult | None:
        found = self.get(target)
        return None if found is None else found.shape(shape)

    def figure(self, target: str, shape: str, name: str) -> float | None:
        """`name` of `target`'s `shape` result, if measured."""
        found = self.shape(target, shape)
        return None if found is None else getattr(found, name)


class MixedReport(msgspec.Struct, kw_only=True):
    command: str
    machine: Machine
    options: MixedOptions
    regimes: list[RegimeResult]

    @property
    def shapes(self) -> list[str]:
        return list(self.options.shapes)


def ratio_of(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 2)


def _fmt(value: float | None, suffix: str = "") -> str:
    return "-" if value is None else f"{value:g}{suffix}"


def _within(value: float | None, limit: float, at_most: bool = True) -> bool | None:
    return None if value is None else (value <= limit if at_most else value >= limit)


def goals(regime: RegimeResult, shape: str) -> list[tuple[str, bool | None]]:
    """Issue 30's goals for the priority gateway's `shape` chats; None where a figure is
    missing. Judged at saturation (the caller's choice)."""
    target = regime.get("gateway-priority")
    mine = None if target is None else target.shape(shape)
    if target is None or mine is None:
        return []
    idle, reference = "the idle burst" if shape == "burst" else "idle", target.idle_for(shape)
    vllm = regime.figure("vllm-server", shape, "ttft_p50_ms")
    to_idle, to_vllm = ratio_of(mine.ttft_p50_ms, reference), ratio_of(mine.ttft_p50_ms, vllm)
    checks = [
        (f"chat TTFT p50 <= {TO_IDLE_P50:g}x {idle}", _within(to_idle, TO_IDLE_P50)),
        (f"chat TTFT p50 <= {TO_VLLM_P50:g}x vLLM's server", _within(to_vllm, TO_VLLM_P50)),
        (
            f"chat TTFT p99 <= {TO_IDLE_P99:g}x {idle}",
            _within(ratio_of(mine.ttft_p99_ms, reference), TO_IDLE_P99),
        ),
    ]
    if (kept := BATCH_KEPT.get(shape)) is not None:
        fcfs = regime.figure("gateway-fcfs", shape, "batch_tok_s")
        to_fcfs = _within(ratio_of(mine.batch_tok_s, fcfs), kept, at_most=False)
        checks.append((f"batch tok/s >= {kept:g}x the FCFS gateway", to_fcfs))
    per_chat = _within(mine.preemptions_per_chat, PREEMPTIONS_PER_CHAT)
    return [*checks, (f"preemptions per chat <= {PREEMPTIONS_PER_CHAT:g}", per_chat)]


_COLUMNS = ["shape", "target", "chats", "idle ref. p50", "TTFT p50", "TTFT p99", "p50 / idle"]
_COLUMNS += ["p50 / vLLM's", "p99 / idle", "batch tok/s", "batch / FCFS gateway"]
_COLUMNS += ["preemptions / chat", "failed (chat, batch)", "frontend CPU ms/token"]


def _row(regime: RegimeResult, target: TargetResult, s: ShapeResult) -> list[object]:
    vllm = regime.figure("vllm-server", s.shape, "ttft_p50_ms")
    fcfs, idle = regime.figure("gateway-fcfs", s.shape, "batch_tok_s"), target.idle_for(s.shape)
    return [
        s.shape,
        target.target,
        s.chats,
        _fmt(idle, " ms"),
        _fmt(s.ttft_p50_ms, " ms"),
        _fmt(s.ttft_p99_ms, " ms"),
        _fmt(ratio_of(s.ttft_p50_ms, idle), "x"),
        _fmt(ratio_of(s.ttft_p50_ms, vllm), "x"),
        _fmt(ratio_of(s.ttft_p99_ms, idle), "x"),
        f"{s.batch_tok_s:g}",
        _fmt(ratio_of(s.batch_tok_s, fcfs), "x"),
        _fmt(s.preemptions_per_chat),
        f"{s.interactive_failed}, {s.batch_failed}",
        _fmt(s.frontend_cpu_ms_per_token),
    ]


def mixed_report(report: MixedReport) -> Report:
    intro = [
        report.machine.summary,
        "",
        "Idle ref.: a chat alone on the idle engine (for burst: the same burst on the idle",
        "engine). p99 of a few dozen chats is about their maximum. frontend CPU: the server's",
        "own CPU time (cpu.py) during the batch load, per token of the batch and the chats.",
    ]
    sections = []
    for regime in report.regimes:
        rows = [
            _row(regime, target, s)
            for shape in report.shapes
            for target in regime.targets
            if (s := target.shape(shape)) is not None
        ]
        sections.append(Section(regime.regime, table=Table(_COLUMNS, rows)))
        if regime.regime == "saturation":
            judged = [
                Goal(f"{shape}: {name}", "", "", met)
                for shape in report.shapes
                for name, met in goals(regime, shape)
            ]
            sections.append(Section(text=["Issue 30's goals, the priority gateway:"], goals=judged))
    return Report("llm-gateway bench mixed", report.command, report.machine, sections, intro)


def write_report(report: MixedReport, out: Path) -> None:
    write(report, mixed_report(report), out)
    draw_series(report, out / "ttft.png")


def draw_series(report: MixedReport, path: Path) -> None:
    """Each regime (a row) and shape (a column): each target's chat TTFTs over the load."""
    regimes, shapes = report.regimes, report.shapes
    figure, axes = chart.grid(len(regimes), len(shapes), (5 * len(shapes), 3.5 * len(regimes)))
    for row, regime in zip(axes, regimes, strict=True):
        for axis, shape in zip(row, shapes, strict=True):
            plotted = False
            for target in regime.targets:
                s = target.shape(shape)
                if s is not None and s.series:
                    xs, ys = zip(*s.series, strict=True)
                    axis.plot(xs, [y * 1000 for y in ys], marker=".", label=target.target)
                    plotted = True
            axis.set_title(f"chat TTFT, {shape} chats: {regime.regime}")
            axis.set_xlabel("seconds into the load")
            axis.set_ylabel("TTFT (ms)")
            axis.grid(True, which="both", alpha=0.3)
            if plotted:
                axis.set_yscale("log")
                axis.legend()
    figure.tight_layout()
    chart.save(figure, path)
