"""The team's targets (docs/BENCHMARKS.md), as data, checked against one run's figures.

`GOALS` is the table: one frozen entry per kind of goal, holding its thresholds and the
workload it holds for. `evaluate` reads it, in order, and judges each entry with the checker
of its kind; a protocol entry applies to every gateway protocol the run measured. Changing a
threshold, or dropping a goal, is an edit of the table only.

A goal is passed (True), failed (False), or not measured (None) when the run does not hold
the figure it needs: quick mode, a skipped target, another concurrency sweep, and so on.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway_bench.report import Goal
from gateway_bench.results import (
    ConnectionResult,
    ContinuationResult,
    StepResult,
    TargetKind,
    TargetResult,
)

# --- The table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProtocolGoal:
    """Each gateway protocol at one step of the sweep: tok/s at least `ceiling_share` x the
    in-process ceiling's and above vLLM's server's, TTFT p50 below vLLM's server's, no errors.
    Judged only on a run with `output_tokens` per request."""

    concurrency: int
    output_tokens: int
    ceiling_share: float

    @property
    def requirement(self) -> str:
        return (
            f"at concurrency {self.concurrency}: tok/s >= {self.ceiling_share} x ceiling and "
            "> vLLM server, TTFT p50 < vLLM server's, no errors"
        )


@dataclass(frozen=True)
class ContinuationGoal:
    """Continuing a request_id's history at `history_tokens`: TTFT at most `max_ratio` x the
    same history sent as a fresh prompt, no errors."""

    history_tokens: int
    max_ratio: float
    name: str = "Continuation by request_id"

    @property
    def requirement(self) -> str:
        return f"continuation TTFT <= {self.max_ratio} x fresh prompt at {self.history_tokens}"


@dataclass(frozen=True)
class IdleConnectionsGoal:
    """At least `connections` idle WebSockets, each under `max_kb_each` of gateway RSS."""

    connections: int
    max_kb_each: float
    name: str = "Idle WebSocket memory"

    @property
    def requirement(self) -> str:
        return (
            f"{self.connections} idle connections, < {self.max_kb_each:.0f} KB RSS each, no errors"
        )


@dataclass(frozen=True)
class StreamsGoal:
    """At least `streams` concurrent streams, every one completed."""

    streams: int
    name: str = "Concurrent streams"

    @property
    def requirement(self) -> str:
        return f"{self.streams} concurrent streams, 0 errors"


GoalSpec = ProtocolGoal | ContinuationGoal | IdleConnectionsGoal | StreamsGoal

GOALS: tuple[GoalSpec, ...] = (
    ProtocolGoal(concurrency=32, output_tokens=64, ceiling_share=0.95),
    ContinuationGoal(history_tokens=1536, max_ratio=0.35),
    IdleConnectionsGoal(connections=1000, max_kb_each=100.0),
    StreamsGoal(streams=256),
)

# --- The checkers ---------------------------------------------------------------------------


def _step(target: TargetResult | None, concurrency: int) -> StepResult | None:
    if target is None:
        return None
    return next((s for s in target.steps if s.concurrency == concurrency), None)


def _pct(step: StepResult) -> str:
    return "?" if step.other_cpu_pct is None else f"{step.other_cpu_pct:.0f}%"


@dataclass(frozen=True)
class _References:
    """The reference targets' steps at a protocol goal's concurrency."""

    ceiling: StepResult | None
    server: StepResult | None
    ceiling_logprobs: StepResult | None
    server_logprobs: StepResult | None

    @classmethod
    def at(cls, targets: list[TargetResult], concurrency: int, server: TargetKind) -> _References:
        """`server`: the vLLM server target on the same route as the measured one."""
        by_kind: dict[TargetKind, TargetResult] = {t.kind: t for t in targets}

        def step(kind: TargetKind) -> StepResult | None:
            return _step(by_kind.get(kind), concurrency)

        return cls(
            step("ceiling"),
            step(server),
            step("ceiling-logprobs"),
            step("vllm-server-logprobs"),
        )


def _protocol_goal(
    goal: ProtocolGoal, target: TargetResult, refs: _References, output: int
) -> Goal:
    requirement = goal.requirement
    name = f"{target.label} throughput and TTFT"
    step = _step(target, goal.concurrency)
    ceiling, server = refs.ceiling, refs.server
    missing = [
        what
        for what, value in (("this target", step), ("the ceiling", ceiling), ("vLLM", server))
        if value is None
    ]
    if missing or step is None or ceiling is None or server is None:
        measured = f"no figure at concurrency {goal.concurrency} for {', '.join(missing)}"
        return Goal(name=name, requirement=requirement, measured=measured, passed=None)
    if output != goal.output_tokens:
        return Goal(
            name=name, requirement=requirement, measured=f"run with {output} tokens", passed=None
        )
    share = step.tokens_per_s / ceiling.tokens_per_s if ceiling.tokens_per_s else 0.0
    ttft, server_ttft = step.ttft_p50_ms, server.ttft_p50_ms
    faster_first = ttft is not None and server_ttft is not None and ttft < server_ttft
    passed = (
        share >= goal.ceiling_share
        and step.tokens_per_s > server.tokens_per_s
        and faster_first
        and step.errors == 0
    )
    measured = (
        f"{step.tokens_per_s:.0f} tok/s = {share:.2f} x ceiling, "
        f"{step.tokens_per_s / server.tokens_per_s:.2f} x vLLM; "
        f"TTFT p50 {ttft} vs {server_ttft} ms; {step.errors} errors; other CPU "
        f"{_pct(step)} here, {_pct(ceiling)} ceiling, {_pct(server)} vLLM"
        if server.tokens_per_s
        else "vLLM server produced nothing"
    )
    if target.logprobs:
        measured += _against_logprobs(step, refs.ceiling_logprobs, refs.server_logprobs)
    return Goal(name=name, requirement=requirement, measured=measured, passed=passed)


def _against_logprobs(
    step: StepResult, ceiling: StepResult | None, server: StepResult | None
) -> str:
    """Not part of the goal: the references doing the same engine work (per-token logprobs)."""
    said = ""
    if ceiling is not None and ceiling.tokens_per_s:
        said += f"; {step.tokens_per_s / ceiling.tokens_per_s:.2f} x the ceiling with logprobs=0"
    if server is not None and server.tokens_per_s:
        said += (
            f"; {step.tokens_per_s / server.tokens_per_s:.2f} x vLLM with logprobs=0, "
            f"TTFT p50 {step.ttft_p50_ms} vs {server.ttft_p50_ms} ms"
        )
    return said


def _continuation_goal(goal: ContinuationGoal, result: ContinuationResult | None) -> Goal:
    point = None
    if result is not None:
        point = next((p for p in result.points if p.history_tokens == goal.history_tokens), None)
    if point is None or point.ratio is None:
        return Goal(
            name=goal.name, requirement=goal.requirement, measured="not measured", passed=None
        )
    measured = (
        f"{point.continuation_ttft_ms} vs {point.fresh_ttft_ms} ms = {point.ratio:.2f}; "
        f"{point.errors} errors"
    )
    return Goal(
        name=goal.name,
        requirement=goal.requirement,
        measured=measured,
        passed=point.ratio <= goal.max_ratio and point.errors == 0,
    )


def _idle_goal(goal: IdleConnectionsGoal, result: ConnectionResult | None) -> Goal:
    if result is None:
        return Goal(
            name=goal.name, requirement=goal.requirement, measured="not measured", passed=None
        )
    kb = result.kb_per_idle_connection
    measured = (
        f"{result.idle_open}/{result.idle_requested} open, {kb} KB each, "
        f"{result.idle_errors} errors"
    )
    passed: bool | None = None
    if result.idle_requested >= goal.connections and kb is not None:
        passed = kb < goal.max_kb_each and result.idle_errors == 0
    return Goal(name=goal.name, requirement=goal.requirement, measured=measured, passed=passed)


def _streams_goal(goal: StreamsGoal, result: ConnectionResult | None) -> Goal:
    if result is None:
        return Goal(
            name=goal.name, requirement=goal.requirement, measured="not measured", passed=None
        )
    measured = (
        f"{result.streams} streams, {result.stream_errors} errors, "
        f"{result.stream_tokens} tokens in {result.stream_wall_s} s"
    )
    passed = result.stream_errors == 0 if result.streams >= goal.streams else None
    return Goal(name=goal.name, requirement=goal.requirement, measured=measured, passed=passed)


def evaluate(
    targets: list[TargetResult],
    continuation: ContinuationResult | None,
    connections: ConnectionResult | None,
    output_tokens: int,
    table: tuple[GoalSpec, ...] = GOALS,
) -> list[Goal]:
    """Every goal of `table`, in its order; a protocol goal once per gateway target."""
    goals: list[Goal] = []
    for goal in table:
        match goal:
            case ProtocolGoal():
                goals += [
                    _protocol_goal(
                        goal,
                        t,
                        _References.at(targets, goal.concurrency, t.compared_with),
                        output_tokens,
                    )
                    for t in targets
                    if t.kind == "gateway"
                ]
            case ContinuationGoal():
                goals.append(_continuation_goal(goal, continuation))
            case IdleConnectionsGoal():
                goals.append(_idle_goal(goal, connections))
            case StreamsGoal():
                goals.append(_streams_goal(goal, connections))
    return goals
