"""The admission gate's classes, fairness and bulk cap, and the priority settings, on their own."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config.loading import load_settings
from gateway.config.priorities import BULK, INTERACTIVE, STANDARD, PriorityClasses
from gateway.config.settings import ConfigError
from gateway.engine_path.admission import Admission
from protocols.names import Protocol


class Jobs:
    """Requests holding slots until told to end; `started` records who got in, in order."""

    def __init__(self, gate: Admission) -> None:
        self.gate = gate
        self.started: list[str] = []
        self._ends: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def submit(self, name: str, priority: int = 0, caller: str = "") -> None:
        self._ends[name] = asyncio.Event()
        self._tasks[name] = asyncio.create_task(self._run(name, priority, caller))
        await asyncio.sleep(0)  # let it reach the gate

    async def _run(self, name: str, priority: int, caller: str) -> None:
        async with self.gate.slot(priority, caller):
            self.started.append(name)
            await self._ends[name].wait()

    async def end(self, name: str) -> None:
        self._ends[name].set()
        await self._tasks[name]

    async def end_all(self) -> None:
        for name in list(self._tasks):
            self._ends[name].set()
        await asyncio.gather(*self._tasks.values())


def test_a_waiting_interactive_request_goes_in_before_the_bulk_ones_queued_ahead() -> None:
    async def scenario() -> list[str]:
        jobs = Jobs(Admission(max_running=1, max_waiting=10))
        await jobs.submit("running", BULK)
        for n in range(3):
            await jobs.submit(f"bulk-{n}", BULK)
        await jobs.submit("chat", INTERACTIVE)
        await jobs.submit("single", STANDARD)
        assert jobs.gate.waiting_by_class() == {BULK: 3, INTERACTIVE: 1, STANDARD: 1}
        for name in ("running", "chat", "single", "bulk-0", "bulk-1"):
            await jobs.end(name)
        await jobs.end_all()
        return jobs.started

    assert asyncio.run(scenario()) == ["running", "chat", "single", "bulk-0", "bulk-1", "bulk-2"]


def test_fairness_gives_the_next_slot_to_the_caller_holding_fewest() -> None:
    async def scenario(fair: bool) -> list[str]:
        jobs = Jobs(Admission(max_running=2, max_waiting=10, fair=fair))
        for n in range(6):  # a caller with many requests: two run, four wait
            await jobs.submit(f"many-{n}", caller="many")
        await jobs.submit("one", caller="one")  # a second caller, last in the queue
        await jobs.end("many-0")
        await jobs.end_all()
        return jobs.started

    assert asyncio.run(scenario(fair=True))[:3] == ["many-0", "many-1", "one"]
    assert asyncio.run(scenario(fair=False))[-1] == "one"  # FIFO: behind all of them


def test_fairness_shares_slots_evenly_between_two_busy_callers() -> None:
    async def scenario() -> tuple[int, int]:
        gate = Admission(max_running=4, max_waiting=100)
        jobs = Jobs(gate)
        for n in range(20):
            await jobs.submit(f"a-{n}", caller="a")
        for n in range(20):
            await jobs.submit(f"b-{n}", caller="b")
        for n in range(4):  # a holds every slot; as they end, b catches up to its share
            await jobs.end(f"a-{n}")
        running = jobs.started[-4:]
        counts = (sum(n.startswith("a") for n in running), sum(n.startswith("b") for n in running))
        await jobs.end_all()
        return counts

    assert asyncio.run(scenario()) == (2, 2)


def test_bulk_holds_at_most_its_cap_while_interactive_requests_are_present() -> None:
    async def scenario() -> None:
        gate = Admission(max_running=8, max_waiting=10, bulk_max_running=2)
        jobs = Jobs(gate)
        for n in range(4):  # alone, bulk may take every slot
            await jobs.submit(f"bulk-{n}", BULK)
        assert gate.running == 4
        await jobs.submit("chat", INTERACTIVE)
        await jobs.submit("bulk-4", BULK)
        assert (gate.running, gate.waiting) == (5, 1)  # a free slot, but over the cap
        await jobs.end("bulk-0")
        await jobs.end("bulk-1")
        assert "bulk-4" not in jobs.started  # two bulk requests still run: the cap
        await jobs.end("bulk-2")
        assert jobs.started[-1] == "bulk-4"
        await jobs.submit("bulk-5", BULK)
        await jobs.submit("bulk-6", BULK)
        assert gate.waiting == 2
        await jobs.end("chat")  # no interactive request left: the cap lifts
        assert gate.waiting == 0 and jobs.started[-2:] == ["bulk-5", "bulk-6"]
        await jobs.end_all()

    asyncio.run(scenario())


def test_bulk_past_its_cap_leaves_room_for_interactive_requests_on_a_full_server() -> None:
    async def scenario() -> None:
        gate = Admission(max_running=4, max_waiting=10, bulk_max_running=2)
        jobs = Jobs(gate)
        for n in range(4):  # every slot bulk: two past the cap once a chat comes
            await jobs.submit(f"bulk-{n}", BULK)
        await jobs.submit("chat-0", INTERACTIVE)  # the engine holds two bulk back: room
        await jobs.submit("chat-1", INTERACTIVE)
        await jobs.submit("chat-2", INTERACTIVE)  # 2 bulk + 2 chats: the server is full
        assert jobs.started[-2:] == ["chat-0", "chat-1"]
        assert (gate.running, gate.waiting) == (6, 1)
        await jobs.end("bulk-0")  # one fewer held back: still full
        assert gate.waiting == 1
        await jobs.end("chat-0")
        assert jobs.started[-1] == "chat-2"
        await jobs.end_all()

    asyncio.run(scenario())


def test_a_cancelled_waiter_holding_the_cap_back_lets_bulk_in() -> None:
    async def scenario() -> None:
        gate = Admission(max_running=1, max_waiting=10, bulk_max_running=1)
        jobs = Jobs(gate)
        await jobs.submit("bulk-0", BULK)
        await jobs.submit("chat", INTERACTIVE)  # waits: the one slot is taken
        chat = jobs._tasks["chat"]
        chat.cancel()
        with pytest.raises(asyncio.CancelledError):
            await chat
        await jobs.submit("bulk-1", BULK)
        await jobs.end("bulk-0")
        assert jobs.started == ["bulk-0", "bulk-1"]
        await jobs.end("bulk-1")
        assert (gate.running, gate.waiting) == (0, 0)

    asyncio.run(scenario())


def test_a_request_may_step_back_from_its_class_but_never_ahead() -> None:
    classes = PriorityClasses({Protocol.LMI: 3})
    assert classes.of(Protocol.CONTROL) == INTERACTIVE
    assert classes.of(Protocol.LMI) == 3
    assert classes.of(Protocol.LMI, requested=0) == 3
    assert classes.of(Protocol.LMI, requested=5) == 5
    assert classes.of(Protocol.OPENAI_CHAT, requested=9) == 9
    off = PriorityClasses({}, enabled=False)
    assert off.of(Protocol.LMI, requested=5) == 0


def test_priority_settings_are_read_and_checked() -> None:
    settings = load_settings({"PRIORITY_SAGEMAKER": "4", "BULK_MAX_RUNNING": "8"}, None)
    assert settings.priority_classes == {"sagemaker": 4}
    assert settings.engine.bulk_max_running == 8
    assert settings.engine.scheduling_policy == "priority"
    with pytest.raises(ConfigError, match="PRIORITY_TGI"):
        load_settings({"PRIORITY_TGI": "10"}, None)
    with pytest.raises(ConfigError, match="SCHEDULING_POLICY"):
        load_settings({"SCHEDULING_POLICY": "lottery"}, None)


def test_callers_take_turns_for_a_single_slot() -> None:
    async def scenario() -> list[str]:
        jobs = Jobs(Admission(max_running=1, max_waiting=10))
        await jobs.submit("a-0", caller="a")
        for n in range(1, 4):
            await jobs.submit(f"a-{n}", caller="a")
        await jobs.submit("b-0", caller="b")
        await jobs.submit("b-1", caller="b")
        for name in ("a-0", "b-0", "a-1", "b-1", "a-2"):
            await jobs.end(name)
        await jobs.end_all()
        return jobs.started

    assert asyncio.run(scenario()) == ["a-0", "b-0", "a-1", "b-1", "a-2", "a-3"]
