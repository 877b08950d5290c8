"""`python -m gateway_bench.cpu_settings`: vLLM's CPU engine settings, measured side by side.

Each variant (dtype, OpenMP thread binding, allocator and OpenMP runtime preloaded or not)
runs in a fresh process that builds an in-process `AsyncLLM` (eager, the default model) and
sends 64-token greedy requests with `ignore_eos` at each concurrency. Variants run in turn,
`--repeats` times in interleaved order, so slow drift on a shared machine spreads over all.
The figures decide the gateway's CPU defaults (gateway/engine/cpu_defaults.py, docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import msgspec

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
}


async def _measure(
    concurrency: list[int], tokens: int, rounds: int, prompt_tokens: int
) -> dict[str, object]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    from gateway.config.settings import EngineSettings
    from gateway.engine.default_model import prepare_default_model
    from gateway.engine.engine_args import engine_args

    variant: dict[str, object] = {
        "ENFORCE_EAGER": True,
        "DTYPE": os.environ["DTYPE"],
        "KV_CACHE_GIB": 2.0,
        "MAX_NUM_BATCHED_TOKENS": int(os.environ.get("MAX_NUM_BATCHED_TOKENS", "0")),
    }
    settings = msgspec.convert(variant, EngineSettings)
    started = time.perf_counter()
    llm = AsyncLLM.from_engine_args(engine_args(settings, str(prepare_default_model())))
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
        for _ in range(rounds):
            begin = time.perf_counter()
            done = await asyncio.gather(*(one() for _ in range(c)))
            rates.append(sum(n for _, n in done) / (time.perf_counter() - begin))
            ttfts.extend(t for t, _ in done)
        figures[f"c{c}"] = {
            "tok_s": round(statistics.mean(rates), 1),
            "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1),
        }
    llm.shutdown()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway_bench.cpu_settings")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="batches per concurrency")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--prompt-tokens", type=int, default=0, help="pad prompts to ~N tokens")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    if args.child:
        print(
            "RESULT "
            + json.dumps(
                asyncio.run(_measure(levels, args.tokens, args.rounds, args.prompt_tokens))
            )
        )
        return 0
    names = [n for n in args.variants.split(",") if n]
    results: dict[str, list[dict[str, object]]] = {n: [] for n in names}
    for repeat in range(args.repeats):
        order = names if repeat % 2 == 0 else list(reversed(names))
        for name in order:
            env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING", **VARIANTS[name]}
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "gateway_bench.cpu_settings",
                    "--child",
                    "--tokens",
                    str(args.tokens),
                    "--rounds",
                    str(args.rounds),
                    "--concurrency",
                    args.concurrency,
                    "--prompt-tokens",
                    str(args.prompt_tokens),
                ],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(f"{name}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            figures = json.loads(line.removeprefix("RESULT "))
            results[name].append(figures)
            print(f"{name} (repeat {repeat + 1}): {json.dumps(figures)}", flush=True)
    top = levels[-1]
    print("\n| variant | " + " | ".join(f"c={c} tok/s" for c in levels) + f" | TTFT p50 c={top} |")
    print("|---|" + "---|" * (len(levels) + 1))
    for name, runs in results.items():
        if not runs:
            continue
        cells = [f"{statistics.mean(r[f'c{c}']['tok_s'] for r in runs):.1f}" for c in levels]  # type: ignore[index]
        ttft = statistics.mean(r[f"c{top}"]["ttft_p50_ms"] for r in runs)  # type: ignore[index]
        print(f"| {name} | " + " | ".join(cells) + f" | {ttft:.0f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
