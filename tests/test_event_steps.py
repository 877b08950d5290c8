"""A one-prompt payload's events (gateway/engine_path/event_steps.py): iterated by the consumer
while it keeps up, by a task of their own once it holds an event too long. No engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

from gateway.engine_path.event_steps import StepQueue, relayed
from protocols.events import Delta, Event, Finished, History, Queued, Started, token_array


def _finished() -> Finished:
    return Finished(0, History(token_array([1]), "p"), [], 1, 0.0)


class _Source:
    """Queued, Started, `tokens` Deltas a tick apart, Finished; what ran it and its end."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.tasks: set[asyncio.Task[object] | None] = set()
        self.ended = False
        self.closed = False
        self.changed = asyncio.Event()  # set as each event is made and at the end

    async def until(self, condition: Callable[[], bool]) -> None:
        """Waits for `condition`, checked as the events are made, however long that takes."""
        while not condition():
            self.changed.clear()
            await self.changed.wait()

    async def events(self) -> AsyncGenerator[Event, None]:
        try:
            yield Queued(0, token_array([1]))
            yield Started(0)
            for i in range(self.tokens):
                await asyncio.sleep(0.001)
                self.tasks.add(asyncio.current_task())
                self.changed.set()
                yield Delta(0, f" t{i}", [i])
            yield _finished()
            self.ended = True
            self.changed.set()
        finally:
            self.closed = True


def test_a_consumer_that_keeps_up_iterates_the_events_itself_one_step_each() -> None:
    async def run() -> tuple[list[list[Event]], _Source, asyncio.Task[object] | None]:
        source = _Source(5)
        async with aclosing(relayed(source.events(), handoff_seconds=10)) as steps:
            taken = [step async for step in steps]
        return taken, source, asyncio.current_task()

    taken, source, consumer = asyncio.run(run())
    assert [len(step) for step in taken] == [1] * 8
    assert source.tasks == {consumer} and source.ended and source.closed


def test_a_consumer_that_holds_an_event_hands_the_generation_to_a_task_that_ends_it() -> None:
    """The prompt ends while its consumer waits (as a write to a client that does not read);
    the consumer then gets every event, the Deltas it had not taken merged in one."""

    async def run() -> tuple[list[list[Event]], _Source, bool]:
        source = _Source(20)
        taken: list[list[Event]] = []
        ended_while_held = False
        async with aclosing(relayed(source.events(), handoff_seconds=0.01)) as steps:
            async for step in steps:
                if any(isinstance(e, Delta) for e in step) and len(taken) == 2:
                    # The consumer away with an event in hand until the prompt has ended.
                    await source.until(lambda: source.ended)
                    ended_while_held = source.ended
                taken.append(step)
        return taken, source, ended_while_held

    taken, source, ended_while_held = asyncio.run(run())
    assert ended_while_held and source.closed
    deltas = [e for step in taken for e in step if isinstance(e, Delta)]
    assert "".join(d.text for d in deltas) == "".join(f" t{i}" for i in range(20))
    assert len(deltas) == 2  # the one held, then the rest merged while it was held
    assert isinstance(taken[-1][-1], Finished)


def test_closing_the_steps_closes_the_events_whoever_iterates_them() -> None:
    async def run(hand_off: bool) -> _Source:
        source = _Source(1000)
        consumer = asyncio.current_task()
        async with aclosing(relayed(source.events(), handoff_seconds=0.01)) as steps:
            async for step in steps:
                if any(isinstance(e, Delta) for e in step):
                    if hand_off:  # held until a task of its own iterates the events
                        await source.until(lambda: bool(source.tasks - {consumer}))
                    break
        return source

    for hand_off in (False, True):
        source = asyncio.run(run(hand_off))
        assert source.closed and not source.ended


def test_a_step_queue_ends_after_what_came_before_its_end() -> None:
    async def run() -> list[list[Event] | None]:
        queue = StepQueue()
        queue.put(Started(0))
        queue.put(Delta(0, "a", [1]))
        queue.put(Delta(0, "b", [2]))
        queue.put(None)
        return [await queue.take(), await queue.take(), await queue.take()]

    first, second, third = asyncio.run(run())
    assert first is not None and [type(e) for e in first] == [Started, Delta]
    assert isinstance(first[1], Delta) and first[1].text == "ab" and first[1].token_ids == [1, 2]
    assert second is None and third is None
