"""The admission gate and the continuation store, on their own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from gateway.engine_path.admission import Admission
from gateway.stores.continuation import InProcessStore
from gateway.stores.pool import Bounded, Bounds, Pool
from protocols.errors import ErrorKind, GenerationError
from protocols.events import History, token_array


def test_admission_is_fifo_bounded_and_survives_cancellation() -> None:
    async def scenario() -> list[str]:
        gate = Admission(max_running=1, max_waiting=2)
        order: list[str] = []
        release = asyncio.Event()

        async def job(name: str) -> None:
            async with gate.slot():
                order.append(name)
                await release.wait()

        first = asyncio.create_task(job("first"))
        await asyncio.sleep(0)
        second = asyncio.create_task(job("second"))
        third = asyncio.create_task(job("third"))
        await asyncio.sleep(0)
        assert (gate.running, gate.waiting) == (1, 2)
        with pytest.raises(GenerationError) as caught:
            async with gate.slot():
                pass
        assert caught.value.kind is ErrorKind.RATE_LIMITED
        second.cancel()  # a waiter that leaves gives up its place
        await asyncio.sleep(0)
        assert gate.waiting == 1
        release.set()
        await asyncio.gather(first, third)
        assert (gate.running, gate.waiting) == (0, 0)
        return order

    assert asyncio.run(scenario()) == ["first", "third"]


def histories(
    max_entries: int, idle_seconds: float, clock: Callable[[], float] = time.monotonic
) -> Bounded[dict[str, History]]:
    return InProcessStore(Pool(Bounds(max_entries), idle_seconds, clock)).histories


def test_store_evicts_the_least_recently_used_and_the_idle() -> None:
    now = [0.0]
    store = histories(2, 10, lambda: now[0])
    store.put(("a",), {"a": History(token_array([1]), "a")})
    store.put(("b",), {"b": History(token_array([2]), "b")})
    assert store.get(("a",)) is not None  # a is now the most recently used
    store.put(("c",), {"c": History(token_array([3]), "c")})
    assert store.get(("b",)) is None and store.get(("a",)) is not None
    now[0] = 11.0
    assert store.get(("c",)) is None and len(store.pool) == 0
    assert store.get(("a", "b")) is None


def test_store_drops_an_entry_idle_for_idle_seconds_counted_from_its_last_use() -> None:
    now = [0.0]
    store = histories(10, 10, lambda: now[0])
    store.put(("a",), {"a": History(token_array([1]), "a")})
    store.put(("b",), {"b": History(token_array([2]), "b")})
    now[0] = 6.0
    assert store.get(("a",)) is not None  # used at 6: idle from then on
    now[0] = 12.0
    assert store.get(("b",)) is None  # unused for 12 s
    assert store.get(("a",)) is not None  # idle for 6 s only; used again at 12
    now[0] = 21.0
    assert store.get(("a",)) is not None  # idle for 9 s
    now[0] = 31.5
    assert store.get(("a",)) is None and len(store.pool) == 0
    store.put(("a",), {"a": History(token_array([1, 5]), "a e")})  # a dropped key starts afresh
    found = store.get(("a",))
    assert found is not None and list(found["a"].token_ids) == [1, 5]


def test_a_store_of_size_zero_keeps_nothing() -> None:
    store = histories(0, 10)
    store.put(("a",), {"a": History(token_array([1]), "a")})
    assert store.get(("a",)) is None
