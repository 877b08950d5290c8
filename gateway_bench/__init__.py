"""`llm-gateway bench`: load generators and reports, from the in-process ceiling to every protocol.

A package beside the gateway, not part of it: it drives the gateway from outside (HTTP and
WebSockets), vLLM directly, and vLLM's own server. See docs/BENCHMARKS.md. `main(argv)` is
the command line (`llm-gateway bench NAME`, `python -m gateway_bench NAME`), one subcommand
per scenario; each scenario's `run_*` is the same run for callers that already hold an engine
or a gateway (the test suite).

Importing it fails with ModuleNotFoundError when the `bench` extra is not installed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.util
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

# The `bench` extra's packages (pyproject.toml), checked without importing them.
EXTRA = ("aiohttp", "psutil", "tqdm", "matplotlib")
_missing = [name for name in EXTRA if importlib.util.find_spec(name) is None]
if _missing:
    raise ModuleNotFoundError(
        f"llm-gateway bench needs {', '.join(_missing)}: pip install 'llm-gateway[bench]'",
        name=_missing[0],
    )


# The scenarios, each `llm-gateway bench NAME`: the module holding its `SCENARIO`.
SCENARIOS = {
    "sweep": "sweep",
    "soak": "soak",
    "mixed": "mixed",
    "constrained": "constrained",
    "adapters": "adapters_bench",
    "replicas": "replica_bench",
    "cpu-settings": "cpu_settings",
    "vllm-bench-serve": "vllm_bench_serve",
    "embeddings": "embeddings",
    "models": "models_bench",
    "tracing": "tracing_bench",
    "speculation": "speculation",
    "quantized": "quantized_bench",
}


def main(argv: Sequence[str] | None = None) -> int:
    """`llm-gateway bench [NAME] [flags]`: the scenario NAME (the sweep when none is named)."""
    # Before anything imports vLLM: its INFO lines would break the progress bar.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from gateway_bench.options import Scenario

    args = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="llm-gateway bench",
        description="Benchmark the gateway, one scenario a subcommand (docs/BENCHMARKS.md); "
        "without one, the sweep.",
    )
    subcommands = parser.add_subparsers(dest="scenario", metavar="{" + ",".join(SCENARIOS) + "}")
    scenarios: dict[str, Scenario[Any]] = {}
    for name, module in SCENARIOS.items():
        scenario = importlib.import_module(f"gateway_bench.{module}").SCENARIO
        sub = subcommands.add_parser(name, help=scenario.summary, description=scenario.summary)
        scenario.fill(sub)
        scenarios[name] = scenario
    named = bool(args) and (args[0] in SCENARIOS or args[0] in ("-h", "--help"))
    given = vars(parser.parse_args(args if named else ["sweep", *args]))
    scenario = scenarios[given.pop("scenario")]
    options = scenario.options_of(given, parser)
    command = shlex.join(["llm-gateway", "bench", *args])
    run_loop: Callable[..., Any] = asyncio.run
    with contextlib.suppress(ImportError):  # uvloop where installed, as uvicorn picks it
        import uvloop

        run_loop = uvloop.run
    text, out, ok = run_loop(scenario.run(options, command))
    print(text)
    if out is not None:
        print(f"\nllm-gateway bench {scenario.name}: report written to {out}/", file=sys.stderr)
    return 0 if ok else 1
