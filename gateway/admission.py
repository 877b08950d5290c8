"""Admission control: a bound on requests in the engine and on requests waiting for it."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from protocols.errors import ErrorKind, GenerationError


class Admission:
    """A fair (FIFO) gate: `max_running` inside, at most `max_waiting` queued before it."""

    def __init__(self, max_running: int, max_waiting: int) -> None:
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self._acquire()
        try:
            yield
        finally:
            self._release()

    async def _acquire(self) -> None:
        if self.running < self.max_running and not self._waiters:
            self.running += 1
            return
        if len(self._waiters) >= self.max_waiting:
            raise GenerationError(
                ErrorKind.RATE_LIMITED,
                f"Too many requests: {self.running} generating and {len(self._waiters)} "
                "waiting, the most this server queues; retry later",
            )
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # _release hands its slot over: `running` already counts us
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release()  # the slot reached us just as we gave up: pass it on
            else:
                self._waiters.remove(waiter)
            raise

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.running -= 1
