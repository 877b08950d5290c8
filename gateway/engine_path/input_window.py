"""`InputWindow`: how many of one embedding model's inputs are in its engine at a time, across
every request, and whose input goes in next.

vLLM's scheduler serves requests of one priority in their order of arrival, so whatever is in
the engine when an input arrives is computed before it. The window keeps at most two engine
batches there (2 x EMBEDDING_MAX_NUM_SEQS inputs and 2 x EMBEDDING_MAX_NUM_BATCHED_TOKENS
tokens: one batch running, the next queued, so the engine never waits for the gateway), and
hands each free place to the caller with the fewest inputs in the engine (among equals, the
one served longest ago): one caller's 2,048 inputs, or many requests of them, keep another
caller's input behind at most the two batches already in the engine, never behind the rest of
theirs. Within a caller, its requests take turns, an input each (so its small request is not
behind its own 2,048 inputs either); within a request, inputs go in their order.

Each input that goes in is told to `on_entry` with its `Entry`: how many inputs were in the
engine ahead of it, and how many of other callers' went in while it waited (a metric, and what
tests count instead of clocks).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import NamedTuple


class Entry(NamedTuple):
    """One input going into the engine."""

    caller: str
    ahead: int  # inputs in the engine before it: computed first
    ahead_tokens: int  # their tokens
    passed: int  # other callers' inputs that went in while it waited for its place
    waiting: int  # inputs left waiting for a place as it went in


@dataclass(eq=False)
class _Waiter:
    request: Hashable
    tokens: int
    others_before: int  # other callers' inputs entered before it began to wait
    entry: Entry | None = None  # once it has its place
    queued: bool = True
    granted: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class InputWindow:
    def __init__(self, max_inputs: int, max_tokens: int) -> None:
        self.max_inputs = max_inputs
        self.max_tokens = max_tokens
        self.inputs = 0  # in the engine now
        self.tokens = 0
        self.entered = 0  # inputs that went into the engine, ever
        self.on_entry: list[Callable[[Entry], None]] = []
        self._entered_by_caller: Counter[str] = Counter()
        self._by_caller: Counter[str] = Counter()
        # By caller, then by request (in turn: the first is the next): those waiting
        self._waiting: dict[str, dict[Hashable, deque[_Waiter]]] = {}
        self._waiting_count = 0
        self._last_served: dict[str, int] = {}
        self._order = itertools.count()

    def waiting(self) -> int:
        """Inputs waiting for a place."""
        return self._waiting_count

    @asynccontextmanager
    async def entry(self, caller: str, request: Hashable, tokens: int) -> AsyncIterator[Entry]:
        """A place in the engine for one input of `tokens` tokens of the caller's `request`:
        held while it is pooled."""
        entry = await self._enter(caller, request, tokens)
        try:
            yield entry
        finally:
            self._leave(caller, tokens)

    async def _enter(self, caller: str, request: Hashable, tokens: int) -> Entry:
        if not self._waiting and self._fits(tokens):
            return self._take(caller, tokens, self._others(caller))
        waiter = _Waiter(request, tokens, self._others(caller))
        requests = self._waiting.setdefault(caller, {})
        requests.setdefault(request, deque()).append(waiter)
        self._waiting_count += 1
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter.entry is not None:
                self._leave(caller, tokens)  # granted as it was cancelled: give it back
            elif waiter.queued:
                self._unqueue(caller, waiter)
            else:  # passed over by `_admit`, cancelled already
                self._forget_if_idle(caller)
            raise
        assert waiter.entry is not None  # set as it was granted
        return waiter.entry

    def _others(self, caller: str) -> int:
        return self.entered - self._entered_by_caller[caller]

    def _fits(self, tokens: int) -> bool:
        if self.inputs == 0:
            return True  # one input larger than the window goes in alone
        return self.inputs < self.max_inputs and self.tokens + tokens <= self.max_tokens

    def _take(self, caller: str, tokens: int, others_before: int) -> Entry:
        passed = self._others(caller) - others_before
        entry = Entry(caller, self.inputs, self.tokens, passed, self._waiting_count)
        self.inputs += 1
        self.tokens += tokens
        self.entered += 1
        self._entered_by_caller[caller] += 1
        self._by_caller[caller] += 1
        self._last_served[caller] = next(self._order)
        for told in self.on_entry:
            told(entry)
        return entry

    def _leave(self, caller: str, tokens: int) -> None:
        self.inputs -= 1
        self.tokens -= tokens
        self._by_caller[caller] -= 1
        if self._by_caller[caller] <= 0:
            del self._by_caller[caller]
        self._forget_if_idle(caller)
        self._admit()

    def _forget_if_idle(self, caller: str) -> None:
        if caller not in self._by_caller and caller not in self._waiting:
            self._forget(caller)

    def _forget(self, caller: str) -> None:
        """A caller with nothing in the engine or waiting: its bookkeeping dropped. Its count
        of inputs entered starts again from 0: `passed` is a difference taken within one
        wait, while the count is kept."""
        self._last_served.pop(caller, None)
        self._entered_by_caller.pop(caller, None)

    def _unqueue(self, caller: str, waiter: _Waiter) -> None:
        requests = self._waiting[caller]
        queue = requests[waiter.request]
        queue.remove(waiter)
        waiter.queued = False
        self._waiting_count -= 1
        if not queue:
            del requests[waiter.request]
        if not requests:
            del self._waiting[caller]
        self._forget_if_idle(caller)
        self._admit()  # the next may fit where this one did not

    def _admit(self) -> None:
        """Free places to the callers with the fewest inputs in the engine, one at a time;
        a caller's requests in turn."""
        while self._waiting:
            caller = min(
                self._waiting,
                key=lambda c: (self._by_caller[c], self._last_served.get(c, -1)),
            )
            requests = self._waiting[caller]
            request, queue = next(iter(requests.items()))
            passed_over = queue[0].granted.cancelled()  # its task ends; it takes no place
            if not passed_over and not self._fits(queue[0].tokens):
                return
            waiter = queue.popleft()
            waiter.queued = False
            self._waiting_count -= 1
            del requests[request]
            if queue:
                requests[request] = queue  # its next input after the caller's other requests'
            if not requests:
                del self._waiting[caller]
            if passed_over:
                continue
            waiter.entry = self._take(caller, waiter.tokens, waiter.others_before)
            waiter.granted.set_result(None)
