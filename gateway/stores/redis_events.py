"""Background responses' events in Redis (REDIS_URL): one Redis stream per response,
`llm-gateway:events:<its key as JSON>`, so a reader on any gateway sharing the Redis gets the
same events.

An event's entry id is `1-<its sequence_number>`, so a reader starting after N reads from
`1-N`; the log's end is the entry `2-0` (field `end`), after every event. Readers block on
XREAD a second at a time (no polling between events: Redis answers as an entry comes) and stop
at the end, or when the stream is gone. The stream's TTL is the idle time of the histories
(CONTINUATION_IDLE_SECONDS), renewed by every write; its length is bounded by its response's
(one event per streamed delta and a few more), and its bytes count toward its API key's share
(gateway/stores/redis_shares.py), weighed as they are written. A `cancel` on a gateway that does
not run the response sets `llm-gateway:stop:<the key>`, which the writer reads in the same
transaction as its next events.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any, cast

import msgspec
from redis.asyncio import Redis

from gateway.stores.continuation import Key
from gateway.stores.redis_shares import PREFIX
from gateway.stores.redis_store import RedisStore, document_owner

_KEY_ENCODER = msgspec.json.Encoder()
BLOCK_MS = 1000  # one XREAD's wait, well within the client's socket timeout
END_ID = "2-0"


def events_key(key: Key) -> str:
    return PREFIX + "events:" + _KEY_ENCODER.encode(list(key)).decode()


def stop_key(key: Key) -> str:
    """Set by `ask_to_stop`: the writer, on whichever gateway, sees it with its next events."""
    return PREFIX + "stop:" + _KEY_ENCODER.encode(list(key)).decode()


class RedisEventLog:
    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.redis: Redis = store.redis
        self.idle_ms = store.idle_ms

    async def append(self, key: Key, first: int, events: Sequence[bytes]) -> bool:
        name = events_key(key)
        with self.store.reaching():
            async with self.redis.pipeline(transaction=True) as pipe:
                for n, event in enumerate(events, first):
                    pipe.xadd(name, {"e": event}, id=f"1-{n}")
                pipe.pexpire(name, self.idle_ms)
                pipe.exists(stop_key(key))  # in the same round trip: no cost of its own
                await self.store.shares.grew(document_owner(key), name, _bytes(events), pipe)
                answers = await pipe.execute()
        return bool(answers[-2])

    async def ask_to_stop(self, key: Key) -> bool:
        with self.store.reaching():
            await self.redis.set(stop_key(key), b"1", px=self.idle_ms)
        return True

    async def end(self, key: Key) -> None:
        name = events_key(key)
        with self.store.reaching():
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.xadd(name, {"end": b"1"}, id=END_ID)
                pipe.pexpire(name, self.idle_ms)
                await self.store.shares.grew(document_owner(key), name, 0, pipe)
                await pipe.execute()

    async def read(self, key: Key, after: int) -> AsyncGenerator[bytes, None]:
        name = events_key(key)
        last = f"1-{after}" if after >= 0 else "0-0"
        with self.store.reaching():
            if not await self.redis.exists(name):
                return
        while True:
            with self.store.reaching():
                found = cast(list[Any], await self.redis.xread({name: last}, block=BLOCK_MS))
                if not found and not await self.redis.exists(name):
                    return
            for _, entries in found:
                for entry_id, fields in entries:
                    if b"end" in fields:
                        return
                    yield fields[b"e"]
                    last = entry_id.decode() if isinstance(entry_id, bytes) else entry_id

    async def delete(self, key: Key) -> None:
        with self.store.reaching():
            await self.store.shares.delete(document_owner(key), events_key(key))
            await self.redis.delete(stop_key(key))


def _bytes(events: Sequence[bytes]) -> int:
    return sum(len(e) for e in events)
