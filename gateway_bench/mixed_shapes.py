"""The mixed scenario's chat traffic shapes: when each chat starts, under the batch load.

A shape gets `chat(max_tokens)`, which sends one chat request on a connection of its own and
returns its record, and gives back every chat's record once all have answered. Randomness is
seeded by the shape alone, so every target sees the same schedule.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from gateway_bench.metrics import Record
from gateway_bench.mixed_options import MixedOptions

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


SHAPES: dict[str, Shape] = {"steady": steady, "sporadic": sporadic, "burst": bursts}


def planned_chats(shape: str, options: MixedOptions) -> int:
    """How many chats `shape` sends."""
    return {
        "steady": options.chat_requests,
        "sporadic": options.sporadic_chats,
        "burst": options.bursts * options.burst_size,
    }[shape]
