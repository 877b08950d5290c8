"""What an embedding model loaded at run time (or a chat model loaded on demand) will take of
the machine's memory, and what the machine has: a load that does not fit is refused
(docs/EMBEDDINGS.md, docs/MODELS.md), rather than let the kernel end the gateway mid-load.

The estimate is an upper bound: the weights' files as they lie on disk (a float32 checkpoint
loaded in bfloat16 takes half), the engine's cache (EMBEDDING_KV_CACHE_GIB), and one engine
process's own footprint (Python, torch and vLLM: measured here, all-MiniLM-L6-v2's engine
process resident at ~1 GiB with 90 MB of weights and a 0.25 GiB cache).
"""

from __future__ import annotations

from pathlib import Path

GIB = 1 << 30
ENGINE_PROCESS_BYTES = int(0.75 * GIB)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def weight_bytes(model_dir: Path) -> int:
    """The size of a model directory's weight files (0: a hub id, not a directory here)."""
    if not model_dir.is_dir():
        return 0
    return sum(
        f.stat().st_size
        for f in model_dir.rglob("*")
        if f.is_file() and f.suffix in WEIGHT_SUFFIXES
    )


# A chat engine's processes beyond its weights and KV cache, measured here (USS, 2-core EPYC,
# vLLM 0.32 CPU, enforce_eager): EngineCore ~0.57 GiB, its Worker's own ~0.85 GiB, and the
# model's two constraint compile workers ~0.2-0.3 GiB each. With the worker inside the engine
# core (the default on up to 2 cores, cpu_defaults.py) there is one process, and this bound
# is above what it takes (not measured apart from the weights and KV cache yet).
CHAT_ENGINE_PROCESS_BYTES = 2 * GIB


def chat_engine_bytes(model_dir: Path, cache_gib: float) -> int:
    """The memory a chat model's engine for `model_dir` needs at most."""
    return weight_bytes(model_dir) + int(cache_gib * GIB) + CHAT_ENGINE_PROCESS_BYTES


def engine_bytes(model_dir: Path, cache_gib: float) -> int:
    """The memory a pooling engine for `model_dir` needs at most."""
    return weight_bytes(model_dir) + int(cache_gib * GIB) + ENGINE_PROCESS_BYTES


def available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The memory the kernel can give without swapping (MemAvailable), None where unknown."""
    try:
        lines = meminfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            return int(value.split()[0]) * 1024
    return None
