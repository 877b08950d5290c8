"""`llm-gateway bench mixed`: its options, its `--quick` preset, and its chat traffic shapes.

A shape (when each chat starts, under the batch load) gets `chat(max_tokens)`, which sends one
chat request on a connection of its own and returns its record, and gives back every chat's
record once all have answered. Randomness is seeded by the shape alone, so every target sees
the same schedule.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal, get_args

import msgspec

from gateway_bench.metrics import Record
from gateway_bench.options import Options

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


Chat = Callable[[int], Coroutine[Any, Any, Record]]
Shape = Callable[[Chat, MixedOptions, random.Random], Awaitable[list[Record]]]


async def steady(chat: Chat, options: MixedOptions, rng: random.Random) -> list[Record]:
    """A long chat every `chat_interval_s`, whether the previous one has answered or not."""
    chats: list[asyncio.Task[Record]] = []
    for _ in range(options.chat_requests):
        chats.append(asyncio.create_task(chat(options.chat_tokens)))
        await asyncio.sleep(options.chat_interval_s)
    return list(await asyncio.gather(*chats))


def sporadic_gap(options: MixedOptions, rng: random.Random) -> float:
    return max(options.sporadic_gap_min_s, rng.expovariate(1 / options.sporadic_gap_mean_s))


async def sporadic(chat: Chat, options: MixedOptions, rng: random.Random) -> list[Record]:
    """Short chats one at a time: each starts a random gap after the previous one ended, so
    the engine runs bulk alone in between."""
    records = []
    for n in range(options.sporadic_chats):
        if n:
            await asyncio.sleep(sporadic_gap(options, rng))
        records.append(await chat(options.short_chat_tokens))
    return records


async def burst(chat: Chat, options: MixedOptions) -> list[Record]:
    """`burst_size` short chats at once."""
    sent = [chat(options.short_chat_tokens) for _ in range(options.burst_size)]
    return list(await asyncio.gather(*sent))


async def bursts(chat: Chat, options: MixedOptions, rng: random.Random) -> list[Record]:
    """`bursts` bursts, each `burst_gap_s` after the previous one has answered."""
    records: list[Record] = []
    for n in range(options.bursts):
        if n:
            await asyncio.sleep(options.burst_gap_s)
        records += await burst(chat, options)
    return records


SCHEDULES: dict[str, Shape] = {"steady": steady, "sporadic": sporadic, "burst": bursts}


def planned_chats(shape: str, options: MixedOptions) -> int:
    """How many chats `shape` sends."""
    return {
        "steady": options.chat_requests,
        "sporadic": options.sporadic_chats,
        "burst": options.bursts * options.burst_size,
    }[shape]
