"""The constraint compilers (gateway/engine/compile_worker.py's processes), shared fairly by the
callers that ask for compiles (gateway/engine/constraint_check.py).

CONSTRAINT_COMPILE_WORKERS workers (2), started with the engine, each replaced as soon as it is
killed or dies. A caller (an API key, else a connection) compiles one constraint at a time:
its next waits for its last, so one key's new constraints never take a second worker from
another key's. A free worker goes to the waiting caller served longest ago (one never served
first), then to the earliest: with no more callers compiling than workers, a caller waits
behind no other caller's compile; with more, behind at most one compile of each worker's. The
wait (for a worker, or for one restarting) counts against the caller's own deadline: past it,
the caller's compile is a fault (`CompileFault`), not run. A worker killed under a caller's
compile (past its deadline, its request gone, out of memory) restarts charged to that caller:
its next compile waits for the restart, no other caller's does.

A worker costs about 295 MiB resident when idle (about 200 MiB of its own: xgrammar imports
torch), and takes 4-5 s to start on a loaded 2-core machine; a compile may add up to
CONSTRAINT_COMPILE_MEMORY_MIB to it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field

import msgspec

from gateway.engine.compile_worker import HEADER_BYTES, Job, Ready, Setup, Verdict, frame_length

log = logging.getLogger(__name__)
# After a worker's start failed, the next in 1 s, then twice as long each time up to a minute
# (a compile asked for meanwhile starts it at once).
_RETRY_SECONDS, _MAX_RETRY_SECONDS = 1.0, 60.0


class CompileFault(Exception):
    """A compile that ended without the constraint's own answer (its deadline passed, its worker
    died or none came free): no verdict on the constraint."""


class _Worker:
    """One compile_worker process and its pipes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, setup: Setup) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway.engine.compile_worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        worker = cls(process)
        try:
            worker._send(setup)
            msgspec.msgpack.decode(await worker._receive(), type=Ready)
        except BaseException:
            worker.kill()
            raise
        return worker

    @property
    def pid(self) -> int:
        return self.process.pid

    def _send(self, message: msgspec.Struct) -> None:
        assert self.process.stdin is not None
        body = msgspec.msgpack.encode(message)
        self.process.stdin.write(len(body).to_bytes(HEADER_BYTES, "big") + body)

    async def _receive(self) -> bytes:
        assert self.process.stdout is not None
        header = await self.process.stdout.readexactly(HEADER_BYTES)
        return await self.process.stdout.readexactly(frame_length(header))

    async def ask(self, job: Job) -> Verdict:
        self._send(job)
        return msgspec.msgpack.decode(await self._receive(), type=Verdict)

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()

    async def end(self) -> str:
        """How the process ended, once its pipe has closed ("killed by SIGKILL")."""
        try:
            async with asyncio.timeout(1.0):  # its pipe closes as it exits
                code = await self.process.wait()
        except TimeoutError:
            self.kill()
            code = await self.process.wait()
        if code < 0:
            with suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
            return f"killed by signal {-code}"
        return f"exited with status {code}"


@dataclass(eq=False)
class _Slot:
    worker: _Worker | None = None  # None: starting (or its start failed)
    holder: str | None = None  # the caller compiling on it, or whose killed compile it restarts for
    starting: asyncio.Task[None] | None = None
    failures: int = 0  # starts failed in a row

    @property
    def free(self) -> bool:
        worker = self.worker
        return worker is not None and worker.process.returncode is None and self.holder is None


@dataclass(eq=False)
class _Waiter:
    caller: str
    order: int
    granted: asyncio.Future[_Slot] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    behind: int = 0  # other callers' compiles that ended while it waited for a worker


class Lease:
    """One caller's use of one worker, for one compile."""

    def __init__(self, slot: _Slot, seconds: float, waited: float, behind: int) -> None:
        self._slot = slot
        self._seconds = seconds
        self.waited = waited  # seconds waiting for the worker
        self.behind = behind  # other callers' compiles it waited behind
        self.kill = False  # the worker is to be replaced when the lease ends

    async def ask(self, job: Job, deadline: float) -> Verdict:
        """The worker's verdict on `job`, by `deadline` (the event loop's clock)."""
        worker = self._slot.worker
        assert worker is not None
        try:
            async with asyncio.timeout_at(deadline):
                verdict = await worker.ask(job)
        except TimeoutError:
            self.kill = True
            raise CompileFault(
                f"compiling it did not finish within CONSTRAINT_COMPILE_SECONDS "
                f"({self._seconds:g} s, {self.waited:.1f} s of them waiting for a compile "
                "worker), and it was stopped"
            ) from None
        except (asyncio.IncompleteReadError, ConnectionError):
            self.kill = True
            how = await worker.end()
            raise CompileFault(
                f"its compile worker (pid {worker.pid}) died mid-compile ({how}) before "
                "giving a verdict"
            ) from None
        except BaseException:  # the request is gone: its compile goes with it
            self.kill = True
            raise
        if verdict.out_of_memory:  # it said so itself, and exits: a fresh one replaces it
            self.kill = True
        return verdict


class CompilePool:
    """`workers` compile workers, each set up by `setup()`; leased one compile at a time."""

    def __init__(self, setup: Callable[[], Awaitable[Setup]], workers: int) -> None:
        self._setup = setup
        self._slots = [_Slot() for _ in range(workers)]
        self._waiters: list[_Waiter] = []
        self._order = itertools.count()
        self._turns = itertools.count()
        self._last_served: dict[str, int] = {}  # callers holding a worker or waiting for one
        self._watches: set[asyncio.Task[None]] = set()
        self._closed = False
        self.restarts = 0  # workers replaced: killed (deadline, memory, request gone) or dead

    def start(self) -> None:
        """Starts every worker not running or starting (each takes seconds: it imports
        xgrammar), so that none starts at first use."""
        if self._closed:
            return
        for slot in self._slots:
            if slot.worker is None and slot.starting is None:
                slot.starting = asyncio.create_task(self._started(slot))

    async def _started(self, slot: _Slot) -> None:
        try:
            worker = await _Worker.start(await self._setup())
        except Exception:  # killed as it started, say: started again, later each time
            slot.failures += 1
            retry = min(_RETRY_SECONDS * 2 ** (slot.failures - 1), _MAX_RETRY_SECONDS)
            log.exception("A constraint compile worker did not start; again in %g s", retry)
            self._charged(slot)
            asyncio.get_running_loop().call_later(retry, self.start)
            self._grant()
            return
        finally:
            slot.starting = None
        if self._closed:
            worker.kill()
            return
        slot.worker, slot.failures = worker, 0
        self._charged(slot)
        watch = asyncio.create_task(self._watch(slot, worker))
        self._watches.add(watch)
        watch.add_done_callback(self._watches.discard)
        self._grant()

    def _charged(self, slot: _Slot) -> None:
        """The caller a restart was charged to is charged no longer."""
        charged, slot.holder = slot.holder, None
        if charged is not None:
            self._forget_if_idle(charged)

    async def _watch(self, slot: _Slot, worker: _Worker) -> None:
        """Replaces a worker that dies idle (the kernel's OOM killer, a kill from outside)."""
        await worker.process.wait()
        if slot.worker is worker and slot.holder is None and not self._closed:
            log.warning("A constraint compile worker (pid %d) died idle", worker.pid)
            slot.worker = None
            self.restarts += 1
            self.start()

    def pids(self) -> dict[int, str | None]:
        """Each running worker's pid, and the caller compiling on it (None: idle)."""
        return {s.worker.pid: s.holder for s in self._slots if s.worker is not None}

    @asynccontextmanager
    async def lease(self, caller: str, deadline: float, seconds: float) -> AsyncIterator[Lease]:
        """A worker for one compile of `caller`'s, by `deadline` (the event loop's clock; it
        is `seconds` from when the caller asked): CompileFault past it."""
        if self._closed:
            raise CompileFault("the engine is shutting down")
        self.start()  # a worker whose start failed starts again
        loop = asyncio.get_running_loop()
        came = loop.time()
        waiter = _Waiter(caller, next(self._order))
        self._waiters.append(waiter)
        self._last_served.setdefault(caller, -1)
        self._grant()
        try:
            async with asyncio.timeout_at(deadline):
                slot = await waiter.granted
        except BaseException as e:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            granted = waiter.granted
            if granted.done() and not granted.cancelled() and granted.exception() is None:
                # It came just as we gave up: passed on.
                self._release(granted.result(), caller, kill=False)
            else:
                self._forget_if_idle(caller)
            if isinstance(e, TimeoutError):
                raise CompileFault(self._none_free(seconds)) from None
            raise
        lease = Lease(slot, seconds, loop.time() - came, waiter.behind)
        try:
            yield lease
        finally:
            self._release(slot, caller, kill=lease.kill)

    def _none_free(self, seconds: float) -> str:
        restarting = sum(s.worker is None for s in self._slots)
        busy = sum(s.worker is not None and s.holder is not None for s in self._slots)
        return (
            f"no compile worker came free within CONSTRAINT_COMPILE_SECONDS ({seconds:g} s; "
            f"{busy} compiling, {restarting} starting), and it was not compiled"
        )

    def _grant(self) -> None:
        """Hands free workers to the waiters whose turn it is, one compile per caller."""
        while self._waiters:
            free = [s for s in self._slots if s.free]
            if not free:
                return
            holding = {s.holder for s in self._slots}
            ready = [w for w in self._waiters if w.caller not in holding]
            if not ready:
                return
            chosen = min(ready, key=lambda w: (self._last_served[w.caller], w.order))
            self._waiters.remove(chosen)
            free[0].holder = chosen.caller
            self._last_served[chosen.caller] = next(self._turns)
            chosen.granted.set_result(free[0])

    def _release(self, slot: _Slot, caller: str, *, kill: bool) -> None:
        holding = {s.holder for s in self._slots}
        for waiter in self._waiters:
            if waiter.caller not in holding:  # waiting for a worker, not for its own compile
                waiter.behind += 1
        worker = slot.worker
        if kill or worker is None or worker.process.returncode is not None:
            # Restarted charged to `caller`: its holder until the fresh worker is ready.
            slot.worker = None
            if worker is not None:
                worker.kill()
            self.restarts += 1
            self.start()
            if slot.starting is None:  # closed, or not started: nobody is charged
                slot.holder = None
        else:
            slot.holder = None
        self._forget_if_idle(caller)
        self._grant()

    def _forget_if_idle(self, caller: str) -> None:
        """A caller's turn is kept while it holds a worker or waits for one."""
        if all(s.holder != caller for s in self._slots) and all(
            w.caller != caller for w in self._waiters
        ):
            self._last_served.pop(caller, None)

    def close(self) -> None:
        self._closed = True
        for slot in self._slots:
            if slot.starting is not None:
                slot.starting.cancel()
            if slot.worker is not None:
                slot.worker.kill()
            slot.worker = None
        for watch in self._watches:
            watch.cancel()
        for waiter in self._waiters:
            if not waiter.granted.done():
                waiter.granted.set_exception(CompileFault("the engine is shutting down"))
        self._waiters.clear()
