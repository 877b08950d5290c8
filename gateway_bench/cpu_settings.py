"""`llm-gateway bench cpu-settings`: vLLM's CPU engine settings, measured side by side.

Each variant (dtype, OpenMP thread binding, allocator and OpenMP runtime preloaded or not,
step budget, KV block size, the model's worker in the engine core's process, eager or
compiled) runs in a fresh process that builds an in-process `AsyncLLM` (the default model,
eager unless the variant says `compiled`) and sends 64-token greedy requests with
`ignore_eos` at each concurrency. Variants run in turn, `--repeats` times in interleaved
order, so slow drift on a shared machine spreads over all. The figures decide the gateway's
CPU defaults (gateway/engine/cpu_defaults.py, docs/BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import msgspec

from gateway_bench import machine
from gateway_bench.children import every_variant, result_line
from gateway_bench.cpu import CpuMeter
from gateway_bench.options import Options, Positive, Scenario
from gateway_bench.report import Report, Section, Table, cell

TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
IOMP = str(Path(sys.prefix) / "lib" / "libiomp5.so")
BOTH_CORES = {
    "VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 1) - 1}",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
}
VARIANTS: dict[str, dict[str, str]] = {
    "bf16 default-bind": {"DTYPE": "bfloat16"},
    "bf16 both-cores": {"DTYPE": "bfloat16", **BOTH_CORES},
    "fp32 default-bind": {"DTYPE": "float32"},
    "fp32 both-cores": {"DTYPE": "float32", **BOTH_CORES},
    "bf16 default-bind tcmalloc": {"DTYPE": "bfloat16", "LD_PRELOAD": TCMALLOC},
    "bf16 default-bind iomp": {"DTYPE": "bfloat16", "LD_PRELOAD": IOMP},
    "bf16 both-cores tcmalloc+iomp": {
        "DTYPE": "bfloat16",
        "LD_PRELOAD": f"{TCMALLOC}:{IOMP}",
        **BOTH_CORES,
    },
    # the tokens one step computes (vLLM's CPU default 2,048; issue 30: a bound on every step)
    "bf16 both-cores step1024": {
        "DTYPE": "bfloat16",
        "MAX_NUM_BATCHED_TOKENS": "1024",
        **BOTH_CORES,
    },
    "bf16 both-cores step512": {"DTYPE": "bfloat16", "MAX_NUM_BATCHED_TOKENS": "512", **BOTH_CORES},
    "bf16 both-cores step256": {"DTYPE": "bfloat16", "MAX_NUM_BATCHED_TOKENS": "256", **BOTH_CORES},
    # the tokens a KV-cache block holds (vLLM's CPU default 128; the prefix cache's unit)
    **{
        f"bf16 both-cores step512 block{size}": {
            "DTYPE": "bfloat16",
            "MAX_NUM_BATCHED_TOKENS": "512",
            "KV_BLOCK_SIZE": str(size),
            **BOTH_CORES,
        }
        for size in (128, 64, 32)
    },
    # issue 60: the model's worker inside the engine core's process (vLLM's single-process
    # executor), where the two spin on a shared-memory queue handing each step over; beside
    # the gateway's defaults (both cores, step 512, block 32)
    "bf16 both-cores step512 block32 worker-in-core": {
        "DTYPE": "bfloat16",
        "MAX_NUM_BATCHED_TOKENS": "512",
        "KV_BLOCK_SIZE": "32",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        **BOTH_CORES,
    },
    "bf16 default-bind step512 block32 worker-in-core": {
        "DTYPE": "bfloat16",
        "MAX_NUM_BATCHED_TOKENS": "512",
        "KV_BLOCK_SIZE": "32",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    },
}
# torch.compile (`make run`'s default) instead of eager, with and without the worker in the
# engine core
for _eager in ("bf16 both-cores step512 block32", "bf16 both-cores step512 block32 worker-in-core"):
    VARIANTS[f"{_eager} compiled"] = {**VARIANTS[_eager], "ENFORCE_EAGER": "false"}


class CpuSettingsOptions(Options, frozen=True, kw_only=True):
    repeats: Positive = 2
    rounds: Positive = 2  # batches per concurrency
    tokens: Positive = 64
    concurrency: list[Positive] = msgspec.field(default_factory=lambda: [1, 8, 32, 64])
    prompt_tokens: int = 0  # pad prompts to ~N tokens
    variants: list[str] = msgspec.field(default_factory=lambda: list(VARIANTS))
    child: bool = False  # one variant's measurement, in the process the parent started


QUICK = CpuSettingsOptions(
    repeats=1, rounds=1, tokens=8, concurrency=[1, 2], variants=list(VARIANTS)[:2], quick=True
)


async def _measure(
    concurrency: list[int], tokens: int, rounds: int, prompt_tokens: int
) -> dict[str, object]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from gateway.config.settings import EngineSettings
    from gateway.engine.default_model import prepare_default_model
    from gateway_bench.ceiling import start_llm

    variant: dict[str, object] = {
        "ENFORCE_EAGER": os.environ["ENFORCE_EAGER"] == "true",
        "DTYPE": os.environ["DTYPE"],
        "KV_CACHE_GIB": 2.0,
        "MAX_NUM_BATCHED_TOKENS": int(os.environ.get("MAX_NUM_BATCHED_TOKENS", "0")),
        "KV_BLOCK_SIZE": int(os.environ.get("KV_BLOCK_SIZE", "0")),
    }
    settings = msgspec.convert(variant, EngineSettings)
    started = time.perf_counter()
    llm = await start_llm(settings, str(prepare_default_model()), {})
    start_s = time.perf_counter() - started
    params = SamplingParams(
        max_tokens=tokens, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )
    serial = iter(range(1_000_000))

    async def one() -> tuple[float, int]:
        rid = next(serial)
        prompt = f"Request {rid}: write a long story about the number {rid} and its friends."
        prompt += " and then" * max(0, (prompt_tokens - 17) // 2)  # 2 tokens a repeat
        begin = time.perf_counter()
        first = None
        count = 0
        async for out in llm.generate(prompt, params, f"r{rid}"):
            if first is None:
                first = time.perf_counter() - begin
            count += len(out.outputs[0].token_ids)
        return first or 0.0, count

    await asyncio.gather(*(one() for _ in range(8)))  # warm-up
    figures: dict[str, object] = {"start_s": round(start_s, 1)}
    for c in concurrency:
        rates: list[float] = []
        ttfts: list[float] = []
        meter, tokens = CpuMeter(()), 0  # this process: the frontend, its engine core left out
        for _ in range(rounds):
            begin = time.perf_counter()
            done = await asyncio.gather(*(one() for _ in range(c)))
            rates.append(sum(n for _, n in done) / (time.perf_counter() - begin))
            ttfts.extend(t for t, _ in done)
            tokens += sum(n for _, n in done)
        figures[f"c{c}"] = {
            "tok_s": round(statistics.mean(rates), 1),
            "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1),
            "frontend_cpu_ms_per_token": (await meter.stop()).per_token_ms(tokens),
        }
    llm.shutdown()
    return figures


async def _run(options: CpuSettingsOptions, command: str) -> tuple[str, Path | None, bool]:
    levels = options.concurrency
    if options.child:
        figures = await _measure(levels, options.tokens, options.rounds, options.prompt_tokens)
        return result_line(figures), None, True
    return await asyncio.to_thread(_variants, options, command), None, True


def _variants(options: CpuSettingsOptions, command: str) -> str:
    """Every variant `repeats` times, each in a child process of its own; the table."""
    levels = options.concurrency
    # eager unless the variant says otherwise, whatever this shell's ENFORCE_EAGER
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING", "ENFORCE_EAGER": "true"}
    child = ["cpu-settings", "--child", "--tokens", str(options.tokens)]
    child += ["--rounds", str(options.rounds), "--concurrency", ",".join(map(str, levels))]
    child += ["--prompt-tokens", str(options.prompt_tokens)]
    results = every_variant(
        options.variants, options.repeats, lambda _: child, lambda name: {**env, **VARIANTS[name]}
    )
    top = levels[-1]
    columns = [f"c={c} tok/s" for c in levels]
    table = Table(["variant", *columns, f"TTFT p50 c={top}", f"frontend CPU ms/token c={top}"])
    for name, runs in results.items():
        if not runs:
            continue
        cells = [f"{statistics.mean(r[f'c{c}']['tok_s'] for r in runs):.1f}" for c in levels]
        ttft = statistics.mean(r[f"c{top}"]["ttft_p50_ms"] for r in runs)
        cpu = [r[f"c{top}"].get("frontend_cpu_ms_per_token") for r in runs]
        shown = cell(statistics.mean(cpu), 3) if None not in cpu else "-"
        table.rows.append([name, *cells, f"{ttft:.0f} ms", shown])
    host = machine.describe(options.dtype)
    return Report(
        "llm-gateway bench cpu-settings", command, host, [Section(table=table)]
    ).markdown()


def _check(options: CpuSettingsOptions) -> str | None:
    return "--profile: each variant's engine is in-process, no server" if options.profile else None


SCENARIO = Scenario(
    "cpu-settings",
    "vLLM's CPU engine settings (dtype, thread binding, allocator, step budget, KV block "
    "size), each variant in a fresh in-process engine, side by side.",
    CpuSettingsOptions,
    QUICK,
    _run,
    check=_check,
)
