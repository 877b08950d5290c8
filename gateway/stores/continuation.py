"""The continuation store: token history per request_id key (the specs' "internal caching").

A key is the ordered tuple of a payload's request_ids, so the same ids in another order are
another key. An entry keeps, for each prompt of its payload, the whole sequence so far (prompt
plus everything generated) as token ids and text. The store is bounded: past
`max_entries` the least recently used entry goes, and an entry idle for `idle_seconds` is
dropped. A dropped key is unknown again: its next request starts afresh from its prompt.

`HistoryStore` is what the gateway asks of a store; `InProcessStore` keeps histories in this
process (the default), `gateway/stores/redis_store.py` in Redis (REDIS_URL), shared by gateways.
The same store keeps documents: opaque bytes by key (a stored Responses API response, its token
history inside), under the same bounds and idle time, in a key space of their own.
"""

from __future__ import annotations

import sys
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Generic, Protocol, TypeVar

from protocols.events import History

Key = tuple[str, ...]
V = TypeVar("V")


def packed_ids(ids: array[int]) -> bytes:
    """Token ids as a store keeps them: 4 bytes each, little-endian on any machine."""
    return _little_endian(ids).tobytes()


def unpacked_ids(raw: bytes) -> array[int]:
    ids: array[int] = array("i")
    ids.frombytes(raw)
    return _little_endian(ids)


def _little_endian(ids: array[int]) -> array[int]:
    """The ids in little-endian order (a copy on a big-endian machine; both ways)."""
    if sys.byteorder == "big":
        ids = array("i", ids)
        ids.byteswap()
    return ids


class Claim(Protocol):
    """Request ids claimed for one payload: `refused` are generating elsewhere."""

    refused: frozenset[str]

    async def release(self) -> None: ...


class HistoryStore(Protocol):
    """Where continuation histories live. Every method may raise a `GenerationError`
    (engine_unavailable) naming the store when it cannot be reached."""

    async def load(self, key: Key) -> dict[str, History] | None: ...

    async def save(self, key: Key, histories: dict[str, History]) -> None: ...

    async def load_document(self, key: Key) -> bytes | None: ...

    async def save_document(self, key: Key, document: bytes) -> None: ...

    async def delete_document(self, key: Key) -> bool:
        """False: there was none."""
        ...

    async def claim(self, owner: str, request_ids: Collection[str]) -> Claim:
        """Marks the ids as generating until `release`; those already marked are refused."""
        ...

    async def problem(self) -> str | None:
        """Why the store cannot serve now (for /health), or None."""
        ...

    async def close(self) -> None: ...


class _NoClaim:
    refused: frozenset[str] = frozenset()

    async def release(self) -> None:
        return None


class InProcessStore:
    """This process's histories. Its claims refuse nothing: one process needs no more than
    GenerationService's own in-flight check."""

    def __init__(self, store: ContinuationStore, documents: DocumentStore | None = None) -> None:
        self.store = store
        self.documents = documents or DocumentStore(store.max_entries, store.idle_seconds)

    async def load(self, key: Key) -> dict[str, History] | None:
        return self.store.get(key)

    async def save(self, key: Key, histories: dict[str, History]) -> None:
        self.store.put(key, histories)

    async def load_document(self, key: Key) -> bytes | None:
        return self.documents.get(key)

    async def save_document(self, key: Key, document: bytes) -> None:
        self.documents.put(key, document)

    async def delete_document(self, key: Key) -> bool:
        return self.documents.delete(key)

    async def claim(self, owner: str, request_ids: Collection[str]) -> Claim:
        return _NoClaim()

    async def problem(self) -> str | None:
        return None

    async def close(self) -> None:
        return None


class Bounded(Generic[V]):
    """Values by key, at most `max_entries` (the least recently used go first), each dropped
    after `idle_seconds` unused."""

    def __init__(
        self, max_entries: int, idle_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_entries = max_entries
        self.idle_seconds = idle_seconds
        self._clock = clock
        self._entries: OrderedDict[Key, tuple[float, V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> V | None:
        self._drop_idle()
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries[key] = (self._clock(), found[1])
        self._entries.move_to_end(key)
        return found[1]

    def put(self, key: Key, value: V) -> None:
        if self.max_entries == 0:
            return
        self._entries[key] = (self._clock(), value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        self._drop_idle()

    def _drop_idle(self) -> None:
        deadline = self._clock() - self.idle_seconds
        while self._entries:
            oldest_key, (used, _) = next(iter(self._entries.items()))
            if used > deadline:
                return
            del self._entries[oldest_key]

    def delete(self, key: Key) -> bool:
        self._drop_idle()
        return self._entries.pop(key, None) is not None


class ContinuationStore(Bounded[dict[str, History]]):
    """Histories per continuation key."""


class DocumentStore(Bounded[bytes]):
    """Documents per key (stored responses)."""
