"""Engine defaults that fit the CPU they run on (docs/BENCHMARKS.md has the measurements).

bfloat16 is fast only where the CPU computes it natively (AVX-512 BF16 or AMX); elsewhere
PyTorch emulates it, about 5x slower than float32 for the default model. Pure: reads
/proc/cpuinfo, imports nothing of vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path

from gateway.config.settings import ConfigError

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's feature flags (empty where /proc/cpuinfo has none)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def native_bfloat16(flags: frozenset[str]) -> bool:
    return bool(flags & NATIVE_BF16_FLAGS)


def reported_flags(flags: frozenset[str]) -> list[str]:
    """The flags that decide the defaults, as the logs, /metrics and the bench show them."""
    return [f for f in REPORTED_FLAGS if f in flags]


def resolve_dtype(
    requested: str, device: str = "cpu", flags: frozenset[str] | None = None
) -> tuple[str, str]:
    """(dtype, why): `auto` on a CPU becomes bfloat16 only where the CPU computes it natively."""
    if requested != "auto":
        return requested, "set by DTYPE"
    if device != "cpu":
        return "auto", f"the model's own dtype ({device})"
    found = cpu_flags() if flags is None else flags
    if native_bfloat16(found):
        native = ", ".join(sorted(found & NATIVE_BF16_FLAGS))
        return "bfloat16", f"the CPU computes bfloat16 natively ({native})"
    return "float32", "the CPU has no native bfloat16 (no avx512_bf16 or amx_bf16): float32"


# While a request ahead of bulk is present, bulk takes part in at most this many of a CPU
# engine's steps' sequences (BULK_MAX_RUNNING=auto; the rest are paused): a CPU step's time
# grows with its batch, so a chat waits for every bulk sequence. With prompts first
# (bulk_scheduler.py) the cap no longer weighs on a chat's prompt step, only on the step it
# arrives during and its decode steps: on 2 cores 24 gave lower chat TTFT p50 than 16 in the
# steady and burst shapes, the same in the sporadic one, and ~1.45x the batch's tok/s with
# steady chats; 32 gave no more batch and slower chats (docs/BENCHMARKS.md, issue 30). A GPU's
# decode step hardly grows with its batch: no cap there.
CPU_BULK_MAX_RUNNING = 24


def resolve_bulk_cap(requested: int | str, device: str = "cpu") -> int:
    """BULK_MAX_RUNNING as a number: `auto` is CPU_BULK_MAX_RUNNING on a CPU, else 0 (none)."""
    return _on_cpu(requested, CPU_BULK_MAX_RUNNING, device)


# While a request ahead of bulk is present, a CPU engine's step computes at most this many
# tokens (INTERACTIVE_STEP_TOKENS=auto): a burst of chats' prompts (20 of ~100 tokens) is
# computed a few at a time, so half of them answer after a fraction of the burst's prefill.
# On 2 cores (AVX-512 BF16) 256 gave a burst's p50 TTFT below 512's and 128's (too many steps,
# each with its fixed cost) and below vLLM's own budget (2048: the whole burst in one step)
# (docs/BENCHMARKS.md, issue 30). A GPU computes a burst's prompts in one short step: vLLM's
# budget there.
CPU_INTERACTIVE_STEP_TOKENS = 256


def resolve_interactive_step_tokens(requested: int | str, device: str = "cpu") -> int:
    """INTERACTIVE_STEP_TOKENS as a number: `auto` is CPU_INTERACTIVE_STEP_TOKENS on a CPU,
    else 0 (the engine's step budget)."""
    return _on_cpu(requested, CPU_INTERACTIVE_STEP_TOKENS, device)


# The tokens any step of a CPU engine computes (MAX_NUM_BATCHED_TOKENS=auto; vLLM's CPU
# default is 2,048). A CPU step's time grows with its tokens, and a step does not stop
# midway: a chat arriving while the batch's prompts are computed waited for a 2,048-token
# step (0.5-1.2 s on 2 cores), the slowest chat of the steady shape on every target. With
# 512, batch-only traffic lost nothing (128- and 1,024-token prompts, 8 and 64 at once) and
# chats arriving into a batch's prompts waited ~5x less (docs/BENCHMARKS.md, issue 30).
# A GPU computes 2,048 tokens in one short step: vLLM's budget there.
CPU_MAX_NUM_BATCHED_TOKENS = 512


def resolve_max_num_batched_tokens(requested: int | str, device: str = "cpu") -> int:
    """MAX_NUM_BATCHED_TOKENS as a number: `auto` is CPU_MAX_NUM_BATCHED_TOKENS on a CPU, else
    0 (vLLM's own)."""
    return _on_cpu(requested, CPU_MAX_NUM_BATCHED_TOKENS, device)


def _on_cpu(requested: int | str, cpu_value: int, device: str) -> int:
    """A setting as a number: `auto` is `cpu_value` on a CPU, else 0 (off, or vLLM's own)."""
    if requested != "auto":
        return int(requested)
    return cpu_value if device == "cpu" else 0


# vLLM binds its model worker to all cores but one, which it reserves for the frontend. On
# 2 cores that leaves the model one core while the frontend needs a few percent of the other:
# the model on both measured 1.1-1.4x the tok/s at concurrency 32 and 64 on every CPU kind
# tried (docs/BENCHMARKS.md). Past SMALL_MACHINE_CORES vLLM's own binding is kept (not measured).
# There the model's worker also runs inside the engine core's process (vLLM's single-process
# executor): apart, the two hand every step over a shared-memory queue whose readers spin, and
# the engine core's spin took CPU from the forward on both cores; together they measured
# 1.13-1.26x the tok/s at 1-64 at once, compiled (issue 60, docs/BENCHMARKS.md).
SMALL_MACHINE_CORES = 2


def engine_environment(
    environ: Mapping[str, str] | None = None, cpus: Collection[int] | None = None
) -> dict[str, str]:
    """Variables to set for vLLM's CPU backend before it starts; the operator's own win.

    `cpus`: the CPU ids this process may run on (default: its affinity).
    """
    if cpus is None:  # the process's affinity where the OS has one (Linux), else every core
        affinity = getattr(os, "sched_getaffinity", None)
        cpus = affinity(0) if affinity else range(os.cpu_count() or 1)
    usable = sorted(cpus)
    defaults: dict[str, str] = {}
    if 0 < len(usable) <= SMALL_MACHINE_CORES:
        defaults["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in usable)
        defaults["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        defaults["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    present = {} if environ is None else environ
    return {k: v for k, v in defaults.items() if k not in present}


# Tokens a CPU engine's KV-cache block holds (KV_BLOCK_SIZE=auto; vLLM's CPU default is 128).
# The prefix cache keeps whole blocks only: with 128, a prompt's shared head (a system turn,
# tools' definitions) is computed again for every request up to its last 127 tokens. On 2
# cores (AVX-512 BF16) 32 cached them, raised tok/s for repeated prompts, and cost nothing
# with unique prompts of ~17 and ~1,000 tokens at 1-64 at once (docs/BENCHMARKS.md, issue 46).
# A GPU's default (16) is smaller already: vLLM's there.
CPU_KV_BLOCK_SIZE = 32
# vLLM's CPU attention kernels take blocks of a multiple of 32 tokens only.
CPU_KV_BLOCK_MULTIPLE = 32


def resolve_typical_sampling(requested: bool | str, device: str = "cpu") -> bool:
    """TYPICAL_SAMPLING as a flag: `auto` is on on a CPU (typical_sampling.py)."""
    return device == "cpu" if requested == "auto" else bool(requested)


def resolve_kv_block_size(requested: int | str, device: str = "cpu") -> int:
    """KV_BLOCK_SIZE as a number: `auto` is CPU_KV_BLOCK_SIZE on a CPU, else 0 (vLLM's own)."""
    size = _on_cpu(requested, CPU_KV_BLOCK_SIZE, device)
    if device == "cpu" and size % CPU_KV_BLOCK_MULTIPLE:
        raise ConfigError(
            f"KV_BLOCK_SIZE={size}: vLLM's CPU backend takes a multiple of "
            f"{CPU_KV_BLOCK_MULTIPLE} tokens (or 0 for its own, 128)"
        )
    return size
