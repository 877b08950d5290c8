"""The sweep's goals (docs/BENCHMARKS.md), as data, judged on one run's figures.

`GOALS` is the table: one frozen entry per kind of goal, holding its thresholds. `evaluate`
judges each entry in order; a protocol entry applies to every gateway protocol the run
measured. Changing a threshold, or dropping a goal, is an edit of the table only. A goal the
run holds no figure for (quick mode, a skipped target, another sweep) is not measured (None).
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


@dataclass(frozen=True)
class ProtocolGoal:
    """Each gateway protocol at one step: tok/s at least `ceiling_share` x the in-process
    ceiling's and above vLLM's server's (same route), TTFT p50 below vLLM's server's, no
    errors. Judged only on a run with `output_tokens` per request."""

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
    """Continuing a request_id's history: TTFT at most `max_ratio` x a fresh prompt's."""

    history_tokens: int
    max_ratio: float
    name: str = "Continuation by request_id"

    @property
    def requirement(self) -> str:
        return f"continuation TTFT <= {self.max_ratio} x fresh prompt at {self.history_tokens}"


@dataclass(frozen=True)
class IdleConnectionsGoal:
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


def _pct(step: StepResult) -> str:
    return "?" if step.other_cpu_pct is None else f"{step.other_cpu_pct:.0f}%"


def _protocol_goal(
    goal: ProtocolGoal, target: TargetResult, targets: list[TargetResult], output: int
) -> Goal:
    def step(kind: TargetKind | None) -> StepResult | None:
        found = target if kind is None else next((t for t in targets if t.kind == kind), None)
        steps = [] if found is None else found.steps
        return next((s for s in steps if s.concurrency == goal.concurrency), None)

    name, requirement = f"{target.label} throughput and TTFT", goal.requirement
    mine, ceiling, server = step(None), step("ceiling"), step(target.compared_with)
    named = (("this target", mine), ("the ceiling", ceiling), ("vLLM", server))
    if mine is None or ceiling is None or server is None:
        missing = ", ".join(what for what, value in named if value is None)
        measured = f"no figure at concurrency {goal.concurrency} for {missing}"
        return Goal(name, requirement, measured, None)
    if output != goal.output_tokens:
        return Goal(name, requirement, f"run with {output} tokens", None)
    share = mine.tokens_per_s / ceiling.tokens_per_s if ceiling.tokens_per_s else 0.0
    ttft, server_ttft = mine.ttft_p50_ms, server.ttft_p50_ms
    earlier = ttft is not None and server_ttft is not None and ttft < server_ttft
    faster = share >= goal.ceiling_share and mine.tokens_per_s > server.tokens_per_s
    measured = (
        f"{mine.tokens_per_s:.0f} tok/s = {share:.2f} x ceiling, "
        f"{mine.tokens_per_s / server.tokens_per_s:.2f} x vLLM; "
        f"TTFT p50 {ttft} vs {server_ttft} ms; {mine.errors} errors; other CPU "
        f"{_pct(mine)} here, {_pct(ceiling)} ceiling, {_pct(server)} vLLM"
        if server.tokens_per_s
        else "vLLM server produced nothing"
    )
    # Not part of the goal: the references doing the same engine work (per-token logprobs).
    ceiling_lp, server_lp = step("ceiling-logprobs"), step("vllm-server-logprobs")
    if target.logprobs and ceiling_lp is not None and ceiling_lp.tokens_per_s:
        measured += f"; {mine.tokens_per_s / ceiling_lp.tokens_per_s:.2f} x the ceiling with "
        measured += "logprobs=0"
    if target.logprobs and server_lp is not None and server_lp.tokens_per_s:
        measured += (
            f"; {mine.tokens_per_s / server_lp.tokens_per_s:.2f} x vLLM with logprobs=0, "
            f"TTFT p50 {ttft} vs {server_lp.ttft_p50_ms} ms"
        )
    return Goal(name, requirement, measured, faster and earlier and mine.errors == 0)


def _continuation_goal(goal: ContinuationGoal, result: ContinuationResult | None) -> Goal:
    points = [] if result is None else result.points
    point = next((p for p in points if p.history_tokens == goal.history_tokens), None)
    if point is None or point.ratio is None:
        return Goal(goal.name, goal.requirement, "not measured", None)
    measured = (
        f"{point.continuation_ttft_ms} vs {point.fresh_ttft_ms} ms = {point.ratio:.2f}; "
        f"{point.errors} errors"
    )
    passed = point.ratio <= goal.max_ratio and point.errors == 0
    return Goal(goal.name, goal.requirement, measured, passed)


def _connection_goal(goal: IdleConnectionsGoal | StreamsGoal, c: ConnectionResult | None) -> Goal:
    if c is None:
        return Goal(goal.name, goal.requirement, "not measured", None)
    passed: bool | None = None
    if isinstance(goal, StreamsGoal):
        measured = (
            f"{c.streams} streams, {c.stream_errors} errors, "
            f"{c.stream_tokens} tokens in {c.stream_wall_s} s"
        )
        passed = c.stream_errors == 0 if c.streams >= goal.streams else None
        return Goal(goal.name, goal.requirement, measured, passed)
    kb = c.kb_per_idle_connection
    measured = f"{c.idle_open}/{c.idle_requested} open, {kb} KB each, {c.idle_errors} errors"
    if c.idle_requested >= goal.connections and kb is not None:
        passed = kb < goal.max_kb_each and c.idle_errors == 0
    return Goal(goal.name, goal.requirement, measured, passed)


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
                gateways = [t for t in targets if t.kind == "gateway"]
                goals += [_protocol_goal(goal, t, targets, output_tokens) for t in gateways]
            case ContinuationGoal():
                goals.append(_continuation_goal(goal, continuation))
            case IdleConnectionsGoal() | StreamsGoal():
                goals.append(_connection_goal(goal, connections))
    return goals
