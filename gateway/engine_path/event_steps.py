"""Prompts' events delivered as steps to the consumer that writes them (BatchRunner.run).

`StepQueue` gathers what the prompts of a payload produced while the consumer was away: one
step per wake-up, one Delta per prompt (a prompt's Deltas merge while they wait, as vLLM's
output collector merges one prompt's outputs), so a consumer that falls behind holds each
prompt's text so far, never an event per engine step.

`relayed` serves a payload of one prompt: its consumer iterates the prompt's events itself,
one step each, with no task or queue between them (issue 47: that hop was the largest
per-token cost of the gateway's own). Once the consumer stays away for `HANDOFF_SECONDS`
with an event in hand (its write waits for a client that does not read), a task takes the
generation over and runs it to its end through a `StepQueue`, as every prompt of a larger
payload does: the prompt ends in the engine and leaves its admission slot whether or not its
client reads.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator
from contextlib import aclosing

from protocols.events import Delta, Event

# How long a consumer may hold an event before the generation goes on without it. A write that
# completes takes microseconds; one that waits on a client's flow control waits far longer.
HANDOFF_SECONDS = 0.25


class StepQueue:
    """Events put by the prompts' tasks, taken as steps by the consumer."""

    def __init__(self) -> None:
        self._events: deque[Event | None] = deque()
        self._unread: dict[int, Delta] = {}  # each prompt's Delta still in the queue
        self._reader: asyncio.Future[None] | None = None

    def put(self, event: Event | None) -> None:
        """`event`, or None: no more events come."""
        if isinstance(event, Delta):
            waiting = self._unread.get(event.index)
            if waiting is not None:
                _merge(waiting, event)
                return
            self._unread[event.index] = event
        self._events.append(event)
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)

    async def take(self) -> list[Event] | None:
        """Every event that came since the last take (waiting for one); None: no more come."""
        while not self._events:
            self._reader = asyncio.get_running_loop().create_future()
            try:
                await self._reader
            finally:
                self._reader = None
        step: list[Event] = []
        while self._events:
            event = self._events[0]
            if event is None:  # left in place: every later take ends too
                break
            step.append(event)
            self._events.popleft()
        self._unread.clear()
        return step or None


class _Watch:
    """Whether the consumer holds an event (`holding`), and how many it has been given."""

    __slots__ = ("given", "holding", "relay")

    def __init__(self) -> None:
        self.given = 0
        self.holding = False
        self.relay: asyncio.Task[None] | None = None


async def relayed(
    events: AsyncGenerator[Event, None], handoff_seconds: float = HANDOFF_SECONDS
) -> AsyncGenerator[list[Event], None]:
    """`events` as steps of one event each, iterated by the consumer's own task until it keeps
    an event `handoff_seconds`; from then a task iterates them, and the steps are a
    StepQueue's. Closing this closes `events` (the task's, if it took over)."""
    loop = asyncio.get_running_loop()
    watch = _Watch()
    queue = StepQueue()
    timer: asyncio.TimerHandle | None = None

    async def relay() -> None:
        try:
            async with aclosing(events):
                async for event in events:
                    queue.put(event)
        finally:
            queue.put(None)

    def check(given: int) -> None:
        nonlocal timer
        if watch.holding and watch.given == given:
            # The consumer still holds the event it was given: `events` is suspended at that
            # event's yield, free for the task to resume (its context: this one's copy).
            watch.relay = asyncio.create_task(relay())
            timer = None
            return
        timer = loop.call_later(handoff_seconds, check, watch.given)

    try:
        while watch.relay is None:
            try:
                event = await anext(events)
            except StopAsyncIteration:
                return
            watch.given += 1
            if timer is None:  # one timer a prompt, re-armed while the consumer keeps up
                timer = loop.call_later(handoff_seconds, check, watch.given)
            watch.holding = True
            try:
                yield [event]
            finally:
                watch.holding = False
        while (step := await queue.take()) is not None:
            yield step
    finally:
        if timer is not None:
            timer.cancel()
        if watch.relay is not None:
            watch.relay.cancel()
            await asyncio.gather(watch.relay, return_exceptions=True)
        await events.aclose()  # closed already, unless the task was cancelled before it ran


def _merge(into: Delta, delta: Delta) -> None:
    """`delta` appended to `into`, an earlier Delta of the same prompt."""
    into.text += delta.text
    into.token_ids.extend(delta.token_ids)
    into.finish_reason = delta.finish_reason
    if into.tokens is not None and delta.tokens is not None:
        into.tokens.extend(delta.tokens)
