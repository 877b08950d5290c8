"""The team's targets (docs/BENCHMARKS.md), checked against one run's figures.

A goal is passed (True), failed (False), or not measured (None) when the run does not hold
the figure it needs: quick mode, a skipped target, another concurrency sweep, and so on.
"""

from __future__ import annotations

from gateway.bench.results import (
    ConnectionResult,
    ContinuationResult,
    Goal,
    StepResult,
    TargetResult,
)

CONCURRENCY = 32
OUTPUT_TOKENS = 64
CEILING_SHARE = 0.95
HISTORY_TOKENS = 1536
CONTINUATION_RATIO = 0.35
IDLE_CONNECTIONS = 1000
KB_PER_CONNECTION = 100.0
STREAMS = 256


def _step(target: TargetResult | None, concurrency: int) -> StepResult | None:
    if target is None:
        return None
    return next((s for s in target.steps if s.concurrency == concurrency), None)


def _pct(step: StepResult) -> str:
    return "?" if step.other_cpu_pct is None else f"{step.other_cpu_pct:.0f}%"


def _protocol_goal(
    target: TargetResult,
    ceiling: StepResult | None,
    server: StepResult | None,
    output: int,
    logprobs_ceiling: StepResult | None = None,
    logprobs_server: StepResult | None = None,
) -> Goal:
    requirement = (
        f"at concurrency {CONCURRENCY}: tok/s >= {CEILING_SHARE} x ceiling and > vLLM server, "
        "TTFT p50 < vLLM server's, no errors"
    )
    name = f"{target.label} throughput and TTFT"
    step = _step(target, CONCURRENCY)
    missing = [
        what
        for what, value in (("this target", step), ("the ceiling", ceiling), ("vLLM", server))
        if value is None
    ]
    if missing or step is None or ceiling is None or server is None:
        measured = f"no figure at concurrency {CONCURRENCY} for {', '.join(missing)}"
        return Goal(name=name, requirement=requirement, measured=measured, passed=None)
    if output != OUTPUT_TOKENS:
        return Goal(
            name=name, requirement=requirement, measured=f"run with {output} tokens", passed=None
        )
    share = step.tokens_per_s / ceiling.tokens_per_s if ceiling.tokens_per_s else 0.0
    ttft, server_ttft = step.ttft_p50_ms, server.ttft_p50_ms
    faster_first = ttft is not None and server_ttft is not None and ttft < server_ttft
    passed = (
        share >= CEILING_SHARE
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
        measured += _against_logprobs(step, logprobs_ceiling, logprobs_server)
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


def _continuation_goal(result: ContinuationResult | None) -> Goal:
    requirement = f"continuation TTFT <= {CONTINUATION_RATIO} x fresh prompt at {HISTORY_TOKENS}"
    name = "Continuation by request_id"
    point = None
    if result is not None:
        point = next((p for p in result.points if p.history_tokens == HISTORY_TOKENS), None)
    if point is None or point.ratio is None:
        return Goal(name=name, requirement=requirement, measured="not measured", passed=None)
    measured = (
        f"{point.continuation_ttft_ms} vs {point.fresh_ttft_ms} ms = {point.ratio:.2f}; "
        f"{point.errors} errors"
    )
    return Goal(
        name=name,
        requirement=requirement,
        measured=measured,
        passed=point.ratio <= CONTINUATION_RATIO and point.errors == 0,
    )


def _connection_goals(result: ConnectionResult | None) -> list[Goal]:
    idle_name, idle_req = (
        "Idle WebSocket memory",
        (f"{IDLE_CONNECTIONS} idle connections, < {KB_PER_CONNECTION:.0f} KB RSS each, no errors"),
    )
    streams_name, streams_req = "Concurrent streams", f"{STREAMS} concurrent streams, 0 errors"
    if result is None:
        return [
            Goal(name=idle_name, requirement=idle_req, measured="not measured", passed=None),
            Goal(name=streams_name, requirement=streams_req, measured="not measured", passed=None),
        ]
    kb = result.kb_per_idle_connection
    idle_measured = (
        f"{result.idle_open}/{result.idle_requested} open, {kb} KB each, "
        f"{result.idle_errors} errors"
    )
    idle_passed: bool | None = None
    if result.idle_requested >= IDLE_CONNECTIONS and kb is not None:
        idle_passed = kb < KB_PER_CONNECTION and result.idle_errors == 0
    streams_measured = (
        f"{result.streams} streams, {result.stream_errors} errors, "
        f"{result.stream_tokens} tokens in {result.stream_wall_s} s"
    )
    streams_passed = result.stream_errors == 0 if result.streams >= STREAMS else None
    return [
        Goal(name=idle_name, requirement=idle_req, measured=idle_measured, passed=idle_passed),
        Goal(
            name=streams_name,
            requirement=streams_req,
            measured=streams_measured,
            passed=streams_passed,
        ),
    ]


def evaluate(
    targets: list[TargetResult],
    continuation: ContinuationResult | None,
    connections: ConnectionResult | None,
    output_tokens: int,
) -> list[Goal]:
    by_kind = {t.kind: t for t in targets if t.kind != "gateway"}
    ceiling = _step(by_kind.get("ceiling"), CONCURRENCY)
    server = _step(by_kind.get("vllm-server"), CONCURRENCY)
    with_logprobs = _step(by_kind.get("ceiling-logprobs"), CONCURRENCY)
    server_with_logprobs = _step(by_kind.get("vllm-server-logprobs"), CONCURRENCY)
    goals = [
        _protocol_goal(t, ceiling, server, output_tokens, with_logprobs, server_with_logprobs)
        for t in targets
        if t.kind == "gateway"
    ]
    goals.append(_continuation_goal(continuation))
    goals.extend(_connection_goals(connections))
    return goals
