"""`llm-gateway bench --scenario adapters`: what a LoRA adapter costs (issue 33).

Two gateways (each its own server and engine, started for the run): one with LoRA on, serving
an adapter (`--adapter`, a peft adapter directory; none given: the recipe's of
gateway_bench/adapter_recipe.py, made once), and one with LoRA off. The same chat request
(`/v1/chat/completions`, greedy, `ignore_eos`: every answer `output_tokens` long, not
streamed) in three variants: the base model on the LoRA-off gateway, the base model on the
LoRA-on gateway, and the adapter (its name as `model`) on the LoRA-on gateway. On a CPU,
vLLM runs a LoRA engine eager: the LoRA-on base pays for that whether or not its requests
use an adapter.

At each concurrency, `concurrency` clients send `rounds` requests back to back, each variant
in turn, `repeats` times; the report gives each variant's median tok/s, the adapter's median
ratio to the LoRA-on base and the LoRA-on base's to the LoRA-off base, each ratio taken
within its repeat. Goal (docs/BENCHMARKS.md): the adapter >= 0.7x the base at 32.
"""

from __future__ import annotations

import asyncio
import shlex
import statistics
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from gateway.config.settings import EngineSettings, served_model_name
from gateway_bench import machine, targets
from gateway_bench.constrained import Row, measure  # a Row's ratio: see _ratio_to
from gateway_bench.mixed import default_model
from gateway_bench.results import Machine, write_report
from gateway_bench.scenario_options import TargetOptions, parse_options
from gateway_bench.worker import pooled_connector

ADAPTER = "bench-adapter"  # the adapter's name on the LoRA-on gateway
PROMPT = "Write a long story about a lighthouse keeper and the sea."
BASE_OFF, BASE_ON, ADAPTED = "base, LoRA off", "base, LoRA on", "adapter"
VARIANTS = (BASE_OFF, BASE_ON, ADAPTED)
GOAL_AT, GOAL_RATIO = 32, 0.7


class AdaptersOptions(TargetOptions, kw_only=True):
    concurrency: list[int] = msgspec.field(default_factory=lambda: [1, 32])
    rounds: int = 1
    repeats: int = 3
    output_tokens: int = 64
    adapter: str = (
        ""  # a peft adapter directory; "": the recipe's (gateway_bench/adapter_recipe.py)
    )
    max_lora_rank: int = 16
    out: str = "docs/bench/adapters"


QUICK = {"concurrency": [1, 2], "rounds": 1, "repeats": 1, "output_tokens": 4}


class AdaptersReport(msgspec.Struct, kw_only=True):
    command: str
    machine: Machine
    options: AdaptersOptions
    adapter: str
    rows: list[Row]


def parse(argv: Sequence[str]) -> AdaptersOptions:
    return parse_options("adapters", AdaptersOptions, QUICK, argv)


def body(options: AdaptersOptions, model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": options.output_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


class Targets(msgspec.Struct):
    """The URL and model name each variant sends to."""

    lora_off: str
    lora_on: str
    base_model: str
    adapter: str = ADAPTER

    def of(self, variant: str) -> tuple[str, str]:
        if variant == BASE_OFF:
            return self.lora_off, self.base_model
        return self.lora_on, self.base_model if variant == BASE_ON else self.adapter


def _ratio_to(variant: str) -> str | None:
    return {ADAPTED: BASE_ON, BASE_ON: BASE_OFF}.get(variant)


async def measure_all(options: AdaptersOptions, at: Targets) -> list[Row]:
    timeout = aiohttp.ClientTimeout(total=None)
    connector = pooled_connector()
    rows: list[Row] = []
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        for variant in VARIANTS:  # warm: the adapter loaded, each engine's first step taken
            url, model = at.of(variant)
            await measure(session, url, body(options, model), 1, 1)
        for clients in options.concurrency:
            runs: dict[str, list[tuple[float, int, int]]] = {v: [] for v in VARIANTS}
            ratios: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for _ in range(options.repeats):
                for variant in VARIANTS:
                    url, model = at.of(variant)
                    run = await measure(session, url, body(options, model), clients, options.rounds)
                    print(
                        f"adapters: {clients} clients, {variant}: {run[0]} tok/s", file=sys.stderr
                    )
                    runs[variant].append(run)
                for variant in VARIANTS:
                    other = _ratio_to(variant)
                    if other is not None and runs[other][-1][0]:
                        ratios[variant].append(runs[variant][-1][0] / runs[other][-1][0])
            for variant in VARIANTS:
                measured = runs[variant]
                rows.append(
                    Row(
                        clients,
                        variant,
                        round(statistics.median(r[0] for r in measured), 1),
                        sum(r[1] for r in measured),
                        sum(r[2] for r in measured),
                        round(statistics.median(ratios[variant]), 3) if ratios[variant] else None,
                    )
                )
    return rows


@asynccontextmanager
async def started_gateways(
    options: AdaptersOptions, adapter: Path, out: Path
) -> AsyncIterator[Targets]:
    """The LoRA-off and the LoRA-on gateway, both running for the run."""
    model = options.model or await asyncio.to_thread(default_model)
    dtype = machine.cpu_defaults(options.dtype).dtype
    chosen = {"MODEL": model, "DTYPE": dtype, "ENFORCE_EAGER": options.enforce_eager}
    settings = msgspec.convert({**chosen, "SEED": options.seed}, EngineSettings)
    served = served_model_name(settings)
    lora = {"ADAPTERS": f"{ADAPTER}={adapter}", "MAX_LORA_RANK": str(options.max_lora_rank)}
    urls: list[str] = []
    async with AsyncExitStack() as stack:
        for name, extra in (("lora-off", {}), ("lora-on", lora)):
            port = targets.free_port()
            env = targets.gateway_environment(settings) | extra
            print(f"adapters: starting the {name} gateway on port {port}", file=sys.stderr)
            endpoint = await stack.enter_async_context(
                targets.server(
                    targets.gateway_command(port),
                    env,
                    port,
                    out / f"gateway-{name}.log",
                    options.start_timeout,
                    served,
                )
            )
            urls.append(endpoint.url)
        yield Targets(urls[0], urls[1], served)


def adapter_of(options: AdaptersOptions) -> Path:
    if options.adapter:
        return Path(options.adapter)
    from gateway.engine.default_model import prepare_default_model
    from gateway_bench.adapter_recipe import cached_adapter

    model = Path(options.model) if options.model else prepare_default_model()
    return cached_adapter(model)


async def run_adapters(
    options: AdaptersOptions, command: str, at: Targets | None = None
) -> tuple[AdaptersReport, Path]:
    """Every variant at every concurrency; `at` given: those servers (else two started)."""
    out = Path(options.out)
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    targets.raise_file_limit(4 * max(options.concurrency) + 256)
    host = await asyncio.to_thread(machine.describe, options.dtype)
    adapter = await asyncio.to_thread(adapter_of, options)
    if at is not None:
        rows = await measure_all(options, at)
    else:
        async with started_gateways(options, adapter, out) as started:
            rows = await measure_all(options, started)
    host.load_end = machine.load()
    report = AdaptersReport(
        command=command, machine=host, options=options, adapter=str(adapter), rows=rows
    )
    await asyncio.to_thread(write_report, report, markdown(report), out)
    return report, out


def markdown(report: AdaptersReport) -> str:
    lines = [
        "# LoRA adapters: tok/s of the adapter, and of the base with LoRA on and off",
        "",
        f"`{report.command}`",
        "",
        report.machine.summary,
        "",
        "| concurrency | variant | tok/s | ratio | tokens | failed |",
        "|---|---|---|---|---|---|",
    ]
    for row in report.rows:
        to = _ratio_to(row.variant)
        ratio = "" if row.ratio is None or to is None else f"{row.ratio:.2f}x {to}"
        lines.append(
            f"| {row.concurrency} | {row.variant} | {row.tok_s} | {ratio} | {row.tokens} "
            f"| {row.failed} |"
        )
    goal = [r for r in report.rows if r.concurrency == GOAL_AT and r.variant == ADAPTED]
    if goal:
        met = all(r.ratio is not None and r.ratio >= GOAL_RATIO for r in goal)
        verdict = "met" if met else "not met"
        lines += ["", f"Goal: the adapter >= {GOAL_RATIO}x the base at {GOAL_AT}: {verdict}."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    options = parse(argv)
    command = shlex.join(["llm-gateway", "bench", *argv])
    report, out = asyncio.run(run_adapters(options, command))
    print(markdown(report))
    print(f"\nllm-gateway bench: adapters report written to {out}/", file=sys.stderr)
    return 0 if all(r.failed == 0 for r in report.rows) else 1
