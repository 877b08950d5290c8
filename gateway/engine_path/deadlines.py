"""The end of every prompt that runs too long: REQUEST_TIMEOUT_SECONDS each, or the drain's
end for all at once. Either way the prompt ends with one terminal error, never a cut stream.

Each wait for a prompt's next event is bounded by an `asyncio.timeout` (never one spanning a
`yield`: the consumer's own awaits stay unbounded); ending all at once reschedules them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

from protocols.errors import ErrorKind
from protocols.events import Event, Failed

SHUTTING_DOWN = "The server is shutting down; retry on another instance"


class Deadlines:
    def __init__(self, timeout_seconds: float) -> None:
        self.timeout_seconds = timeout_seconds  # 0: none
        self.draining = False  # set by the drain: new prompts are refused
        self.active = 0
        self._ended = False
        self._scopes: set[asyncio.Timeout] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    async def within(self, events: AsyncIterator[Event], index: int) -> AsyncGenerator[Event, None]:
        """`events`, until it ends or its deadline passes: then one Failed ends it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_seconds if self.timeout_seconds else None
        self.active += 1
        self._idle.clear()
        try:
            while True:
                try:
                    async with asyncio.timeout_at(
                        loop.time() if self._ended else deadline
                    ) as scope:
                        self._scopes.add(scope)
                        try:
                            event = await anext(events)
                        finally:
                            self._scopes.discard(scope)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    yield Failed(index, ErrorKind.ENGINE_UNAVAILABLE, self._why())
                    return
                yield event
        finally:
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
        now = asyncio.get_running_loop().time()
        for scope in list(self._scopes):
            scope.reschedule(now)
