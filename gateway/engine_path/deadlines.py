"""The end of every prompt that runs too long: REQUEST_TIMEOUT_SECONDS each, or the drain's
end for all at once. Either way the prompt ends with one terminal error, never a cut stream.

A prompt's deadline is one timer for the whole request, armed when it starts. Only a wait for
its next event is bounded (never the consumer's own awaits between events): when the deadline
passes during such a wait, the waiting task is cancelled there, as `asyncio.timeout` would; when
it passed between waits, the next wait ends at once. Ending all at once fires every timer now.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

from protocols.errors import ErrorKind
from protocols.events import Event, Failed

SHUTTING_DOWN = "The server is shutting down; retry on another instance"


class _Bound:
    """One prompt's deadline: passed (`expired`), and the task waiting for its next event."""

    __slots__ = ("expired", "waiting")

    def __init__(self) -> None:
        self.expired = False
        self.waiting: asyncio.Task[object] | None = None

    def expire(self) -> None:
        if self.expired:
            return
        self.expired = True
        if self.waiting is not None:
            self.waiting.cancel()


class Deadlines:
    def __init__(self, timeout_seconds: float) -> None:
        self.timeout_seconds = timeout_seconds  # 0: none
        self.draining = False  # set by the drain: new prompts are refused
        self.active = 0
        self._ended = False
        self._bounds: set[_Bound] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    async def within(self, events: AsyncIterator[Event], index: int) -> AsyncGenerator[Event, None]:
        """`events`, until it ends or its deadline passes: then one Failed ends it."""
        bound = _Bound()
        timer: asyncio.TimerHandle | None = None
        if self.timeout_seconds:
            loop = asyncio.get_running_loop()
            timer = loop.call_at(loop.time() + self.timeout_seconds, bound.expire)
        bound.expired = self._ended
        self._bounds.add(bound)
        self.active += 1
        self._idle.clear()
        try:
            while not bound.expired:
                task = asyncio.current_task()
                assert task is not None
                cancelling = task.cancelling()
                bound.waiting = task
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError:
                    # Ours (the deadline passed) unless someone else cancelled the task too.
                    if not bound.expired or task.uncancel() > cancelling:
                        raise
                    break
                finally:
                    bound.waiting = None
                yield event
            yield Failed(index, ErrorKind.ENGINE_UNAVAILABLE, self._why())
        finally:
            if timer is not None:
                timer.cancel()
            self._bounds.discard(bound)
            self.active -= 1
            if not self.active:
                self._idle.set()

    def _why(self) -> str:
        if self._ended:
            return SHUTTING_DOWN
        return f"The request ran longer than this server allows ({self.timeout_seconds:g} s)"

    async def idle(self) -> None:
        """Returns once no prompt is running."""
        await self._idle.wait()

    def end_all(self) -> None:
        """Every running prompt ends now, with SHUTTING_DOWN."""
        self._ended = True
        for bound in list(self._bounds):
            bound.expire()
