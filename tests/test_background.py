"""`Background` without an engine: a response's events kept in order, `cancel` closing its
generation then keeping the terminal event its `Ending` makes, a stop asked through the log,
and the app's close."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gateway.engine_path.background import Background, Events
from gateway.stores.continuation import Key
from gateway.stores.event_log import InProcessEventLog
from gateway.stores.pool import Bounds, Pool

KEY = ("events", "", "resp_1")


class Generation:
    """A stand-in for a response's events: two batches, then the rest once `go` is set."""

    def __init__(self, finishes: bool = True) -> None:
        self.go = asyncio.Event()
        self.finishes = finishes
        self.closed = False

    async def events(self) -> Events:
        try:
            yield [b"created", b"queued"], False
            yield [b"delta"], False
            await self.go.wait()
            if self.finishes:
                yield [b"completed"], True
        finally:
            self.closed = True


async def ending(why: str, sequence_number: int) -> bytes:
    return f"{why}:{sequence_number}".encode()


async def read(log: InProcessEventLog, key: Key = KEY) -> list[bytes]:
    return [event async for event in log.read(key, -1)]


def test_a_response_that_ends_by_itself_keeps_every_event_once() -> None:
    async def check() -> None:
        log = InProcessEventLog(Pool(Bounds(8), 60))
        background, generation = Background(log), Generation()
        await background.start(KEY, generation.events(), ending)
        reader = asyncio.ensure_future(read(log))
        generation.go.set()
        assert await reader == [b"created", b"queued", b"delta", b"completed"]
        await background.settled()
        assert len(background) == 0 and generation.closed
        assert await background.cancel(KEY) is False  # it ended: nothing runs

    asyncio.run(check())


def test_cancel_closes_the_generation_and_keeps_its_terminal_event() -> None:
    async def check() -> None:
        log = InProcessEventLog(Pool(Bounds(8), 60))
        background, generation = Background(log), Generation()
        await background.start(KEY, generation.events(), ending)
        reader = log.read(KEY, 1)
        assert await anext(reader) == b"delta"  # it runs, waiting for the engine
        assert await background.cancel(KEY) is True
        assert generation.closed
        assert [e async for e in reader] == [b"cancelled:3"]
        assert await background.cancel(KEY) is False

    asyncio.run(check())


class AskedLog(InProcessEventLog):
    """A log shared with another gateway that asked the writer to stop after its first events."""

    async def append(self, key: Key, first: int, events: Sequence[bytes]) -> bool:
        await super().append(key, first, events)
        return first > 0


def test_a_stop_asked_through_the_log_ends_it_cancelled() -> None:
    async def check() -> None:
        log = AskedLog(Pool(Bounds(8), 60))
        background, generation = Background(log), Generation()
        await background.start(KEY, generation.events(), ending)
        assert await read(log) == [b"created", b"queued", b"delta", b"cancelled:3"]
        await background.settled()
        assert generation.closed

    asyncio.run(check())


def test_the_app_closing_ends_what_runs_through_its_ending() -> None:
    async def check() -> None:
        log = InProcessEventLog(Pool(Bounds(8), 60))
        background, generation = Background(log), Generation(finishes=False)
        await background.start(KEY, generation.events(), ending)
        await background.close()
        assert await read(log) == [b"created", b"queued", b"delta", b"shutdown:3"]
        assert generation.closed

    asyncio.run(check())
