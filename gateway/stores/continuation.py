"""The continuation store: token history per request_id key (the specs' "internal caching").

A key is its owner (the caller's API key's SHA-256, "" without keys) then the ordered tuple of
a payload's request_ids, so the same ids in another order are another key. An entry keeps, for
each prompt of its payload, the whole sequence so far (prompt plus everything generated) as
token ids and text. The store is bounded per owner and in total, in entries and in bytes (one
key's flood evicts its own entries: gateway/stores/pool.py), and an entry idle for
CONTINUATION_IDLE_SECONDS is dropped. A dropped key is unknown again: its next request starts
afresh from its prompt.

`HistoryStore` is what the gateway asks of a store; `InProcessStore` keeps histories in this
process (the default), `gateway/stores/redis_store.py` in Redis (REDIS_URL), shared by gateways.
The same store keeps documents: opaque bytes by key (a stored Responses API response, its token
history inside), under the same bounds and idle time, in a key space of their own: a
document's key is its kind, then its owner, then its id.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Collection
from typing import Protocol

from gateway.stores.pool import Bounded, Pool
from protocols.events import History

Key = tuple[str, ...]


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
    """This process's histories and documents, in one pool bounded per key and in total
    (gateway/stores/pool.py). Its claims refuse nothing: one process needs no more than
    GenerationService's own in-flight check."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        # A history's key begins with its owner; a document's with its kind, then its owner.
        self.histories: Bounded[dict[str, History]] = Bounded(pool, "history", history_bytes, 0)
        self.documents: Bounded[bytes] = Bounded(pool, "document", len, 1)

    async def load(self, key: Key) -> dict[str, History] | None:
        return self.histories.get(key)

    async def save(self, key: Key, histories: dict[str, History]) -> None:
        self.histories.put(key, histories)

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


def history_bytes(histories: dict[str, History]) -> int:
    """What a key's histories weigh as a store keeps them: 4 bytes a token id, and the text."""
    return sum(4 * len(h.token_ids) + len(h.text.encode()) for h in histories.values())
