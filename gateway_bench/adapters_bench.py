"""`llm-gateway bench adapters`: what a LoRA adapter costs (issue 33; docs/BENCHMARKS.md, "LoRA
adapters")."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec

from gateway_bench import machine, targets
from gateway_bench.constrained import Row, VariantOptions, measure_variants, variants_markdown
from gateway_bench.options import Scenario
from gateway_bench.results import Machine, write_report

ADAPTER = "bench-adapter"  # the adapter's name on the LoRA-on gateway
PROMPT = "Write a long story about a lighthouse keeper and the sea."
BASE_OFF, BASE_ON, ADAPTED = "base, LoRA off", "base, LoRA on", "adapter"
VARIANTS = (BASE_OFF, BASE_ON, ADAPTED)
GOAL_AT, GOAL_RATIO = 32, 0.7


class AdaptersOptions(VariantOptions, frozen=True, kw_only=True):
    adapter: str = ""  # a peft adapter directory; "": the recipe's (adapter_recipe.py)
    max_lora_rank: int = 16
    out: str = "docs/bench/adapters"


QUICK = AdaptersOptions(concurrency=[1, 2], rounds=1, repeats=1, output_tokens=4, quick=True)


class AdaptersReport(msgspec.Struct, kw_only=True):
    command: str
    machine: Machine
    options: AdaptersOptions
    adapter: str
    rows: list[Row]


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
    def request(variant: str) -> tuple[str, dict[str, Any]]:
        url, model = at.of(variant)
        return url, body(options, model)

    return await measure_variants(options, VARIANTS, request, _ratio_to)


@asynccontextmanager
async def started_gateways(
    options: AdaptersOptions, adapter: Path, out: Path
) -> AsyncIterator[Targets]:
    """The LoRA-off and the LoRA-on gateway, both running for the run."""
    lora = {"ADAPTERS": f"{ADAPTER}={adapter}", "MAX_LORA_RANK": str(options.max_lora_rank)}
    async with AsyncExitStack() as stack:
        urls, served = [], ""
        for name, extra in (("lora-off", {}), ("lora-on", lora)):
            started = targets.started_gateway(options, out, f"gateway-{name}", extra)
            endpoint = await stack.enter_async_context(started)
            urls.append(endpoint.url)
            served = endpoint.model
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
    goal = [r for r in report.rows if r.concurrency == GOAL_AT and r.variant == ADAPTED]
    met = all(r.ratio is not None and r.ratio >= GOAL_RATIO for r in goal)
    verdict = f"Goal: the adapter >= {GOAL_RATIO}x the base at {GOAL_AT}: "
    return variants_markdown(
        "LoRA adapters: tok/s of the adapter, and of the base with LoRA on and off",
        report.command,
        report.machine,
        report.rows,
        "ratio",
        lambda variant: f" {_ratio_to(variant)}",
        verdict + ("met." if met else "not met.") if goal else "",
    )


async def _run(options: AdaptersOptions, command: str) -> tuple[str, Path, bool]:
    report, out = await run_adapters(options, command)
    return markdown(report), out, all(r.failed == 0 for r in report.rows)


SCENARIO = Scenario(
    "adapters",
    "What a LoRA adapter costs (issue 33): its tok/s against the base model's, and the base "
    "model's with LoRA on against off.",
    AdaptersOptions,
    QUICK,
    _run,
)


def parse(argv: Sequence[str]) -> AdaptersOptions:
    return SCENARIO.parse(argv)
