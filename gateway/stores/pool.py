"""What this process keeps for its callers (continuation histories, stored responses,
background responses' events), bounded per owner and in total, in entries and in bytes.

Every entry has an owner (the caller's API key's SHA-256, or "" without keys, to which only the
total applies: it is everyone). An owner past its own share (`Bounds.entries_per_owner`,
`bytes_per_owner`) loses its least recently used entries; a pool past its total loses the least
recently used entry of whichever owner holds the most (entries, or bytes, as the bound passed;
of those, the one with the least recently used entry): an owner loses nothing to another's
flood while any owner holds more than it. An entry unused for `idle_seconds` goes, and so does
one larger than its owner's share of bytes.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar, cast

V = TypeVar("V")
PoolKey = tuple[str, ...]


class Bounds(NamedTuple):
    """0 keeps nothing as `entries`; 0 is no bound of its own for the others."""

    entries: int
    bytes: int = 0
    entries_per_owner: int = 0
    bytes_per_owner: int = 0


class _Entry:
    __slots__ = ("owner", "size", "used", "value")

    def __init__(self, owner: str, size: int, used: float, value: object) -> None:
        self.owner, self.size, self.used, self.value = owner, size, used, value


class _Share:
    """One owner's entries, least recently used first, and their bytes."""

    def __init__(self) -> None:
        self.keys: OrderedDict[PoolKey, None] = OrderedDict()
        self.bytes = 0


class Pool:
    def __init__(
        self, bounds: Bounds, idle_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.bounds = bounds
        self.idle_seconds = idle_seconds
        self._clock = clock
        self._entries: OrderedDict[PoolKey, _Entry] = OrderedDict()  # least recently used first
        self._shares: dict[str, _Share] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def held(self, owner: str) -> tuple[int, int]:
        """The entries and bytes `owner` holds."""
        share = self._shares.get(owner)
        return (0, 0) if share is None else (len(share.keys), share.bytes)

    def get(self, key: PoolKey) -> object | None:
        self._drop_idle()
        entry = self._entries.get(key)
        if entry is None:
            return None
        entry.used = self._clock()
        self._entries.move_to_end(key)
        self._shares[entry.owner].keys.move_to_end(key)
        return entry.value

    def put(self, key: PoolKey, owner: str, value: object, size: int) -> None:
        if self.bounds.entries == 0:
            return
        self._remove(key)
        share = self._shares.setdefault(owner, _Share())
        self._entries[key] = _Entry(owner, size, self._clock(), value)
        share.keys[key] = None
        share.bytes += size
        self.bytes += size
        self._drop_idle()
        self._hold_to_bounds(owner)

    def delete(self, key: PoolKey) -> bool:
        self._drop_idle()
        return self._remove(key)

    def _hold_to_bounds(self, owner: str) -> None:
        b = self.bounds
        share = self._shares.get(owner) if owner else None  # without keys, all are one owner
        while share is not None and (
            _past(len(share.keys), b.entries_per_owner) or _past(share.bytes, b.bytes_per_owner)
        ):
            self._remove(next(iter(share.keys)))
            share = self._shares.get(owner)
        while _past(len(self._entries), b.entries) or _past(self.bytes, b.bytes):
            self._remove(self._oldest_of_the_largest(_past(len(self._entries), b.entries)))

    def _oldest_of_the_largest(self, by_entries: bool) -> PoolKey:
        """The least recently used entry of the owners holding the most (with one owner, or
        all alike, the pool is one LRU)."""

        def weight(share: _Share) -> int:
            return len(share.keys) if by_entries else share.bytes

        most = max(weight(share) for share in self._shares.values())
        return next(k for k, e in self._entries.items() if weight(self._shares[e.owner]) == most)

    def _drop_idle(self) -> None:
        deadline = self._clock() - self.idle_seconds
        while self._entries:
            oldest_key, entry = next(iter(self._entries.items()))
            if entry.used > deadline:
                return
            self._remove(oldest_key)

    def _remove(self, key: PoolKey) -> bool:
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        share = self._shares[entry.owner]
        del share.keys[key]
        share.bytes -= entry.size
        self.bytes -= entry.size
        if not share.keys:
            del self._shares[entry.owner]
        return True


def _past(count: int, bound: int) -> bool:
    return bool(bound) and count > bound


class Bounded(Generic[V]):
    """One kind of value in a pool: its keys apart from the other kinds', each value's owner
    read from its key (`owner_at`, the key's element naming it) and its size measured by
    `size`."""

    def __init__(self, pool: Pool, kind: str, size: Callable[[V], int], owner_at: int) -> None:
        self.pool = pool
        self._kind = kind
        self._size = size
        self._owner_at = owner_at

    def _key(self, key: PoolKey) -> PoolKey:
        return (self._kind, *key)

    def owner(self, key: PoolKey) -> str:
        return key[self._owner_at] if len(key) > self._owner_at else ""

    def get(self, key: PoolKey) -> V | None:
        return cast("V | None", self.pool.get(self._key(key)))

    def put(self, key: PoolKey, value: V) -> None:
        self.pool.put(self._key(key), self.owner(key), value, self._size(value))

    def delete(self, key: PoolKey) -> bool:
        return self.pool.delete(self._key(key))
