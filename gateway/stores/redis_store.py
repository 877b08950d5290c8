"""Continuation histories in Redis (REDIS_URL), shared by every gateway that names it.

One Redis key per continuation key, `llm-gateway:history:<the key as JSON>`, holding per
request_id its token ids packed 4 bytes each (little-endian), its text and its EOS flag
(msgpack). The idle limit is the key's TTL, renewed by every read (GETEX) and write (SET PX).
A document (a stored response) is `llm-gateway:document:<its key as JSON>`, its bytes as given,
with the same TTL. What each API key holds is bounded (gateway/stores/redis_shares.py: every
read and write goes through its script); what Redis keeps in all is its `maxmemory`'s business.
A request_id generating is `llm-gateway:running:<[owner, id] as JSON>`, taken with SET NX PX
(redis-py's `Lock`): another gateway's SET fails, so it refuses the id. The lease is renewed
while the request runs, so a gateway that dies frees its ids within one lease.

Redis unreachable: every call raises `GenerationError(engine_unavailable)` naming it; nothing
else in the gateway depends on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterator
from contextlib import contextmanager, suppress
from urllib.parse import urlsplit

import msgspec
from redis.asyncio import Redis
from redis.asyncio.lock import Lock
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.stores.continuation import Claim, Key, packed_ids, unpacked_ids
from gateway.stores.pool import Bounds
from gateway.stores.redis_shares import PREFIX, UNBOUNDED, Shares
from protocols.errors import ErrorKind, GenerationError
from protocols.events import History

log = logging.getLogger(__name__)
LEASE_SECONDS = 30.0  # how long a dead gateway's request_ids stay refused
HEALTH_SECONDS = 1.0


class _Packed(msgspec.Struct, array_like=True):
    token_ids: bytes  # int32, little-endian
    text: str
    ended_at_eos: bool
    adapter: str | None = None  # last, with defaults: histories packed before them still read
    model: str | None = None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(dict[str, _Packed])
_KEY_ENCODER = msgspec.json.Encoder()


def pack(histories: dict[str, History]) -> bytes:
    return _ENCODER.encode(
        {
            rid: _Packed(packed_ids(h.token_ids), h.text, h.ended_at_eos, h.adapter, h.model)
            for rid, h in histories.items()
        }
    )


def unpack(raw: bytes) -> dict[str, History]:
    histories = {}
    for rid, packed in _DECODER.decode(raw).items():
        ids = unpacked_ids(packed.token_ids)
        histories[rid] = History(
            ids, packed.text, packed.ended_at_eos, packed.adapter, packed.model
        )
    return histories


def history_owner(key: Key) -> str:
    """A history's key begins with its owner."""
    return key[0] if key else ""


def document_owner(key: Key) -> str:
    """A document's (and an event log's) key begins with its kind, then its owner."""
    return key[1] if len(key) > 1 else ""


def history_key(key: Key) -> str:
    return PREFIX + "history:" + _KEY_ENCODER.encode(list(key)).decode()


def document_key(key: Key) -> str:
    return PREFIX + "document:" + _KEY_ENCODER.encode(list(key)).decode()


def running_key(owner: str, request_id: str) -> str:
    return PREFIX + "running:" + _KEY_ENCODER.encode([owner, request_id]).decode()


def redacted(url: str) -> str:
    """The URL without its password, to name the store in errors and logs."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    where = f"{host}:{parts.port}" if parts.port else host
    return f"{parts.scheme}://{where}{parts.path}" if where else parts.scheme + "://"


class RedisStore:
    def __init__(
        self,
        url: str,
        idle_seconds: float,
        *,
        lease_seconds: float = LEASE_SECONDS,
        bounds: Bounds = UNBOUNDED,
    ) -> None:
        self.where = redacted(url)
        self.idle_ms = max(1, int(idle_seconds * 1000))
        self.lease_seconds = lease_seconds
        # One immediate retry: a pooled connection may be stale after Redis restarted.
        self.redis = Redis.from_url(
            url, socket_connect_timeout=2, socket_timeout=5, retry=Retry(NoBackoff(), 1)
        )
        self.shares = Shares(self.redis, self.idle_ms, bounds)

    @contextmanager
    def reaching(self) -> Iterator[None]:
        try:
            yield
        except RedisError as e:
            raise GenerationError(ErrorKind.ENGINE_UNAVAILABLE, self._unreachable(e)) from e

    def _unreachable(self, error: Exception) -> str:
        return (
            f"The continuation store (Redis at {self.where}) cannot be reached: {error}. "
            "Requests without request_ids are served meanwhile"
        )

    async def load(self, key: Key) -> dict[str, History] | None:
        with self.reaching():
            raw = await self.shares.get(history_owner(key), history_key(key))
        return None if raw is None else unpack(raw)

    async def save(self, key: Key, histories: dict[str, History]) -> None:
        with self.reaching():
            await self.shares.set(history_owner(key), history_key(key), pack(histories))

    async def load_document(self, key: Key) -> bytes | None:
        with self.reaching():
            return await self.shares.get(document_owner(key), document_key(key))

    async def save_document(self, key: Key, document: bytes) -> None:
        with self.reaching():
            await self.shares.set(document_owner(key), document_key(key), document)

    async def delete_document(self, key: Key) -> bool:
        with self.reaching():
            return await self.shares.delete(document_owner(key), document_key(key))

    async def claim(self, owner: str, request_ids: Collection[str]) -> Claim:
        locks: list[Lock] = []
        refused: set[str] = set()
        try:
            with self.reaching():
                for rid in request_ids:
                    lock = self.redis.lock(
                        running_key(owner, rid), self.lease_seconds, thread_local=False
                    )
                    if await lock.acquire(blocking=False):
                        locks.append(lock)
                    else:
                        refused.add(rid)
        except GenerationError:
            await RedisClaim(locks, frozenset(), 0.0).release()
            raise
        return RedisClaim(locks, frozenset(refused), self.lease_seconds)

    async def problem(self) -> str | None:
        """Bounded well within a probe's timeout, so that /health answers even when Redis
        does not."""
        try:
            async with asyncio.timeout(HEALTH_SECONDS):
                await self.redis.ping()
        except RedisError as e:
            return self._unreachable(e)
        except TimeoutError:
            return self._unreachable(TimeoutError(f"no answer within {HEALTH_SECONDS} s"))
        return None

    async def close(self) -> None:
        await self.redis.aclose()


class RedisClaim:
    """The leases of one payload's request_ids, renewed every third of a lease until released."""

    def __init__(self, locks: list[Lock], refused: frozenset[str], lease_seconds: float) -> None:
        self.refused = refused
        self.renewals = 0
        self._locks = locks
        self._renewing = (
            asyncio.create_task(self._renew(lease_seconds / 3)) if locks and lease_seconds else None
        )

    async def _renew(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                for lock in self._locks:
                    await lock.reacquire()
            except RedisError as e:  # the lease may lapse; the generation goes on
                log.warning("could not renew a request_id's lease in Redis: %s", e)
            else:
                self.renewals += 1

    async def release(self) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
            with suppress(asyncio.CancelledError):
                await self._renewing
        for lock in self._locks:
            try:
                await lock.release()
            except RedisError as e:  # the lease lapses by itself
                log.warning("could not release a request_id's lease in Redis: %s", e)
