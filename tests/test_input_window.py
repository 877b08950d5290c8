"""The embedding model's window into its engine (gateway/engine_path/input_window.py), without
an engine: its bounds, whose input goes in next, and a cancelled wait."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.engine_path.input_window import Entry, InputWindow


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


async def settle() -> None:
    """Every task that can run runs, until all wait (turns of the loop, not time)."""
    for _ in range(10):
        await asyncio.sleep(0)


class Held:
    """Inputs holding their places until released, in the order they went in."""

    def __init__(self, window: InputWindow) -> None:
        self.window = window
        self.entered: list[tuple[str, Entry]] = []
        self.release: dict[str, asyncio.Event] = {}
        self.tasks: list[asyncio.Task[None]] = []

    def send(self, caller: str, name: str, tokens: int = 1, request: str = "") -> None:
        done = self.release[name] = asyncio.Event()

        async def one() -> None:
            async with self.window.entry(caller, request or caller, tokens) as entry:
                self.entered.append((name, entry))
                await done.wait()

        self.tasks.append(asyncio.create_task(one()))

    def names(self) -> list[str]:
        return [name for name, _ in self.entered]


def test_a_second_callers_input_goes_in_before_the_first_callers_backlog() -> None:
    async def test() -> None:
        window = InputWindow(max_inputs=4, max_tokens=1000)
        held = Held(window)
        for i in range(10):
            held.send("alice", f"a{i}")
        await settle()
        assert held.names() == ["a0", "a1", "a2", "a3"] and window.waiting() == 6
        held.send("bob", "b0")
        await settle()
        held.release["a0"].set()
        await settle()
        name, entry = held.entered[4]
        # bob's goes in at the first free place, with the window's three ahead of it
        assert name == "b0" and entry == Entry("bob", 3, 3, 0, 6)
        held.release["a1"].set()
        await settle()
        assert held.names()[5] == "a4"  # then alice's again, in her order
        alice = next(e for n, e in held.entered if n == "a4")
        assert alice.passed == 1  # bob's one went in while it waited
        for event in held.release.values():
            event.set()
        await asyncio.gather(*held.tasks)
        assert window.inputs == 0 and window.tokens == 0 and window.waiting() == 0

    run(test)


def test_a_callers_requests_take_turns() -> None:
    async def test() -> None:
        window = InputWindow(max_inputs=1, max_tokens=100)
        held = Held(window)
        for i in range(3):
            held.send("alice", f"big{i}", request="big")
        held.send("alice", "small0", request="small")
        held.send("alice", "small1", request="small")
        await settle()
        # big0 went in at once; then the waiting requests in turn
        for name in ["big0", "big1", "small0", "big2", "small1"]:
            assert held.names()[-1] == name
            held.release[name].set()
            await settle()
        await asyncio.gather(*held.tasks)

    run(test)


def test_waits_cancelled_together_leave_the_window_whole() -> None:
    async def test() -> None:
        window = InputWindow(max_inputs=1, max_tokens=100)
        held = Held(window)
        for i in range(4):
            held.send("alice", f"a{i}", request="r")
        held.send("bob", "b0")
        await settle()
        for task in held.tasks[1:]:  # alice's request and bob's go away at once
            task.cancel()
        held.release["a0"].set()
        await asyncio.gather(*held.tasks, return_exceptions=True)
        assert window.inputs == 0 and window.tokens == 0 and window.waiting() == 0
        assert held.names() == ["a0"]
        async with window.entry("carol", 1, 1) as entry:
            assert entry.ahead == 0

    run(test)


def test_tokens_bound_the_window_and_one_input_larger_than_it_goes_in_alone() -> None:
    async def test() -> None:
        window = InputWindow(max_inputs=10, max_tokens=100)
        held = Held(window)
        held.send("alice", "a0", 60)
        held.send("alice", "a1", 60)
        await settle()
        assert held.names() == ["a0"]  # 120 tokens would not fit
        held.release["a0"].set()
        await settle()
        assert held.names() == ["a0", "a1"]
        held.release["a1"].set()
        await settle()
        held.send("bob", "huge", 500)
        await settle()
        assert held.names()[-1] == "huge" and held.entered[-1][1].ahead == 0
        held.release["huge"].set()
        await asyncio.gather(*held.tasks)

    run(test)


def test_a_cancelled_wait_gives_its_place_to_the_next() -> None:
    async def test() -> None:
        window = InputWindow(max_inputs=1, max_tokens=100)
        held = Held(window)
        held.send("alice", "a0")
        held.send("alice", "a1")
        held.send("bob", "b0")
        await settle()
        held.tasks[1].cancel()  # a1 waits: its request went away
        await settle()
        assert window.waiting() == 1
        held.release["a0"].set()
        await settle()
        assert held.names() == ["a0", "b0"]
        held.release["b0"].set()
        await asyncio.gather(*held.tasks, return_exceptions=True)
        assert window.inputs == 0 and window.waiting() == 0

    run(test)


def test_each_entry_is_told() -> None:
    async def test() -> None:
        window = InputWindow(max_inputs=2, max_tokens=100)
        told: list[Entry] = []
        window.on_entry.append(told.append)
        async with window.entry("alice", 1, 5), window.entry("bob", 2, 7):
            pass
        assert told == [Entry("alice", 0, 0, 0, 0), Entry("bob", 1, 5, 0, 0)]

    run(test)
