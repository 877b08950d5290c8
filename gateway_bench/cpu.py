"""CPU accounting around a step, from the kernel's counters (psutil): the other processes'
share and the frontend's CPU (docs/BENCHMARKS.md, "The figures"); and, with `--profile`, a
py-spy profile of the frontend meanwhile."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import NamedTuple

import psutil

from gateway_bench.targets import say

_PROFILE_STOP_S = 30.0


class CpuUse(NamedTuple):
    other_pct: float
    frontend_s: float

    def per_token_ms(self, tokens: int) -> float | None:
        return round(self.frontend_s * 1000 / tokens, 3) if tokens else None


def _busy() -> float:
    t = psutil.cpu_times()
    # steal: time the hypervisor gave to someone else, as much interference as another process
    return float(t.user + t.nice + t.system + t.irq + t.softirq + t.steal)


def _tree(roots: list[psutil.Process]) -> list[psutil.Process]:
    tree = {p.pid: p for root in roots for p in (root, *root.children(recursive=True))}
    return list(tree.values())


def _cpu_of(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:  # gone since: its time is lost, and counted as another's
            continue
        total += times.user + times.system
    return total


class Profile:
    """`py-spy record` of one process into a speedscope file, from `start` to `stop`."""

    def __init__(self, pid: int, path: Path) -> None:
        self._pid, self.path = pid, path
        self._process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        spy = Path(sys.executable).with_name("py-spy")
        command = str(spy) if spy.is_file() else shutil.which("py-spy")
        if command is None:
            say("--profile: py-spy is not installed (pip install py-spy); no profile")
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        args = ["record", "--pid", str(self._pid), "--format", "speedscope"]
        self._process = await asyncio.create_subprocess_exec(
            command,
            *args,
            "--nonblocking",
            "-o",
            str(self.path),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.returncode is None:
            process.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            _, error = await asyncio.wait_for(process.communicate(), _PROFILE_STOP_S)
        except TimeoutError:
            process.kill()
            _, error = await process.communicate()
        if not self.path.is_file():
            said = error.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            say(
                f"--profile: py-spy recorded nothing for pid {self._pid} ({said[0]}); it needs "
                "ptrace rights on the process: run as its user with kernel.yama.ptrace_scope=0, "
                "or as root (in a container: --cap-add SYS_PTRACE)"
            )


class CpuMeter:
    """`pids`: the server under test (its first pid is the frontend); none for in-process.
    `profile`: where py-spy's profile of the frontend goes, if anywhere (it ends at the first
    `stop`)."""

    def __init__(self, pids: tuple[int, ...], profile: Path | None = None) -> None:
        self._frontend = psutil.Process(pids[0] if pids else os.getpid())
        self._processes = _tree([psutil.Process(), self._frontend])
        self._profile = None if profile is None else Profile(self._frontend.pid, profile)
        self._own, self._front = _cpu_of(self._processes), _cpu_of([self._frontend])
        self._began, self._busy = time.monotonic(), _busy()

    @classmethod
    async def start(cls, pids: tuple[int, ...], profile: Path | None = None) -> CpuMeter:
        meter = cls(pids, profile)
        if meter._profile is not None:
            await meter._profile.start()
        return meter

    async def stop(self) -> CpuUse:
        wall = time.monotonic() - self._began
        others = (_busy() - self._busy) - (_cpu_of(self._processes) - self._own)
        capacity = wall * (os.cpu_count() or 1)
        share = round(max(0.0, others) / capacity * 100, 1) if capacity > 0 else 0.0
        use = CpuUse(share, _cpu_of([self._frontend]) - self._front)
        if self._profile is not None:
            await self._profile.stop()
        return use
