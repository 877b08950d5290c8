"""Background responses (the Responses API's `background: true`): generations that run with no
client attached (docs/OPENAI.md, "Background responses").

Each runs in a task of its own, made in its creator's context (its caller: its key's limits, its
admission slot), and puts its typed events, in order, into the event log
(gateway/stores/event_log.py), where any number of readers find them. A response ends by
itself (its terminal event is its last); by `cancel` (its engine request aborted, then the
terminal event its `Ending` makes; a `cancel` on another gateway sharing the Redis reaches it
through the event log, seen with its next kept event); or when the gateway stops: the drain
lets it finish within DRAIN_SECONDS and ends it like any prompt (the route makes that
`incomplete`), and `settled` holds the drain's end until its terminal event is kept; an app
that stops without a drain ends what still runs through its `Ending`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing, suppress
from dataclasses import dataclass, field

from gateway.observability.tracing import current_trace
from gateway.stores.continuation import Key
from gateway.stores.event_log import EventLog
from protocols.errors import GenerationError

log = logging.getLogger(__name__)
# A response's events, a few at a time, each batch with whether its terminal event is among them.
Events = AsyncGenerator[tuple[Sequence[bytes], bool], None]
# Why it ended early ("cancelled", "shutdown", "error") and the next sequence number -> its
# terminal event
# (the response's stored state saved first).
Ending = Callable[[str, int], Awaitable[bytes]]
UNTIL_THE_END = 2**62  # a sequence number no response reaches: a read that returns at the end


@dataclass
class _Run:
    ending: Ending
    count: int = 0  # events kept so far
    why: str = "shutdown"
    finishing: bool = False  # its last event came: nothing left to stop
    asked: bool = False  # a gateway sharing the store asked it to stop (`cancel` there)
    stop: asyncio.Event = field(default_factory=asyncio.Event)  # set: stop it, saying `why`
    task: asyncio.Task[None] | None = None


class Background:
    def __init__(self, events: EventLog) -> None:
        self.events = events
        self._running: dict[Key, _Run] = {}

    def __len__(self) -> int:
        return len(self._running)

    async def start(self, key: Key, events: Events, ending: Ending) -> None:
        """Keeps the response's first events, then runs the rest in a task of its own."""
        run = _Run(ending)
        try:
            first, last = await anext(events)
            run.finishing = last
            await self._keep(key, run, first)
        except BaseException:
            await events.aclose()
            raise
        self._running[key] = run
        run.task = asyncio.create_task(self._run(key, run, events))
        trace = current_trace()
        if trace is not None:  # its server span ends with the generation, not the answer
            trace.hold()
            run.task.add_done_callback(lambda _: trace.release())

    async def _keep(self, key: Key, run: _Run, events: Sequence[bytes]) -> None:
        if await self.events.append(key, run.count, events):
            run.asked = True
        run.count += len(events)

    async def _run(self, key: Key, run: _Run, events: Events) -> None:
        """Keeps each batch as it comes, until the last, or until it is asked to stop: then
        its generation is closed (its engine request aborted) and its `Ending` kept. A batch
        being kept is never interrupted, so every event is kept once, in order."""
        stopped = asyncio.ensure_future(run.stop.wait())
        try:
            try:
                while not run.finishing:
                    coming = asyncio.ensure_future(_next(events))
                    await asyncio.wait({coming, stopped}, return_when=asyncio.FIRST_COMPLETED)
                    if not coming.done():
                        coming.cancel()  # thrown into the generation: it ends there
                        await asyncio.gather(coming, return_exceptions=True)
                        break
                    made = coming.result()
                    if made is None:
                        break
                    run.finishing = made[1]
                    await self._keep(key, run, made[0])
                    if run.asked:
                        run.why = "cancelled"
                        break
            except Exception:  # a bug: its readers still get an end
                log.exception("a background response failed")
                run.why = "error"
            await events.aclose()  # ended, or its engine request aborted
            if not run.finishing:  # its terminal event did not come: say why it ended
                await self._keep(key, run, [await run.ending(run.why, run.count)])
            await self.events.end(key)
        except GenerationError as e:  # the store cannot be reached: readers end with the TTL
            log.warning("a background response's events could not be kept: %s", e.message)
        finally:
            stopped.cancel()
            self._running.pop(key, None)

    async def cancel(self, key: Key) -> bool:
        """Stops it (its engine request aborted) and waits until its last event is kept.

        One running on another gateway sharing the store is asked to stop there (it does at
        its next event) and waited for as its readers wait; False when it runs nowhere this
        process can reach."""
        run = self._running.get(key)
        if run is None or run.task is None:
            if not await self.events.ask_to_stop(key):
                return False
            async with aclosing(self.events.read(key, UNTIL_THE_END)) as rest:
                async for _ in rest:
                    pass
            return True
        self._stop(run, "cancelled")
        await asyncio.shield(asyncio.gather(run.task, return_exceptions=True))
        return True

    @staticmethod
    def _stop(run: _Run, why: str) -> None:
        if not run.stop.is_set():
            run.why = why
            run.stop.set()

    async def settled(self) -> None:
        """Returns once every response that runs has kept its last event (the drain's end)."""
        tasks = [run.task for run in self._running.values() if run.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """The app stops: what still runs ends through its `Ending` ("shutdown")."""
        for run in list(self._running.values()):
            self._stop(run, "shutdown")
        with suppress(Exception):
            await self.settled()


async def _next(events: Events) -> tuple[Sequence[bytes], bool] | None:
    """The next batch, or None at the end."""
    try:
        return await anext(events)
    except StopAsyncIteration:
        return None
