"""Admission control: a bound on requests in the engine and on requests waiting for it.

Waiting requests go in by class (lower first, docs/PRIORITIES.md); within a class, with
fairness on, the caller holding the fewest slots goes next, and among those the one served
longest ago (so a caller with 500 requests cannot starve one with 1: they take turns), else
the earliest. While any request ahead of the bulk classes runs
or waits, bulk requests hold at most `bulk_max_running` slots (0: no cap), which keeps the
engine's batch small enough for a person's first token to come quickly. Bulk requests already
past the cap when such a request comes are held back inside the engine (its scheduler,
gateway/engine/bulk_scheduler.py, pauses them), so they take no slot from it: it may start beside
them.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from gateway.observability.tracing import Span, child
from protocols.errors import ErrorKind, GenerationError


@dataclass(eq=False)
class _Waiter:
    priority: int
    caller: str
    order: int
    granted: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Admission:
    def __init__(
        self,
        max_running: int,
        max_waiting: int,
        *,
        fair: bool = True,
        bulk_priority: int = 2,
        bulk_max_running: int = 0,
    ) -> None:
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.fair = fair
        self.bulk_priority = bulk_priority
        self.bulk_max_running = bulk_max_running
        self.running = 0
        self._running_by_class: Counter[int] = Counter()
        self._running_by_caller: Counter[str] = Counter()
        self._waiting_by_caller: Counter[str] = Counter()
        self._last_served: dict[str, int] = {}  # callers with requests running or waiting
        self._waiters: list[_Waiter] = []
        self._order = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def waiting_by_class(self) -> Counter[int]:
        return Counter(w.priority for w in self._waiters)

    def running_by_class(self) -> Counter[int]:
        return +self._running_by_class

    @asynccontextmanager
    async def slot(
        self, priority: int = 0, caller: str = "", span: Span | None = None
    ) -> AsyncIterator[None]:
        """A slot for the block; with `span`, its wait is a child span of it."""
        if span is None:
            await self._acquire(priority, caller)
        else:
            with child(span, "llm_gateway.admission", {"llm_gateway.priority": priority}):
                await self._acquire(priority, caller)
        try:
            yield
        finally:
            self._release(priority, caller)

    async def _acquire(self, priority: int, caller: str) -> None:
        if not self._waiters and self._may_start(priority):
            self._take(priority, caller)
            return
        if len(self._waiters) >= self.max_waiting:
            raise GenerationError(
                ErrorKind.RATE_LIMITED,
                f"Too many requests: {self.running} generating and {len(self._waiters)} "
                "waiting, the most this server queues; retry later",
            )
        waiter = _Waiter(priority, caller, next(self._order))
        self._waiters.append(waiter)
        self._waiting_by_caller[caller] += 1
        self._admit()  # a bulk request may be held by the cap that this one's class lifts
        try:
            await waiter.granted  # _admit hands a slot over: it is already counted as ours
        except BaseException:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self._release(priority, caller)  # it reached us just as we gave up: pass it on
            else:
                self._unqueue(waiter)
                self._forget_if_idle(caller)
                self._admit()  # the cap may have been ours
            raise

    def _is_bulk(self, priority: int) -> bool:
        return priority >= self.bulk_priority

    def _interactive_present(self) -> bool:
        if any(n for p, n in self._running_by_class.items() if not self._is_bulk(p)):
            return True
        return any(not self._is_bulk(w.priority) for w in self._waiters)

    def _may_start(self, priority: int) -> bool:
        if not self._is_bulk(priority):
            return self.running - self._bulk_held_back() < self.max_running
        return self.running < self.max_running and self._bulk_open()

    def _bulk_running(self) -> int:
        return sum(n for p, n in self._running_by_class.items() if self._is_bulk(p))

    def _bulk_held_back(self) -> int:
        """Bulk requests past the cap, which the engine holds back while any request ahead of
        bulk is present (as soon as the one asking starts)."""
        if not self.bulk_max_running:
            return 0
        return max(0, self._bulk_running() - self.bulk_max_running)

    def _bulk_open(self) -> bool:
        if not self.bulk_max_running:
            return True
        return self._bulk_running() < self.bulk_max_running or not self._interactive_present()

    def _take(self, priority: int, caller: str) -> None:
        self.running += 1
        self._running_by_class[priority] += 1
        self._running_by_caller[caller] += 1
        self._last_served[caller] = next(self._order)

    def _release(self, priority: int, caller: str) -> None:
        self.running -= 1
        self._running_by_class[priority] -= 1
        self._running_by_caller[caller] -= 1
        self._forget_if_idle(caller)
        self._admit()

    def _unqueue(self, waiter: _Waiter) -> None:
        self._waiters.remove(waiter)
        self._waiting_by_caller[waiter.caller] -= 1
        if self._waiting_by_caller[waiter.caller] <= 0:
            del self._waiting_by_caller[waiter.caller]

    def _forget_if_idle(self, caller: str) -> None:
        """Drop a caller's bookkeeping once it has nothing running or waiting."""
        if self._running_by_caller[caller] <= 0:
            del self._running_by_caller[caller]
            if caller not in self._waiting_by_caller:
                self._last_served.pop(caller, None)

    def _turn(self, waiter: _Waiter) -> tuple[int, int, int, int]:
        caller = waiter.caller
        served = self._last_served.get(caller, -1)
        return (waiter.priority, self._running_by_caller[caller], served, waiter.order)

    def _admit(self) -> None:
        """Hand free slots to the waiters that come first and may start."""
        while self._waiters:
            # Once per slot handed over, not per waiter: the queue may hold a thousand.
            room = self.running - self._bulk_held_back() < self.max_running
            bulk_room = self.running < self.max_running and self._bulk_open()
            ready = [
                w
                for w in self._waiters
                if not w.granted.done() and (bulk_room if self._is_bulk(w.priority) else room)
            ]
            if not ready:
                return
            if self.fair:
                chosen = min(ready, key=self._turn)
            else:
                chosen = min(ready, key=lambda w: (w.priority, w.order))
            self._unqueue(chosen)
            self._take(chosen.priority, chosen.caller)
            chosen.granted.set_result(None)
