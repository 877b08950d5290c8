"""Background responses' event logs without an engine: in this process and in a real
redis-server, each read from any point, waiting for what comes, to the log's end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from redis_server import RedisServer, running_redis

from gateway.stores.event_log import EventLog, InProcessEventLog
from gateway.stores.pool import Bounds, Pool
from gateway.stores.redis_events import RedisEventLog, events_key
from gateway.stores.redis_store import RedisStore
from protocols.sse import split_events, sse_event

KEY = ("events", "owner", "resp_1")


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


def in_process() -> EventLog:
    return InProcessEventLog(Pool(Bounds(8), 60))


async def collected(events: AsyncIterator[bytes]) -> list[bytes]:
    return [event async for event in events]


async def written_while_read(log: EventLog) -> None:
    """Two readers from two points while the writer appends; a late reader; an unknown key."""
    await log.append(KEY, 0, [b"e0", b"e1"])
    whole = asyncio.create_task(collected(log.read(KEY, -1)))
    tail = asyncio.create_task(collected(log.read(KEY, 1)))
    await log.append(KEY, 2, [b"e2"])
    await log.append(KEY, 3, [b"e3", b"e4"])
    await log.end(KEY)
    assert await whole == [b"e0", b"e1", b"e2", b"e3", b"e4"]
    assert await tail == [b"e2", b"e3", b"e4"]
    assert await collected(log.read(KEY, 3)) == [b"e4"]  # after the end: what is kept
    assert await collected(log.read(KEY, 4)) == []
    assert await collected(log.read(("events", "owner", "other"), -1)) == []
    await log.delete(KEY)
    assert await collected(log.read(KEY, -1)) == []


def test_a_redis_writer_learns_with_its_next_events_that_another_gateway_asked_it_to_stop(
    redis_server: RedisServer,
) -> None:
    async def check() -> None:
        store = RedisStore(redis_server.url, 60)
        writer, other = RedisEventLog(store), RedisEventLog(store)
        assert await writer.append(KEY, 0, [b"e0"]) is False
        assert await other.ask_to_stop(KEY) is True
        assert await writer.append(KEY, 1, [b"e1"]) is True
        await writer.end(KEY)
        await writer.delete(KEY)
        await store.close()

    asyncio.run(check())
    assert redis_server.client.keys("*") == []  # deleted with its events


def test_in_process_readers_get_every_event_once_in_order() -> None:
    asyncio.run(written_while_read(in_process()))


def test_redis_readers_get_every_event_once_in_order(redis_server: RedisServer) -> None:
    async def check() -> None:
        store = RedisStore(redis_server.url, 60)
        try:
            await written_while_read(RedisEventLog(store))
        finally:
            await store.close()

    asyncio.run(check())


def test_a_redis_log_is_a_stream_with_the_histories_ttl(redis_server: RedisServer) -> None:
    async def write() -> None:
        store = RedisStore(redis_server.url, 60)
        log = RedisEventLog(store)
        await log.append(KEY, 0, [b"e0"])
        await log.end(KEY)
        await store.close()

    asyncio.run(write())
    name = events_key(KEY)
    assert redis_server.client.type(name) == b"stream"
    assert 0 < int(redis_server.client.pttl(name)) <= 60_000
    ids = [entry_id for entry_id, _ in redis_server.client.xrange(name)]  # type: ignore[union-attr]
    assert ids == [b"1-0", b"2-0"]  # the event by its sequence number, then the end


def test_an_in_process_log_being_written_outlives_the_bound() -> None:
    async def check() -> None:
        log = InProcessEventLog(Pool(Bounds(1), 60))
        await log.append(KEY, 0, [b"running"])
        other = ("events", "owner", "resp_2")
        await log.append(other, 0, [b"x"])
        await log.end(other)  # KEY's went past the bound, but it is being written: it stays
        reader = log.read(KEY, -1)
        assert await anext(reader) == b"running"
        await log.append(KEY, 1, [b"still"])
        await log.end(KEY)
        assert await collected(reader) == [b"still"]

    asyncio.run(check())


def test_a_reader_that_leaves_stops_reading() -> None:
    async def check() -> None:
        log = in_process()
        await log.append(KEY, 0, [b"e0"])
        reader = log.read(KEY, -1)
        assert await anext(reader) == b"e0"
        await reader.aclose()

    asyncio.run(check())


def test_framed_events_split_one_by_one() -> None:
    framed = [sse_event(b'{"a":1}', "response.created"), sse_event(b'{"b":"x\\ny"}', "e")]
    assert split_events(b"".join(framed)) == framed
