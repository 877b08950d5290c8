"""`llm-gateway bench adapters`: what a LoRA adapter costs (issue 33; docs/BENCHMARKS.md, "LoRA
adapters"): the adapter's tok/s against the base model's, and the base model's with LoRA on
against off (variants.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec

from gateway_bench import machine, targets
from gateway_bench.machine import Machine
from gateway_bench.options import Scenario, begin
from gateway_bench.report import Report, write
from gateway_bench.variants import (
    Row,
    VariantOptions,
    measure_variants,
    ratio_goal,
    variants_report,
)
from gateway_bench.worker import Context, session

ADAPTER = "bench-adapter"  # the adapter's name on the LoRA-on gateway
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


class Targets(msgspec.Struct):
    """The URL and model name each variant sends to (and the servers' pids, when started)."""

    lora_off: str
    lora_on: str
    base_model: str
    adapter: str = ADAPTER
    pids: tuple[int | None, int | None] = (None, None)

    def endpoint(self, variant: str) -> targets.Endpoint:
        if variant == BASE_OFF:
            return targets.Endpoint(self.lora_off, self.pids[0])
        return targets.Endpoint(self.lora_on, self.pids[1])

    def model(self, variant: str) -> str:
        return self.adapter if variant == ADAPTED else self.base_model


def _ratio_to(variant: str) -> str | None:
    return {ADAPTED: BASE_ON, BASE_ON: BASE_OFF}.get(variant)


async def measure_all(options: AdaptersOptions, at: Targets, out: Path) -> list[Row]:
    async with session() as client_session:
        profiles = options.profiles(out)
        contexts = {
            v: at.endpoint(v).context(client_session, profiles, at.model(v)) for v in VARIANTS
        }

        def target(variant: str) -> tuple[Context, dict[str, Any]]:
            return contexts[variant], {"ignore_eos": True}

        return await measure_variants(options, VARIANTS, target, _ratio_to)


@asynccontextmanager
async def started_gateways(
    options: AdaptersOptions, adapter: Path, out: Path
) -> AsyncIterator[Targets]:
    """The LoRA-off and the LoRA-on gateway, both running for the run."""
    lora = {"ADAPTERS": f"{ADAPTER}={adapter}", "MAX_LORA_RANK": str(options.max_lora_rank)}
    async with AsyncExitStack() as stack:
        off, on = [
            await stack.enter_async_context(
                targets.started_gateway(options, out, f"gateway-{name}", extra)
            )
            for name, extra in (("lora-off", {}), ("lora-on", lora))
        ]
        yield Targets(off.url, on.url, on.model, pids=(off.pid, on.pid))


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
    out, host = await begin(options, 4 * max(options.concurrency) + 256)
    adapter = await asyncio.to_thread(adapter_of, options)
    if at is not None:
        rows = await measure_all(options, at, out)
    else:
        async with started_gateways(options, adapter, out) as started:
            rows = await measure_all(options, started, out)
    host.load_end = machine.load()
    result = AdaptersReport(
        command=command, machine=host, options=options, adapter=str(adapter), rows=rows
    )
    await asyncio.to_thread(write, result, report(result), out)
    return result, out


def report(result: AdaptersReport) -> Report:
    return variants_report(
        "LoRA adapters: tok/s of the adapter, and of the base with LoRA on and off",
        result.command,
        result.machine,
        result.rows,
        "ratio",
        [
            ratio_goal(
                f"the adapter >= {GOAL_RATIO}x the base at {GOAL_AT}",
                [r for r in result.rows if r.variant == ADAPTED],
                GOAL_AT,
                GOAL_RATIO,
            )
        ],
        lambda variant: f" {_ratio_to(variant)}",
    )


async def _run(options: AdaptersOptions, command: str) -> tuple[str, Path, bool]:
    result, out = await run_adapters(options, command)
    return report(result).markdown(), out, all(r.failed == 0 for r in result.rows)


SCENARIO = Scenario(
    "adapters",
    "What a LoRA adapter costs (issue 33): its tok/s against the base model's, and the base "
    "model's with LoRA on against off.",
    AdaptersOptions,
    QUICK,
    _run,
)
