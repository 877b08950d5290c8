"""Freed heap memory handed back to the OS after an engine is unloaded.

glibc's malloc keeps the pages of freed chunks that lie below the top of its heaps: an
unloaded engine's objects (its tokenizer, its output processor, its client's buffers) are
freed, yet the process' RSS keeps them. Measured on the models bench's gateway (issue 57,
docs/MODELS.md): +151 MiB over 8 loads and unloads, 95 MiB of it returned by one
`malloc_trim(0)`. Where the C library has no `malloc_trim` (musl, macOS) nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def return_freed_memory() -> bool:
    """Hand the free pages of every malloc arena back to the OS; False where the C library
    cannot. It holds each arena's lock while it walks it: call it off the event loop."""
    trim = _malloc_trim()
    if trim is None:
        return False
    began = time.perf_counter()
    trim(0)
    log.info(
        "freed heap memory returned to the OS in %.1f ms", 1000 * (time.perf_counter() - began)
    )
    return True
