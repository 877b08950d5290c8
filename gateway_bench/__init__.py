"""`llm-gateway bench`: load generator and report, from the in-process ceiling to every protocol.

A package beside the gateway, not part of it: it drives the gateway from outside (HTTP and
WebSockets), vLLM directly, and vLLM's own server. See docs/BENCHMARKS.md. `main(argv)` is
the command line (`llm-gateway bench`, `python -m gateway_bench`); `run_benchmark` the same
run for callers that already hold an engine or a gateway (the test suite).

Importing it fails with ModuleNotFoundError when the `bench` extra is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from collections.abc import Sequence

# The `bench` extra's packages (pyproject.toml), checked without importing them.
EXTRA = ("aiohttp", "psutil", "tqdm", "matplotlib")
_missing = [name for name in EXTRA if importlib.util.find_spec(name) is None]
if _missing:
    raise ModuleNotFoundError(
        f"llm-gateway bench needs {', '.join(_missing)}: pip install 'llm-gateway[bench]'",
        name=_missing[0],
    )


def _scenario(args: Sequence[str]) -> str:
    """`--scenario NAME` (or `--scenario=NAME`) picks a scenario; the sweep is the default."""
    for i, arg in enumerate(args):
        if arg == "--scenario" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--scenario="):
            return arg.partition("=")[2]
    return "sweep"


def main(argv: Sequence[str] | None = None) -> int:
    # Before anything imports vLLM: its INFO lines would break the progress bar.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from gateway_bench.benchmark import run_benchmark
    from gateway_bench.event_loop import run_loop
    from gateway_bench.options import parse
    from gateway_bench.report import markdown

    args = list(sys.argv[1:] if argv is None else argv)
    if _scenario(args) == "soak":
        from gateway_bench.soak import main as soak

        return soak(args)
    if _scenario(args) == "mixed":
        from gateway_bench.mixed import main as mixed

        return mixed(args)
    if _scenario(args) == "constrained":
        from gateway_bench.constrained import main as constrained

        return constrained(args)
    if _scenario(args) == "adapters":
        from gateway_bench.adapters_bench import main as adapters

        return adapters(args)
    if _scenario(args) == "replicas":
        from gateway_bench.replica_bench import main as replicas

        return replicas(args)
    options = parse(args)
    command = shlex.join(["llm-gateway", "bench", *args])
    result, out = run_loop(run_benchmark(options, command=command))
    print(markdown(result, chart=None))
    print(f"\nllm-gateway bench: report written to {out}/", file=sys.stderr)
    return 0
