"""`llm-gateway bench`: load generator and report, from the in-process ceiling to every protocol.

See docs/BENCHMARKS.md. `main(argv)` is the command line; `run_benchmark` the same run for
callers that already hold an engine or a gateway (the test suite).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: Sequence[str] | None = None) -> int:
    # Before anything imports vLLM: its INFO lines would break the progress bar.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from gateway.bench.benchmark import run_benchmark
    from gateway.bench.options import parse
    from gateway.bench.report import markdown

    args = list(sys.argv[1:] if argv is None else argv)
    options = parse(args)
    command = shlex.join(["llm-gateway", "bench", *args])
    result, out = _run(run_benchmark(options, command=command))
    print(markdown(result, chart=None))
    print(f"\nllm-gateway bench: report written to {out}/", file=sys.stderr)
    return 0
