"""What is kept for callers is bounded per API key as well as in total (docs/SECURITY.md,
"Stored state"): one key's flood of stored responses evicts only its own, in this process
(gateway/stores/pool.py) and in Redis (gateway/stores/redis_shares.py). The pool and the Redis
store on their own first, then the gateway with the `openai` client and two keys."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import openai
import pytest
from redis_server import RedisServer, running_redis

from gateway.stores.continuation import InProcessStore
from gateway.stores.event_log import InProcessEventLog
from gateway.stores.pool import Bounds, Pool
from gateway.stores.redis_shares import share_bytes_key, share_key
from gateway.stores.redis_store import RedisStore, document_key
from serving import RunningServer

MODEL = "SmolLM2-135M-Instruct"
ALICE, BOB = "sk-shares-alice", "sk-shares-bob"
FLOOD = 10  # alice's responses: past both bounds below


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


def doc(owner: str, n: int) -> tuple[str, ...]:
    return ("response", owner, f"resp_{n}")


def test_an_owner_past_its_own_bound_loses_its_own_oldest() -> None:
    async def check() -> None:
        store = InProcessStore(Pool(Bounds(100, entries_per_owner=3), 60))
        await store.save_document(doc("bob", 0), b"bob's")
        for n in range(FLOOD):
            await store.save_document(doc("alice", n), b"alice's")
        assert await store.load_document(doc("bob", 0)) == b"bob's"
        kept = [n for n in range(FLOOD) if await store.load_document(doc("alice", n))]
        assert kept == [FLOOD - 3, FLOOD - 2, FLOOD - 1]
        assert store.pool.held("alice") == (3, 3 * len(b"alice's"))

    asyncio.run(check())


def test_a_full_pool_takes_from_whoever_holds_the_most() -> None:
    async def check() -> None:
        store = InProcessStore(Pool(Bounds(4), 60))  # no share of its own: only the total
        await store.save_document(doc("bob", 0), b"b")
        for n in range(FLOOD):
            await store.save_document(doc("alice", n), b"a")
        assert await store.load_document(doc("bob", 0)) == b"b"
        assert store.pool.held("alice") == (3, 3) and len(store.pool) == 4

    asyncio.run(check())


def test_bytes_are_bounded_per_owner_and_in_total() -> None:
    async def check() -> None:
        store = InProcessStore(Pool(Bounds(100, bytes=250, bytes_per_owner=100), 60))
        await store.save_document(doc("bob", 0), b"b" * 60)
        await store.save_document(doc("carol", 0), b"c" * 90)
        for n in range(FLOOD):
            await store.save_document(doc("alice", n), b"a" * 40)
        assert store.pool.held("alice") == (2, 80)  # her own bound
        assert await store.load_document(doc("bob", 0)) is not None
        await store.save_document(doc("bob", 1), b"b" * 30)  # 260 in all: carol holds most
        assert await store.load_document(doc("carol", 0)) is None
        assert store.pool.held("bob") == (2, 90) and store.pool.bytes == 170
        await store.save_document(doc("alice", 99), b"a" * 101)  # larger than her share
        assert await store.load_document(doc("alice", 99)) is None

    asyncio.run(check())


def test_without_keys_only_the_total_applies() -> None:
    """Without API keys every caller is the one owner "": a bound of its own would only be a
    smaller total."""

    async def check() -> None:
        store = InProcessStore(Pool(Bounds(6, entries_per_owner=2), 60))
        for n in range(FLOOD):
            await store.save_document(doc("", n), b"x")
        assert store.pool.held("") == (6, 6)

    asyncio.run(check())


def test_histories_documents_and_event_logs_share_an_owners_bound() -> None:
    async def check() -> None:
        pool = Pool(Bounds(100, entries_per_owner=2), 60)
        store, log = InProcessStore(pool), InProcessEventLog(pool)
        await store.save_document(doc("bob", 0), b"bob's")
        await store.save_document(doc("alice", 0), b"alice's")
        for n in range(FLOOD):  # her background responses' events
            key = ("events", "alice", f"resp_{n}")
            await log.append(key, 0, [b"event"])
            await log.end(key)
        assert await store.load_document(doc("alice", 0)) is None
        assert await store.load_document(doc("bob", 0)) == b"bob's"
        assert pool.held("alice") == (2, 2 * len(b"event"))

    asyncio.run(check())


def test_in_redis_an_owner_past_its_bounds_loses_its_own_oldest(
    redis_server: RedisServer,
) -> None:
    async def check() -> None:
        store = RedisStore(redis_server.url, 60, bounds=Bounds(0, 0, 3, 100))
        await store.save_document(doc("bob", 0), b"bob's")
        for n in range(FLOOD):
            await store.save_document(doc("alice", n), b"alice's")
        assert await store.load_document(doc("bob", 0)) == b"bob's"
        kept = [n for n in range(FLOOD) if await store.load_document(doc("alice", n))]
        assert kept == [FLOOD - 3, FLOOD - 2, FLOOD - 1]
        assert await store.load_document(doc("alice", FLOOD - 3)) is not None  # now the newest
        await store.save_document(doc("alice", 50), b"a" * 90)  # past her 100 bytes
        kept = [
            n
            for n in (FLOOD - 2, FLOOD - 1, FLOOD - 3, 50)
            if await store.load_document(doc("alice", n))
        ]
        assert kept == [FLOOD - 3, 50]
        assert await store.delete_document(doc("alice", 50))
        await store.close()

    asyncio.run(check())
    client = redis_server.client
    alice = share_bytes_key("alice")
    assert client.hget(alice, "#") == str(len(b"alice's")).encode()
    assert client.zrange(share_key("alice"), 0, -1) == [
        document_key(doc("alice", FLOOD - 3)).encode()
    ]
    assert client.exists(document_key(doc("alice", 0))) == 0


# --- the gateway, with the `openai` client's Responses API and two keys ---------------------


def client(server: RunningServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.http + "/v1", api_key=key, max_retries=0)


def one_token(server: RunningServer, key: str, previous: str | None = None) -> str:
    made = client(server, key).responses.create(
        model=MODEL,
        input="Say hi.",
        max_output_tokens=1,
        temperature=0,
        previous_response_id=previous,
    )
    return made.id


def floods_leave_the_other_keys_responses(server: RunningServer) -> None:
    bob = one_token(server, BOB)
    alices = [one_token(server, ALICE) for _ in range(FLOOD)]
    assert client(server, BOB).responses.retrieve(bob).id == bob
    one_token(server, BOB, previous=bob)  # his conversation goes on
    with pytest.raises(openai.NotFoundError):
        client(server, ALICE).responses.retrieve(alices[0])  # her flood evicted her own
    assert client(server, ALICE).responses.retrieve(alices[-1]).id == alices[-1]


@pytest.mark.parametrize(
    "bounds",
    [
        {"CONTINUATION_MAX_ENTRIES_PER_KEY": "4"},
        {"CONTINUATION_MAX_ENTRIES": "6", "CONTINUATION_MAX_ENTRIES_PER_KEY": "0"},
    ],
    ids=["per-key", "total"],
)
def test_one_keys_flood_leaves_anothers_stored_responses(
    make_server: Callable[..., RunningServer], bounds: dict[str, str]
) -> None:
    floods_leave_the_other_keys_responses(make_server(API_KEYS=f"{ALICE},{BOB}", **bounds))


def test_with_redis_one_keys_flood_leaves_anothers_stored_responses(
    make_server: Callable[..., RunningServer], redis_server: RedisServer
) -> None:
    server = make_server(
        API_KEYS=f"{ALICE},{BOB}", REDIS_URL=redis_server.url, CONTINUATION_MAX_ENTRIES_PER_KEY="4"
    )
    floods_leave_the_other_keys_responses(server)
