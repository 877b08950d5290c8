"""Background responses' events: each response's typed server-sent events in order, kept while
the response lives, for any number of readers (docs/OPENAI.md, "Background responses").

An event's place in its log is its `sequence_number`; a reader asks for those after a number and
gets them in order, then each new one as it comes, until the log ends (its terminal event was
the last). `InProcessEventLog` keeps them in this process (the default), in the histories' pool
(gateway/stores/pool.py: bounded per key and in total, in entries and bytes; a log's key is
its kind, then its owner, then its response's id), each dropped after CONTINUATION_IDLE_SECONDS
unused, except those still being written (at most one per running background response);
`gateway/stores/redis_events.py` keeps them in Redis (REDIS_URL), read by every gateway on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from typing import Protocol

from gateway.stores.continuation import Key
from gateway.stores.pool import Bounded, Pool


class EventLog(Protocol):
    """Every method may raise a `GenerationError` (engine_unavailable) naming the store when it
    cannot be reached."""

    async def append(self, key: Key, first: int, events: Sequence[bytes]) -> bool:
        """`events` numbered from `first`, which is the count appended so far; True when a
        gateway sharing the log asked its writer to stop (`ask_to_stop`)."""
        ...

    async def ask_to_stop(self, key: Key) -> bool:
        """Asks the writer, on whichever gateway, to stop at its next `append`; False when no
        other gateway shares this log."""
        ...

    async def end(self, key: Key) -> None:
        """No event follows: readers stop after the last."""
        ...

    def read(self, key: Key, after: int) -> AsyncGenerator[bytes, None]:
        """The events numbered above `after`, waiting for each until the log ends; none for a
        log nobody keeps."""
        ...

    async def delete(self, key: Key) -> None: ...


class _Log:
    def __init__(self) -> None:
        self.events: list[bytes] = []
        self.bytes = 0
        self.ended = False
        self.changed = asyncio.Event()

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class InProcessEventLog:
    def __init__(self, pool: Pool) -> None:
        self._kept: Bounded[_Log] = Bounded(pool, "events", _bytes, 1)
        self._writing: dict[Key, _Log] = {}  # never dropped while their response runs

    def _find(self, key: Key) -> _Log | None:
        return self._writing.get(key) or self._kept.get(key)

    async def append(self, key: Key, first: int, events: Sequence[bytes]) -> bool:
        log = self._writing.get(key)
        if log is None:
            log = self._writing[key] = _Log()
        assert first == len(log.events), (first, len(log.events))
        log.events.extend(events)
        log.bytes += sum(len(e) for e in events)
        self._kept.put(key, log)  # weighed again, as the most recently used
        log.notify()
        return False

    async def ask_to_stop(self, key: Key) -> bool:
        return False  # its writer is in this process: `Background` stops it itself

    async def end(self, key: Key) -> None:
        log = self._writing.pop(key, None) or self._kept.get(key)
        if log is not None:
            log.ended = True
            log.notify()

    async def read(self, key: Key, after: int) -> AsyncGenerator[bytes, None]:
        log = self._find(key)
        if log is None:
            return
        position = max(after + 1, 0)
        while True:
            while position < len(log.events):
                yield log.events[position]
                position += 1
            if log.ended:
                return
            await log.changed.wait()

    async def delete(self, key: Key) -> None:
        self._kept.delete(key)


def _bytes(log: _Log) -> int:
    return log.bytes
