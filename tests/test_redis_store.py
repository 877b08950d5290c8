"""The Redis continuation store on a real redis-server: layout, TTL, SET NX, Redis down."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from redis_server import RedisServer, running_redis

from clients import wait_for
from gateway.stores.redis_shares import share_bytes_key, share_key
from gateway.stores.redis_store import RedisClaim, RedisStore, history_key, running_key
from protocols.errors import ErrorKind, GenerationError
from protocols.events import History, token_array
from serving import LoopThread

T = TypeVar("T")


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_a_history_is_one_key_of_packed_token_ids_text_and_eos(redis_server: RedisServer) -> None:
    histories = {
        "a": History(token_array([1, 70000, 2**31 - 1]), "héllo ✓", True),
        "b": History(token_array([]), ""),
    }

    async def round_trip() -> dict[str, History] | None:
        store = RedisStore(redis_server.url, 60)
        await store.save(("owner", "a", "b"), histories)
        loaded = await store.load(("owner", "a", "b"))
        assert await store.load(("owner", "b", "a")) is None  # another order, another key
        await store.close()
        return loaded

    assert run(round_trip()) == histories
    name = history_key(("owner", "a", "b"))
    keys = set(redis_server.client.keys("*"))
    assert keys == {k.encode() for k in (name, share_key("owner"), share_bytes_key("owner"))}
    raw = redis_server.client.get(name)
    assert isinstance(raw, bytes)
    assert struct.pack("<3i", 1, 70000, 2**31 - 1) in raw  # 4 bytes a token, little-endian
    assert "héllo ✓".encode() in raw


def test_the_idle_limit_is_a_ttl_renewed_by_each_use(redis_server: RedisServer) -> None:
    key = ("", "ttl")
    name = history_key(key)
    client = redis_server.client

    async def save(idle: float) -> None:
        store = RedisStore(redis_server.url, idle)
        await store.save(key, {"ttl": History(token_array([5]), "x")})
        await store.close()

    async def load() -> dict[str, History] | None:
        store = RedisStore(redis_server.url, 100)
        try:
            return await store.load(key)
        finally:
            await store.close()

    run(save(100))
    assert 0 < client.pttl(name) <= 100_000
    client.pexpire(name, 5_000)
    assert run(load()) is not None
    assert client.pttl(name) > 5_000  # a read renews the idle limit

    run(save(0.05))
    wait_for(lambda: not client.exists(name))  # Redis drops it once idle for 50 ms
    assert run(load()) is None  # a dropped key starts afresh


def test_a_request_id_generating_in_one_gateway_is_refused_by_another(
    redis_server: RedisServer,
) -> None:
    async def scenario() -> None:
        first, second = RedisStore(redis_server.url, 60), RedisStore(redis_server.url, 60)
        held = await first.claim("", ["x", "y"])
        assert held.refused == frozenset()
        name = running_key("", "x")
        assert 0 < redis_server.client.pttl(name) <= 30_000  # SET NX PX: a lease

        refused = await second.claim("", ["x", "z"])
        assert refused.refused == {"x"}  # z was free: it is the second's now
        others = await second.claim("other-owner", ["x"])
        assert others.refused == frozenset()  # ids are the owner's: another owner's x is free
        assert (await first.claim("", ["z"])).refused == {"z"}  # refused: nothing to release

        await held.release()
        assert not redis_server.client.exists(name)
        again = await second.claim("", ["x"])
        assert again.refused == frozenset()
        for claim in (refused, others, again):
            await claim.release()
        await first.close()
        await second.close()

    run(scenario())


def test_a_lease_is_renewed_while_its_request_runs(redis_server: RedisServer) -> None:
    loop = LoopThread()  # the store runs there while this thread watches it
    try:
        store = RedisStore(redis_server.url, 60, lease_seconds=0.3)
        claim = loop.run(store.claim("", ["long"]))
        assert isinstance(claim, RedisClaim)
        wait_for(lambda: claim.renewals >= 4)
        # Renewed 4 times a third of a lease apart: older than the lease, and still held.
        assert loop.run(store.claim("", ["long"])).refused == {"long"}
        loop.run(claim.release())
        again = loop.run(store.claim("", ["long"]))
        assert again.refused == frozenset()
        loop.run(again.release())
        loop.run(store.close())
    finally:
        loop.stop()


def test_redis_down_fails_each_call_naming_it_and_recovers(redis_server: RedisServer) -> None:
    store_holder: list[RedisStore] = []

    async def open_store() -> None:
        store_holder.append(RedisStore(redis_server.url, 60))
        assert await store_holder[0].problem() is None
        await store_holder[0].save(("", "k"), {"k": History(token_array([1]), "k")})

    async def calls() -> list[GenerationError]:
        store = store_holder[0]
        errors: list[GenerationError] = []
        for call in (
            store.load(("", "k")),
            store.save(("", "k"), {}),
            store.claim("", ["k"]),
        ):
            with pytest.raises(GenerationError) as caught:
                await call
            errors.append(caught.value)
        problem = await store.problem()
        assert problem is not None and f"Redis at {redis_server.url}" in problem
        return errors

    async def works_again() -> None:
        store = store_holder[0]
        assert await store.problem() is None
        assert await store.load(("", "k")) is None  # nothing was persisted
        await store.close()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(open_store())
        redis_server.stop()
        errors = loop.run_until_complete(calls())
        assert {e.kind for e in errors} == {ErrorKind.ENGINE_UNAVAILABLE}
        for e in errors:
            assert e.message.startswith(
                f"The continuation store (Redis at {redis_server.url}) cannot be reached"
            )
        redis_server.start()
        loop.run_until_complete(works_again())
    finally:
        loop.close()


def test_health_answers_while_redis_answers_nothing(redis_server: RedisServer) -> None:
    async def problem() -> str | None:
        store = RedisStore(redis_server.url, 60)
        try:
            assert await store.problem() is None  # a connection in the pool
            redis_server.freeze(True)
            return await store.problem()
        finally:
            redis_server.freeze(False)
            await store.close()

    found = run(problem())
    assert found is not None and found.startswith(
        f"The continuation store (Redis at {redis_server.url}) cannot be reached: no answer"
    )
