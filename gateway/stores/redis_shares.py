"""Each API key's share of Redis (REDIS_URL): its histories, stored responses and background
responses' event streams bounded in entries and bytes (CONTINUATION_MAX_ENTRIES_PER_KEY,
CONTINUATION_MAX_BYTES_PER_KEY), so one key's flood evicts only its own.

Per owner (the key's SHA-256; "" without keys, counted but not bounded: it is everyone),
`llm-gateway:share:<owner>` is a sorted set of the Redis keys it holds, each scored by its
last use (Redis's clock, in microseconds), and `llm-gateway:share-bytes:<owner>` a hash of
their sizes, its field `#` their sum. One Lua script, atomic on any number of gateways, reads
(GETEX, renewing the TTL), writes (SET PX) or weighs what a pipeline wrote (an event stream's
new entries), then drops what the owner holds past its bounds, least recently used first. A
member unused for the idle time has expired with its TTL: the script forgets it first. The
share's own keys expire with the last of its members. The total is Redis's own `maxmemory`
(docs/SCALE-OUT.md).
"""

from __future__ import annotations

from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from gateway.stores.pool import Bounds

PREFIX = "llm-gateway:"  # every key the gateway writes in Redis
UNBOUNDED = Bounds(0)

_SCRIPT = """
local share, sizes, entry = KEYS[1], KEYS[2], KEYS[3]
local op, idle_ms = ARGV[1], tonumber(ARGV[2])
local max_entries, max_bytes = tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
-- as strings: Lua writes a number past 14 digits in floating point, losing microseconds
local now = string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))
local stale = string.format('%d', tonumber(now) - idle_ms * 1000)
local total = tonumber(redis.call('HGET', sizes, '#') or '0')
local function forget(member)
  total = total - tonumber(redis.call('HGET', sizes, member) or '0')
  redis.call('HDEL', sizes, member)
  redis.call('ZREM', share, member)
end
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', share, '-inf', stale)) do
  forget(gone)
end
local result = false
if op == 'get' then
  result = redis.call('GETEX', entry, 'PX', idle_ms)
  if result then redis.call('ZADD', share, 'XX', now, entry) end
elseif op == 'del' then
  result = redis.call('DEL', entry)
  forget(entry)
else
  local size = tonumber(ARGV[5])
  if op == 'set' then
    redis.call('SET', entry, ARGV[6], 'PX', idle_ms)
  else  -- 'grew': a pipeline wrote `size` more bytes to it
    size = size + tonumber(redis.call('HGET', sizes, entry) or '0')
  end
  forget(entry)
  redis.call('ZADD', share, now, entry)
  redis.call('HSET', sizes, entry, string.format('%d', size))
  total = total + size
  while (max_entries > 0 and redis.call('ZCARD', share) > max_entries)
      or (max_bytes > 0 and total > max_bytes) do
    local oldest = redis.call('ZRANGE', share, 0, 0)[1]
    if not oldest then break end
    redis.call('DEL', oldest)
    forget(oldest)
  end
end
if redis.call('ZCARD', share) == 0 then
  redis.call('DEL', share, sizes)
else
  redis.call('HSET', sizes, '#', string.format('%d', total))
  redis.call('PEXPIRE', share, idle_ms)
  redis.call('PEXPIRE', sizes, idle_ms)
end
return result
"""


def share_key(owner: str) -> str:
    return PREFIX + "share:" + owner


def share_bytes_key(owner: str) -> str:
    return PREFIX + "share-bytes:" + owner


class Shares:
    """The script's four operations on one Redis key (`entry`) of one owner."""

    def __init__(self, redis: Redis, idle_ms: int, bounds: Bounds) -> None:
        self._script = redis.register_script(_SCRIPT)
        self._bounds = (idle_ms, bounds.entries_per_owner, bounds.bytes_per_owner)

    async def _run(
        self, owner: str, entry: str, op: str, *args: Any, client: Redis | None = None
    ) -> Any:
        keys = [share_key(owner), share_bytes_key(owner), entry]
        idle_ms, entries, size = self._bounds
        if not owner:  # without keys, all are one owner: Redis's maxmemory is its bound
            entries = size = 0
        given = [op, idle_ms, entries, size, *args]
        return await self._script(keys=keys, args=given, client=client)

    async def get(self, owner: str, entry: str) -> bytes | None:
        return cast(bytes | None, await self._run(owner, entry, "get"))

    async def set(self, owner: str, entry: str, value: bytes) -> None:
        await self._run(owner, entry, "set", len(value), value)

    async def grew(self, owner: str, entry: str, size: int, pipe: Pipeline) -> None:
        """Queued on `pipe`, after what it writes to `entry`."""
        await self._run(owner, entry, "grew", size, client=pipe)

    async def delete(self, owner: str, entry: str) -> bool:
        return bool(await self._run(owner, entry, "del"))
