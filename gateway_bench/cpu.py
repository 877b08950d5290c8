"""CPU accounting around a sweep step, from the kernel's counters (psutil): the other processes'
share and the frontend's CPU (docs/BENCHMARKS.md, "The figures")."""

from __future__ import annotations

import os
import time
from typing import NamedTuple

import psutil


class CpuUse(NamedTuple):
    other_pct: float
    frontend_s: float


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


class CpuMeter:
    """`pids`: the server under test (its first pid is the frontend); none for in-process."""

    def __init__(self, pids: tuple[int, ...]) -> None:
        self._frontend = psutil.Process(pids[0] if pids else os.getpid())
        self._roots = [psutil.Process(), self._frontend]
        self._processes: list[psutil.Process] = []
        self._began = self._busy = self._own = self._front = 0.0

    def start(self) -> None:
        self._processes = _tree(self._roots)
        self._own, self._front = _cpu_of(self._processes), _cpu_of([self._frontend])
        self._began, self._busy = time.monotonic(), _busy()

    def stop(self) -> CpuUse:
        wall = time.monotonic() - self._began
        others = (_busy() - self._busy) - (_cpu_of(self._processes) - self._own)
        capacity = wall * (os.cpu_count() or 1)
        share = round(max(0.0, others) / capacity * 100, 1) if capacity > 0 else 0.0
        return CpuUse(share, _cpu_of([self._frontend]) - self._front)
