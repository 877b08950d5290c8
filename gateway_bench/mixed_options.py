"""`llm-gateway bench --scenario mixed`: its options and its `--quick` preset."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from gateway_bench.scenario_options import TargetOptions, parse_options

SHAPES = ("steady", "sporadic", "burst")
REGIMES = ("saturation", "overload")
TARGETS = ("vllm-server", "gateway-fcfs", "gateway-priority")


class MixedOptions(TargetOptions, kw_only=True):
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
    shapes: list[str] = msgspec.field(default_factory=lambda: list(SHAPES))
    prompt_words: int = 64
    overload_running: int = 32  # the engine's running limit in the overload regime
    bulk_max_running: str = "auto"  # the priority gateway's BULK_MAX_RUNNING
    interactive_step_tokens: str = "auto"  # the priority gateway's INTERACTIVE_STEP_TOKENS
    drain_timeout_s: float = 300.0  # after a shape, the longest wait for the engine to empty
    regimes: list[str] = msgspec.field(default_factory=lambda: list(REGIMES))
    targets: list[str] = msgspec.field(default_factory=lambda: list(TARGETS))
    out: str = "docs/bench/mixed"


QUICK = {
    "batch_clients": 4,
    "batch_tokens": 16,
    "idle_requests": 2,
    "chat_tokens": 8,
    "chat_interval_s": 0.2,
    "chat_requests": 3,
    "sporadic_chats": 3,
    "sporadic_gap_mean_s": 0.2,
    "sporadic_gap_min_s": 0.05,
    "burst_size": 3,
    "bursts": 2,
    "burst_gap_s": 0.3,
    "prompt_words": 16,
    "overload_running": 2,
    "enforce_eager": True,
}


def parse(argv: Sequence[str]) -> MixedOptions:
    options = parse_options("mixed", MixedOptions, QUICK, argv)
    unknown = (
        set(options.targets) - set(TARGETS)
        | set(options.regimes) - set(REGIMES)
        | set(options.shapes) - set(SHAPES)
    )
    if unknown:
        raise SystemExit(f"unknown target, regime or shape: {', '.join(sorted(unknown))}")
    return options
