"""A prompt's deadline (gateway/engine_path/deadlines.py), on stand-in event streams: one timer
per prompt, which ends a wait for the next event with one Failed and never the consumer's
own awaits; the drain's end ends every prompt at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from gateway.engine_path.deadlines import SHUTTING_DOWN, Deadlines
from protocols.errors import ErrorKind
from protocols.events import Delta, Event, Failed

ABORTED: list[str] = []


async def ticking(gap: float, count: int) -> AsyncGenerator[Event, None]:
    """`count` Deltas `gap` seconds apart; notes its abort (cancelled while it waited)."""
    try:
        for i in range(count):
            await asyncio.sleep(gap)
            yield Delta(0, str(i), [i])
    except asyncio.CancelledError:
        ABORTED.append("cancelled")
        raise


async def read(deadlines: Deadlines, events: AsyncGenerator[Event, None]) -> list[Event]:
    return [event async for event in deadlines.within(events, 0)]


def test_a_stream_within_its_deadline_is_untouched() -> None:
    out = asyncio.run(read(Deadlines(5.0), ticking(0.001, 3)))
    assert [e.text for e in out if isinstance(e, Delta)] == ["0", "1", "2"]


def test_no_timeout_means_none() -> None:
    out = asyncio.run(read(Deadlines(0.0), ticking(0.001, 3)))
    assert len(out) == 3


def test_a_wait_past_the_deadline_ends_with_one_failed_and_aborts_the_source() -> None:
    ABORTED.clear()
    out = asyncio.run(read(Deadlines(0.05), ticking(0.02, 100)))
    *deltas, last = out
    assert all(isinstance(e, Delta) for e in deltas) and len(deltas) < 100
    assert isinstance(last, Failed) and last.kind is ErrorKind.ENGINE_UNAVAILABLE
    assert "0.05 s" in last.message
    assert ABORTED == ["cancelled"]


def test_the_consumers_own_awaits_are_not_bounded() -> None:
    async def main() -> list[Event]:
        deadlines = Deadlines(0.05)
        out: list[Event] = []
        async for event in deadlines.within(ticking(0.0, 2), 0):
            out.append(event)
            await asyncio.sleep(0.1)  # the consumer's own wait outlives the deadline
        return out

    out = asyncio.run(main())
    # The first event's consumer outlived the deadline: the next wait ends at once.
    assert isinstance(out[0], Delta) and isinstance(out[-1], Failed)


def test_a_task_cancelled_by_another_stays_cancelled() -> None:
    async def main() -> bool:
        deadlines = Deadlines(0.05)
        task = asyncio.create_task(read(deadlines, ticking(1.0, 1)))
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return deadlines.active == 0
        return False

    assert asyncio.run(main())


def test_the_drains_end_ends_every_prompt_with_shutting_down() -> None:
    async def main() -> tuple[list[Event], list[Event], bool]:
        deadlines = Deadlines(0.0)
        first = asyncio.create_task(read(deadlines, ticking(10.0, 1)))
        second = asyncio.create_task(read(deadlines, ticking(10.0, 1)))
        await asyncio.sleep(0.01)
        assert deadlines.active == 2
        deadlines.end_all()
        a, b = await first, await second
        await asyncio.wait_for(deadlines.idle(), 1.0)
        late = await read(deadlines, ticking(0.0, 1))  # a prompt after the end: at once
        return a + b, late, deadlines.active == 0

    ended, late, idle = asyncio.run(main())
    shutting_down = Failed(0, ErrorKind.ENGINE_UNAVAILABLE, SHUTTING_DOWN)
    assert ended == [shutting_down] * 2
    assert late == [shutting_down]
    assert idle
