"""Freed heap memory handed back to the OS (gateway/engine/heap.py), what an engine's unload
does after collecting it: pages that glibc keeps for a fragmented heap leave the RSS."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# A child process holds ~200 MiB of 2 KiB blocks, frees all but every 64th (the survivors
# pin the heap, so glibc's own trimming at the top cannot release it), and prints its RSS
# before and after return_freed_memory().
FRAGMENTED = textwrap.dedent(
    """
    import psutil
    from gateway.engine.heap import return_freed_memory
    blocks = [bytearray(2048) for _ in range(100_000)]
    kept = blocks[::64]
    del blocks
    before = psutil.Process().memory_info().rss
    returned = return_freed_memory()
    after = psutil.Process().memory_info().rss
    print(returned, before, after, len(kept))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_a_fragmented_heaps_free_pages_leave_the_rss() -> None:
    out = subprocess.run(
        [sys.executable, "-c", FRAGMENTED], capture_output=True, text=True, check=True
    )
    returned, before, after, _ = out.stdout.split()
    assert returned == "True"
    assert int(before) - int(after) > 100 << 20, (before, after)
